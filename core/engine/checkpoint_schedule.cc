#include "core/engine/checkpoint_schedule.h"

#include <algorithm>

#include "core/base/mono_clock.h"

namespace gpuckpt {

CheckpointSchedule::CheckpointSchedule(RunFn run) : run_(std::move(run)) {}

CheckpointSchedule::~CheckpointSchedule() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void CheckpointSchedule::Set(const CheckpointRequest& request, uint64_t start_time) {
  {
    MutexLock lock(&mu_);
    Entry entry;
    entry.request = request;
    entry.start_time = start_time;
    entry.next_due_ns = MonotonicNowNs() +
                        std::chrono::duration_cast<std::chrono::nanoseconds>(request.every).count();
    entry.generation = ++next_generation_;
    entries_[request.pid] = std::move(entry);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  changed_.NotifyAll();
}

bool CheckpointSchedule::Stop(int pid) {
  bool had;
  {
    MutexLock lock(&mu_);
    had = entries_.erase(pid) != 0;
  }
  changed_.NotifyAll();
  return had;
}

std::optional<CheckpointSchedule::View> CheckpointSchedule::Of(int pid) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(pid);
  if (it == entries_.end()) return std::nullopt;
  const Entry& e = it->second;
  return View{e.request.every, e.request.retention, e.request.owner_retention, e.next_due_ns,
              e.runs,          e.failures};
}

void CheckpointSchedule::Loop() {
  // Locked by hand: the lock is given up around each run.
  mu_.Lock();
  while (!stopping_) {
    auto due = std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.second.next_due_ns < b.second.next_due_ns;
    });
    if (due == entries_.end()) {
      changed_.Wait(mu_);
      continue;
    }
    const int64_t wait_ns = due->second.next_due_ns - MonotonicNowNs();
    if (wait_ns > 0) {
      // Woken early by a change (or to stop), it looks again.
      changed_.WaitFor(mu_, std::chrono::milliseconds(wait_ns / 1000000 + 1));
      continue;
    }
    const int pid = due->first;
    const CheckpointRequest request = due->second.request;
    const uint64_t start_time = due->second.start_time;
    const uint64_t generation = due->second.generation;
    mu_.Unlock();
    bool ok = false;
    const bool goes_on = run_(request, start_time, &ok);
    mu_.Lock();
    auto it = entries_.find(pid);
    // Replaced or stopped meanwhile: that is the schedule now.
    if (it == entries_.end() || it->second.generation != generation) continue;
    if (!goes_on) {
      entries_.erase(it);
      continue;
    }
    Entry& e = it->second;
    ++e.runs;
    if (!ok) ++e.failures;
    const int64_t every_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(e.request.every).count();
    e.next_due_ns = std::max(e.next_due_ns + every_ns, MonotonicNowNs());
  }
  mu_.Unlock();
}

}  // namespace gpuckpt
