#include "core/base/work_queue.h"

#include <exception>

namespace gpuckpt {

unsigned ResolveThreadCount(unsigned requested) {
  if (requested != 0) return requested;
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

WorkQueue::WorkQueue(unsigned threads, uint64_t max_bytes_in_flight)
    : max_bytes_(max_bytes_in_flight) {
  threads = ResolveThreadCount(threads);
  workers_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this, i] { Run(i); });
}

WorkQueue::~WorkQueue() { Finish().PermitUnchecked(); }

Status WorkQueue::Submit(uint64_t bytes, Task task) {
  std::unique_lock lock(mu_);
  space_ready_.wait(lock, [&] {
    return !first_error_.ok() || bytes_in_flight_ == 0 || bytes_in_flight_ + bytes <= max_bytes_;
  });
  if (!first_error_.ok()) return first_error_;
  if (stopping_) return Status::Internal("task submitted to a finished WorkQueue");
  bytes_in_flight_ += bytes;
  queue_.push_back(Item{bytes, std::move(task)});
  lock.unlock();
  work_ready_.notify_one();
  return Status::Ok();
}

Status WorkQueue::Finish() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  std::lock_guard lock(mu_);
  return first_error_;
}

void WorkQueue::Run(unsigned worker) {
  std::unique_lock lock(mu_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Item item = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !first_error_.ok();
    ++busy_;
    lock.unlock();
    Status s;
    if (!skip) {
      // No exception may cross a thread boundary; turn it into a Status.
      try {
        s = item.task(worker);
      } catch (const std::exception& e) {
        s = Status::Internal(std::string("unexpected exception: ") + e.what());
      }
    }
    item.task = nullptr;  // free captured buffers before taking the lock
    lock.lock();
    --busy_;
    bytes_in_flight_ -= item.bytes;
    if (!s.ok() && first_error_.ok()) first_error_ = s;
    space_ready_.notify_all();
  }
}

}  // namespace gpuckpt
