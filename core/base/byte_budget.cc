#include "gpuckpt/byte_budget.h"

namespace gpuckpt {

bool ByteBudget::TryAcquire(uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (!Fits(bytes)) return false;
  used_ += bytes;
  return true;
}

void ByteBudget::Acquire(uint64_t bytes) {
  std::unique_lock lock(mu_);
  released_.wait(lock, [&] { return Fits(bytes); });
  used_ += bytes;
}

void ByteBudget::Release(uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    used_ -= bytes < used_ ? bytes : used_;
  }
  released_.notify_all();
}

uint64_t ByteBudget::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

}  // namespace gpuckpt
