#include "core/base/work_queue.h"

#include <sched.h>
#include <sys/resource.h>

#include <exception>
#include <fstream>
#include <string>

namespace gpuckpt {
namespace {

// Whether a thread of this process may go back from SCHED_IDLE to
// SCHED_OTHER at nice 0: with CAP_SYS_NICE, or an RLIMIT_NICE of 20.
bool CanLeaveIdlePriority() {
  static const bool can = [] {
    rlimit limit{};
    if (getrlimit(RLIMIT_NICE, &limit) == 0 && limit.rlim_cur >= 20) return true;
    std::ifstream status("/proc/self/status");
    std::string line;
    constexpr int kCapSysNice = 23;
    while (std::getline(status, line)) {
      if (line.rfind("CapEff:", 0) != 0) continue;
      const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
      return ((caps >> kCapSysNice) & 1) != 0;
    }
    return false;
  }();
  return can;
}

}  // namespace

unsigned ResolveThreadCount(unsigned requested) {
  if (requested != 0) return requested;
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

WorkQueue::WorkQueue(unsigned threads, uint64_t max_bytes_in_flight,
                     std::shared_ptr<ByteBudget> shared)
    : max_bytes_(max_bytes_in_flight), shared_(std::move(shared)) {
  threads = ResolveThreadCount(threads);
  workers_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this, i] { Run(i); });
}

WorkQueue::~WorkQueue() { Finish().PermitUnchecked(); }

Status WorkQueue::Submit(uint64_t bytes, Task task) {
  MutexLock lock(&mu_);
  auto has_room = [&]() REQUIRES(mu_) {
    return !first_error_.ok() || bytes_in_flight_ == 0 || bytes_in_flight_ + bytes <= max_bytes_;
  };
  if (!has_room()) {
    // The producer now waits for the workers: they must not wait for idle
    // cores.
    priority_ = Priority::kNormal;
    while (!has_room()) space_ready_.Wait(mu_);
  }
  if (!first_error_.ok()) return first_error_;
  if (stopping_) return Status::Internal("task submitted to a finished WorkQueue");
  bytes_in_flight_ += bytes;
  if (shared_ && !shared_->TryAcquire(bytes)) {
    // Other queues hold the shared budget: wait for them, not holding mu_
    // (this queue's workers take it to finish their tasks).
    priority_ = Priority::kNormal;
    lock.Unlock();
    shared_->Acquire(bytes);
    lock.Lock();
  }
  queue_.push_back(Item{bytes, std::move(task)});
  lock.Unlock();
  work_ready_.NotifyOne();
  return Status::Ok();
}

Status WorkQueue::Finish() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_ready_.NotifyAll();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  MutexLock lock(&mu_);
  return first_error_;
}

void WorkQueue::SetPriority(Priority priority) {
  if (priority == Priority::kBackground && !CanLeaveIdlePriority()) return;
  MutexLock lock(&mu_);
  priority_ = priority;
}

WorkQueue::Priority WorkQueue::priority() const {
  MutexLock lock(&mu_);
  return priority_;
}

void WorkQueue::ApplyPriority(Priority* applied) {
  Priority wanted;
  {
    MutexLock lock(&mu_);
    wanted = priority_;
  }
  if (wanted == *applied) return;
  sched_param param{};
  // pid 0: the calling thread. Best effort: a failure leaves the thread as
  // it was, which costs speed, never correctness.
  const int policy = wanted == Priority::kBackground ? SCHED_IDLE : SCHED_OTHER;
  if (sched_setscheduler(0, policy, &param) == 0) *applied = wanted;
}

void WorkQueue::Run(unsigned worker) {
  Priority applied = Priority::kNormal;
  MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && queue_.empty()) work_ready_.Wait(mu_);
    if (queue_.empty()) break;  // stopping and drained
    Item item = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !first_error_.ok();
    ++busy_;
    const bool reschedule = priority_ != applied;
    lock.Unlock();
    if (reschedule) ApplyPriority(&applied);
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
    if (shared_) shared_->Release(item.bytes);
    lock.Lock();
    --busy_;
    bytes_in_flight_ -= item.bytes;
    if (!s.ok() && first_error_.ok()) first_error_ = s;
    space_ready_.NotifyAll();
  }
}

}  // namespace gpuckpt
