// WorkQueue: a fixed set of worker threads running submitted tasks, with a
// bound on the bytes that submitted-but-unfinished tasks hold, so a
// producer that reads faster than the workers can hash, compress or write
// blocks instead of filling memory.
//
// Tasks return a Status; the first error is kept, later tasks are dropped
// unrun, and Submit() returns it so the producer stops early.
//
// Workers may run in the background (SetPriority): on CPU time nothing else
// wants, so that a producer that must not be slowed, CRIU copying a frozen
// process's memory, keeps the cores while its bytes wait in memory.
//
// Submit() may be called by several producer threads at once; Finish() by
// one, once no Submit() runs; SetPriority() from any thread. Tasks run on the
// workers and receive the index of the worker running them (0..threads-1)
// for per-worker state. The destructor calls Finish().
#ifndef GPUCKPT_CORE_BASE_WORK_QUEUE_H_
#define GPUCKPT_CORE_BASE_WORK_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/base/mutex.h"
#include "gpuckpt/byte_budget.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

class WorkQueue {
 public:
  using Task = std::function<Status(unsigned worker)>;

  // `threads` 0 means one per online CPU. With `shared`, the bytes of
  // queued tasks are also drawn from that budget (e.g. the staging memory
  // all checkpoints of a daemon share), and given back as tasks end.
  WorkQueue(unsigned threads, uint64_t max_bytes_in_flight,
            std::shared_ptr<ByteBudget> shared = nullptr);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`, accounted as `bytes` until it has run. Blocks while the
  // bound (or the shared budget) would be exceeded (a single task larger
  // than the bound still runs, alone). Returns the first error of any task
  // so far.
  Status Submit(uint64_t bytes, Task task) EXCLUDES(mu_);

  // Waits for every queued task, stops the workers, returns the first error.
  Status Finish() EXCLUDES(mu_);

  // kBackground: workers run their next tasks under SCHED_IDLE, only when a
  // core is otherwise idle. The queue returns to kNormal by itself as soon
  // as a Submit() has to wait for room: the producer is then waiting for
  // the workers, and starving them would only stall it. Where this process
  // could not return a thread from SCHED_IDLE (no CAP_SYS_NICE and an
  // RLIMIT_NICE below 20), kBackground is ignored. Default: kNormal.
  enum class Priority { kNormal, kBackground };
  void SetPriority(Priority priority) EXCLUDES(mu_);
  Priority priority() const EXCLUDES(mu_);

  unsigned threads() const { return static_cast<unsigned>(workers_.size()); }

 private:
  void Run(unsigned worker) EXCLUDES(mu_);
  // Applies priority_ to the calling worker if it runs under another one.
  void ApplyPriority(Priority* applied) EXCLUDES(mu_);

  struct Item {
    uint64_t bytes;
    Task task;
  };
  const uint64_t max_bytes_;
  const std::shared_ptr<ByteBudget> shared_;
  mutable Mutex mu_;
  CondVar work_ready_;
  CondVar space_ready_;
  std::deque<Item> queue_ GUARDED_BY(mu_);
  uint64_t bytes_in_flight_ GUARDED_BY(mu_) = 0;
  unsigned busy_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  Priority priority_ GUARDED_BY(mu_) = Priority::kNormal;
  Status first_error_ GUARDED_BY(mu_);
  // Written by the constructor alone, before any other thread runs.
  std::vector<std::thread> workers_;
};

// Worker threads to use for `requested` (0 = one per online CPU).
unsigned ResolveThreadCount(unsigned requested);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_WORK_QUEUE_H_
