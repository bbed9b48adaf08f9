// PooledStore's background pusher (PoolOptions::background): publishes in
// the pool, in order, the snapshots the local store committed, retrying
// while the pool is away.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "core/base/log.h"
#include "core/pooled/pooled_store.h"

namespace gpuckpt {

namespace {

// How long the background pusher waits before trying a pool that failed
// again: doubled after each failure, up to the maximum.
constexpr std::chrono::milliseconds kFirstRetry{500};
constexpr std::chrono::milliseconds kLongestRetry{10000};

}  // namespace

void PooledStore::PushInBackground() {
  // Snapshots committed here and never pushed (the daemon stopped first,
  // or the pool was away), oldest first.
  if (auto local = local_->List(); local.ok()) {
    MutexLock lock(&pusher_mu_);
    for (const SnapshotInfo& s : *local)
      if (s.pool_incarnation == 0) push_queue_.push_back(s.id);
    link_->set_pending(push_queue_.size());
  }
  std::chrono::milliseconds retry = kFirstRetry;
  // Locked by hand: the lock is given up around each push (pool I/O).
  pusher_mu_.Lock();
  while (!stopping_) {
    if (push_queue_.empty()) {
      pusher_cv_.Wait(pusher_mu_);
      continue;
    }
    const std::string id = push_queue_.front();
    pusher_mu_.Unlock();
    Status pushed = PushQueued(id);
    pusher_mu_.Lock();
    if (!pushed.ok() && MayPassLater(pushed)) {
      // In order: the next one would most likely fail the same way.
      pusher_cv_.WaitFor(pusher_mu_, retry);
      retry = std::min(retry * 2, kLongestRetry);
      continue;
    }
    retry = kFirstRetry;
    if (!push_queue_.empty() && push_queue_.front() == id) push_queue_.pop_front();
    link_->set_pending(push_queue_.size());
  }
  pusher_mu_.Unlock();
}

Status PooledStore::PushQueued(const std::string& id) {
  const auto start = std::chrono::steady_clock::now();
  // Pinned: a removal meanwhile leaves its records for the push to read.
  auto pinned = local_->PinSnapshot(id);
  if (!pinned.ok()) return Status::Ok();  // removed since: nothing to push
  const SnapshotInfo& info = pinned->first;
  if (info.pool_incarnation != 0) return Status::Ok();
  bool reserved;
  {
    MutexLock lock(&names_mu_);
    reserved = pool_reserved_.count(id) != 0;
  }
  Status s = reserved ? Status::Ok() : link_->ReserveName(id);
  if (s.ok()) {
    {
      MutexLock lock(&names_mu_);
      pool_reserved_.insert(id);
    }
    auto incarnation = link_->Push(local_.get(), info);
    s = incarnation.status();
    if (incarnation.ok()) {
      {
        MutexLock lock(&names_mu_);
        pool_reserved_.erase(id);
      }
      s = local_->RecordPoolIncarnation(id, info.key, *incarnation);
      // Removed here while it was pushed: out of the pool again.
      if (s.code() == StatusCode::kNotFound) s = link_->Remove(id, *incarnation);
    }
  }
  const std::string pool_name = LogValue(link_->options().pool);
  if (!s.ok()) {
    link_->CountPushFailure(s);
    spdlog::warn("pool pool={} op=push id={} result=failed retry={} error={}", pool_name,
                 LogValue(id), MayPassLater(s), LogValue(s.message()));
    return s;
  }
  spdlog::info("pool pool={} op=push id={} result=ok total_s={:.3f}", pool_name, LogValue(id),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return s;
}

}  // namespace gpuckpt
