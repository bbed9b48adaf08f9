// ByteBudget: a number of bytes that several users draw from and give back,
// such as the staging memory that all checkpoints of one daemon share.
//
// Thread-safe; users block in Acquire() until enough is given back. Shared
// by its users through shared_ptr: it must outlive every Acquire().
#ifndef GPUCKPT_BYTE_BUDGET_H_
#define GPUCKPT_BYTE_BUDGET_H_

#include <cstdint>

#include "core/base/mutex.h"

namespace gpuckpt {

class ByteBudget {
 public:
  explicit ByteBudget(uint64_t capacity) : capacity_(capacity) {}
  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  uint64_t capacity() const { return capacity_; }

  // Whether `bytes` can be taken now; takes them if so. A request larger
  // than the whole budget is granted when nothing else is taken, so that
  // it can never wait forever.
  bool TryAcquire(uint64_t bytes) EXCLUDES(mu_);

  // Takes `bytes`, waiting until they are free (see TryAcquire). The caller
  // must not wait while holding what others need to give bytes back.
  void Acquire(uint64_t bytes) EXCLUDES(mu_);

  void Release(uint64_t bytes) EXCLUDES(mu_);

  // Bytes taken now.
  uint64_t used() const EXCLUDES(mu_);

 private:
  bool Fits(uint64_t bytes) const REQUIRES(mu_) { return used_ == 0 || used_ + bytes <= capacity_; }

  const uint64_t capacity_;
  mutable Mutex mu_;
  CondVar released_;
  uint64_t used_ GUARDED_BY(mu_) = 0;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_BYTE_BUDGET_H_
