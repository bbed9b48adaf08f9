// TaskPool: helper threads that share the work of one call with the thread
// that makes it. RunAll(n, fn) runs fn(0) .. fn(n-1), taken one index at a
// time by the caller and by whichever helpers are free, and returns once all
// have run. The caller always takes part, so a call never waits for a busy
// pool: with every helper taken by other calls it runs its indices alone, as
// a plain loop would.
//
// For work that one request holds up, such as decoding the chunks of one
// large read that its reader waits for whole; not for background work
// (WorkQueue bounds that by bytes and priority).
//
// Thread-safe: any number of threads may call RunAll() at once; their calls
// share the helpers. fn must be safe to call from several threads at once
// with different indices. The destructor waits for the helpers to stop; no
// RunAll() may be running then.
#ifndef GPUCKPT_CORE_BASE_TASK_POOL_H_
#define GPUCKPT_CORE_BASE_TASK_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/base/mutex.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

class TaskPool {
 public:
  // Starts `helpers` threads (0: none; RunAll() then is a loop on the
  // caller).
  explicit TaskPool(unsigned helpers);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Runs fn(i) for every i in [0, n). Once one fails, indices not yet
  // begun are skipped; returns the error of the lowest failed index, or Ok.
  Status RunAll(size_t n, const std::function<Status(size_t)>& fn) EXCLUDES(mu_);

  unsigned helpers() const { return static_cast<unsigned>(threads_.size()); }

 private:
  struct Batch;
  void Help() EXCLUDES(mu_);
  // Runs indices of `batch` until none is left to take.
  static void Work(Batch& batch);

  Mutex mu_;
  CondVar work_ready_;
  // Calls with indices left to take, oldest first.
  std::deque<std::shared_ptr<Batch>> batches_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  // Written by the constructor alone, before any other thread runs.
  std::vector<std::thread> threads_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_TASK_POOL_H_
