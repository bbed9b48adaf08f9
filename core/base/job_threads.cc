#include "core/base/job_threads.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>

#include "core/base/mutex.h"

namespace gpuckpt {

struct JobThreads::Queue {
  explicit Queue(size_t max_pending) : max_pending(max_pending) {}

  const size_t max_pending;
  Mutex mu;
  CondVar cv;
  std::deque<std::function<void()>> jobs GUARDED_BY(mu);

  void Run() EXCLUDES(mu) {
    for (;;) {
      std::function<void()> job;
      {
        MutexLock lock(&mu);
        while (jobs.empty()) cv.Wait(mu);
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      job();
    }
  }
};

JobThreads::JobThreads(size_t count, size_t max_pending)
    : queue_(std::make_shared<Queue>(max_pending)) {
  for (size_t i = 0; i < std::max<size_t>(count, 1); ++i)
    std::thread([queue = queue_] { queue->Run(); }).detach();
}

bool JobThreads::Post(std::function<void()> job) {
  MutexLock lock(&queue_->mu);
  if (queue_->max_pending != 0 && queue_->jobs.size() >= queue_->max_pending) return false;
  queue_->jobs.push_back(std::move(job));
  queue_->cv.NotifyOne();
  return true;
}

}  // namespace gpuckpt
