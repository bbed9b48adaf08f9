// JobThreads: threads that run jobs posted to them, in the order posted, for
// work nobody waits for (read-ahead): the poster goes on at once.
//
// The threads are started by the constructor and never stopped, and a
// JobThreads is meant to live as long as the process (made once, never
// destroyed): a job may still run while the process exits, so a job holds
// (shared_ptr) whatever it uses, never a reference to something its poster
// may destroy. Thread-safe.
#ifndef GPUCKPT_CORE_BASE_JOB_THREADS_H_
#define GPUCKPT_CORE_BASE_JOB_THREADS_H_

#include <cstddef>
#include <functional>
#include <memory>

namespace gpuckpt {

class JobThreads {
 public:
  // `count` threads (at least 1); at most `max_pending` jobs wait (0: no
  // bound).
  explicit JobThreads(size_t count, size_t max_pending = 0);
  JobThreads(const JobThreads&) = delete;
  JobThreads& operator=(const JobThreads&) = delete;

  // Queues `job` for the next free thread; false (and `job` dropped) when
  // max_pending jobs wait already.
  bool Post(std::function<void()> job);

 private:
  struct Queue;
  std::shared_ptr<Queue> queue_;  // shared with the threads
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_JOB_THREADS_H_
