// StoreImpl's side of the shared pool (StoreOptions::pool): listing the
// pool's snapshots beside the store's own, fetching one when it is first
// read, publishing commits there (at once or in the background), and
// removals.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "core/base/log.h"
#include "core/base/scope_exit.h"
#include "core/catalog/records.h"
#include "core/snapshot/pool_link.h"
#include "core/snapshot/store_impl.h"

namespace gpuckpt {

namespace {

// How long the background pusher waits before trying a pool that failed
// again: doubled after each failure, up to the maximum.
constexpr std::chrono::milliseconds kFirstRetry{500};
constexpr std::chrono::milliseconds kLongestRetry{10000};

// Failures that the pool's coming back may cure: worth another try.
bool MayPassLater(const Status& s) {
  return s.code() == StatusCode::kTimedOut || s.code() == StatusCode::kIOError ||
         s.code() == StatusCode::kNoSpace || s.code() == StatusCode::kUnavailable ||
         s.code() == StatusCode::kBusy;
}

}  // namespace

std::optional<PoolStats> StoreImpl::pool_stats() const {
  if (pool_ == nullptr) return std::nullopt;
  return pool_->stats();
}

Status StoreImpl::ReservePoolName(const std::string& name) {
  // Fed in the background, the store takes snapshots while the pool is
  // away, without waiting for it to time out each time; the name is
  // reserved when the snapshot is pushed.
  if (pool_->options().background && pool_->KnownUnreachable()) return Status::Ok();
  Status s = pool_->ReserveName(name);
  if (s.ok()) {
    MutexLock lock(&names_mu_);
    pool_reserved_.insert(name);
    return s;
  }
  if (pool_->options().background && s.code() != StatusCode::kAlreadyExists && MayPassLater(s)) {
    return Status::Ok();
  }
  return s;
}

Result<SnapshotInfo> StoreImpl::Get(const std::string& id) {
  auto local = LocalGet(id);
  if (pool_ == nullptr || local.ok() || local.status().code() != StatusCode::kNotFound) {
    return local;
  }
  if (!ValidateSnapshotName(id).ok()) return local;
  auto pooled = PoolGet(id);
  if (pooled.ok() || pooled.status().code() == StatusCode::kNotFound) return pooled;
  return pooled.status().WithContext("looking snapshot '" + id + "' up in pool " +
                                     pool_->options().pool);
}

Result<SnapshotInfo> StoreImpl::PoolGet(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(auto entry, pool_->CatalogEntryOf(id));
  if (!entry) return Status::NotFound("no snapshot '" + id + "' in store " + dir());
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, PoolLink::InfoOf(id, *entry));
  GPUCKPT_ASSIGN_OR_RETURN(info.key, PoolOnlyKey(id, entry->incarnation));
  return info;
}

Result<uint64_t> StoreImpl::PoolOnlyKey(const std::string& id, uint64_t incarnation) {
  {
    MutexLock lock(&pool_keys_mu_);
    auto it = pool_keys_.find(id);
    if (it != pool_keys_.end() && it->second.first == incarnation) return it->second.second;
  }
  uint64_t key;
  if (options_.read_only) {
    // Writes nothing: a listing key only, far above the holder's keys (a
    // read-only store never fetches under it).
    MutexLock lock(&pool_keys_mu_);
    key = (uint64_t{1} << 62) + pool_keys_.size();
  } else {
    GPUCKPT_ASSIGN_OR_RETURN(key, AllocateSnapshotKey());
  }
  MutexLock lock(&pool_keys_mu_);
  auto [it, added] = pool_keys_.try_emplace(id, incarnation, key);
  // Two threads may allocate for one snapshot: the first key stays (the
  // other is never used: keys are not reused anyway).
  if (!added && it->second.first != incarnation) it->second = {incarnation, key};
  return it->second.second;
}

Result<std::vector<SnapshotInfo>> StoreImpl::List() {
  // This store's own first, then the catalog: a snapshot recorded here as
  // pushed was in the catalog before it was recorded, so a catalog read
  // after it lacks it only when it was removed from the pool since.
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<SnapshotInfo> local, LocalList());
  if (pool_ == nullptr) return local;
  auto catalog = pool_->Catalog();
  if (!catalog.ok()) {
    // The store's own snapshots stay usable while the pool is away.
    spdlog::warn("pool pool={} result=unreachable op=list error={}",
                 LogValue(pool_->options().pool), LogValue(catalog.status().message()));
    return local;
  }
  std::map<std::string, pool::CatalogEntry>& entries = catalog->entries;
  std::vector<SnapshotInfo> out;
  for (SnapshotInfo& s : local) {
    // A copy of a snapshot whose entry cannot be read is kept: it may be
    // there still.
    if (s.pool_incarnation != 0 && catalog->unreadable.count(s.id) == 0) {
      auto it = entries.find(s.id);
      if (it == entries.end() || it->second.incarnation != s.pool_incarnation) {
        if (!options_.read_only) DropRemovedFromPool(s);
        continue;
      }
      entries.erase(it);
    } else {
      entries.erase(s.id);  // not pushed yet: ours is the one to show
    }
    out.push_back(std::move(s));
  }
  for (const auto& [id, entry] : entries) {
    auto info = PoolLink::InfoOf(id, entry);
    if (!info.ok()) continue;  // one damaged entry hides only itself
    GPUCKPT_ASSIGN_OR_RETURN(info->key, PoolOnlyKey(id, entry.incarnation));
    out.push_back(std::move(*info));
  }
  // Oldest first, wherever they were made.
  std::stable_sort(out.begin(), out.end(), [](const SnapshotInfo& a, const SnapshotInfo& b) {
    return a.created_ns < b.created_ns;
  });
  return out;
}

void StoreImpl::DropRemovedFromPool(const SnapshotInfo& info) {
  Status s = RemoveLocal(info.id);
  if (s.ok()) {
    spdlog::info("pool pool={} op=drop id={} reason=removed_from_pool",
                 LogValue(pool_->options().pool), LogValue(info.id));
  } else if (s.code() != StatusCode::kNotFound) {
    spdlog::warn("pool pool={} op=drop id={} error={}", LogValue(pool_->options().pool),
                 LogValue(info.id), LogValue(s.message()));
  }
}

Result<SnapshotInfo> StoreImpl::EnsureLocal(const std::string& id) {
  auto local = LocalGet(id);
  if (pool_ == nullptr || local.ok() || local.status().code() != StatusCode::kNotFound) {
    return local;
  }
  if (!ValidateSnapshotName(id).ok()) return local;
  if (options_.read_only) {
    auto pooled = PoolGet(id);
    if (!pooled.ok()) return local;
    return Status::PermissionDenied(fmt::format(
        "snapshot '{}' is in pool {} and not yet in store {}, which is open read-only and "
        "cannot fetch it: read it through the gpuckptfs that holds the store",
        id, pool_->options().pool, dir()));
  }
  ClaimPull(id);
  ScopeExit release([this, &id] { ReleasePull(id); });
  local = LocalGet(id);  // fetched while we waited?
  if (local.ok() || local.status().code() != StatusCode::kNotFound) return local;
  if (pull_hook_) pull_hook_(id);
  GPUCKPT_ASSIGN_OR_RETURN(auto entry, pool_->CatalogEntryOf(id));
  if (!entry) return local;
  GPUCKPT_ASSIGN_OR_RETURN(const uint64_t key, PoolOnlyKey(id, entry->incarnation));
  GPUCKPT_RETURN_IF_ERROR(ReserveLocalName(id));
  // The fetched chunks are named by no published snapshot until the end:
  // gc must not sweep them meanwhile.
  SharedMutexHold gc_hold(&gc_mu_);
  const auto start = std::chrono::steady_clock::now();
  const PoolStats before = pool_->stats();
  auto pulled = pool_->Pull(this, id, *entry, key);
  Status published = pulled.ok() ? Publish(*pulled) : pulled.status();
  ReleaseName(id, NameFate::kPublished);  // the pool's reservation is not ours
  if (!published.ok()) {
    pool_->CountPullFailure(published);
    return published.WithContext("fetching snapshot '" + id + "' from pool " +
                                 pool_->options().pool);
  }
  const PoolStats after = pool_->stats();
  spdlog::info(
      "pool pool={} op=pull id={} result=ok fetched_chunks={} fetched_bytes={} total_s={:.3f}",
      LogValue(pool_->options().pool), LogValue(id), after.fetched_chunks - before.fetched_chunks,
      after.fetched_bytes - before.fetched_bytes,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return LocalGet(id);
}

void StoreImpl::ClaimPull(const std::string& id) {
  MutexLock lock(&pulls_mu_);
  while (pulling_.count(id) != 0) pull_ended_cv_.Wait(pulls_mu_);
  pulling_.insert(id);
}

void StoreImpl::ReleasePull(const std::string& id) {
  MutexLock lock(&pulls_mu_);
  pulling_.erase(id);
  pull_ended_cv_.NotifyAll();
}

Status StoreImpl::Remove(const std::string& id) {
  if (pool_ == nullptr) return RemoveLocal(id);
  auto local = LocalGet(id);
  if (local.ok()) {
    // From the pool first: a snapshot gone here but still in the pool
    // would be listed again as the pool's.
    if (local->pool_incarnation != 0) {
      GPUCKPT_RETURN_IF_ERROR(pool_->Remove(id, local->pool_incarnation));
    }
    GPUCKPT_RETURN_IF_ERROR(RemoveLocal(id));
    // Not pushed yet (background): its reservation in the pool goes too.
    if (local->pool_incarnation == 0) ReleaseName(id, NameFate::kAbandoned);
    return Status::Ok();
  }
  if (local.status().code() != StatusCode::kNotFound) return local.status();
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo pooled, PoolGet(id));
  return pool_->Remove(id, pooled.pool_incarnation);
}

Status StoreImpl::CollectPool(GcReport* report) {
  auto collected = pool_->Collect();
  if (!collected.ok()) {
    return collected.status().WithContext("collecting the garbage of pool " +
                                          pool_->options().pool);
  }
  report->pool_collected = collected->collected;
  report->pool_marked_chunks = collected->marked_chunks;
  report->pool_swept = collected->swept;
  report->pool_swept_chunks = collected->swept_chunks;
  report->pool_swept_objects = collected->swept_objects;
  report->pool_swept_bytes = collected->swept_bytes;
  report->pool_sweep_due_in_s = collected->sweep_due_in_s;
  spdlog::info(
      "pool pool={} op=gc collected={} snapshots={} live_chunks={} marked={} swept={} "
      "swept_chunks={} swept_objects={} swept_bytes={} sweep_due_in_s={}",
      LogValue(pool_->options().pool), collected->collected, collected->snapshots,
      collected->live_chunks, collected->marked_chunks, collected->swept, collected->swept_chunks,
      collected->swept_objects, collected->swept_bytes, collected->sweep_due_in_s);
  return Status::Ok();
}

Status StoreImpl::PushBeforePublish(SnapshotInfo* info) {
  if (pool_ == nullptr || pool_->options().background) return Status::Ok();
  auto incarnation = pool_->Push(this, *info);
  if (!incarnation.ok()) {
    pool_->CountPushFailure(incarnation.status());
    return incarnation.status().WithContext("publishing snapshot '" + info->id + "' in pool " +
                                            pool_->options().pool);
  }
  info->pool_incarnation = *incarnation;
  return Status::Ok();
}

void StoreImpl::AfterPublish(const SnapshotInfo& info) {
  if (pool_ == nullptr || !pool_->options().background) return;
  {
    MutexLock lock(&pusher_mu_);
    push_queue_.push_back(info.id);
    pool_->set_pending(push_queue_.size());
  }
  pusher_cv_.NotifyAll();
}

void StoreImpl::PushInBackground() {
  // Snapshots committed here and never pushed (the daemon stopped first,
  // or the pool was away), oldest first.
  if (auto local = LocalList(); local.ok()) {
    MutexLock lock(&pusher_mu_);
    for (const SnapshotInfo& s : *local)
      if (s.pool_incarnation == 0) push_queue_.push_back(s.id);
    pool_->set_pending(push_queue_.size());
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
    pool_->set_pending(push_queue_.size());
  }
  pusher_mu_.Unlock();
}

Status StoreImpl::PushQueued(const std::string& id) {
  const auto start = std::chrono::steady_clock::now();
  // Pinned: a removal meanwhile leaves its records for the push to read.
  auto pinned = PinSnapshot(id);
  if (!pinned.ok()) return Status::Ok();  // removed since: nothing to push
  const SnapshotInfo& info = pinned->first;
  if (info.pool_incarnation != 0) return Status::Ok();
  bool reserved;
  {
    MutexLock lock(&names_mu_);
    reserved = pool_reserved_.count(id) != 0;
  }
  Status s = reserved ? Status::Ok() : pool_->ReserveName(id);
  if (s.ok()) {
    {
      MutexLock lock(&names_mu_);
      pool_reserved_.insert(id);
    }
    auto incarnation = pool_->Push(this, info);
    s = incarnation.status();
    if (incarnation.ok()) {
      {
        MutexLock lock(&names_mu_);
        pool_reserved_.erase(id);
      }
      s = RecordPoolIncarnation(id, info.key, *incarnation);
      // Removed here while it was pushed: out of the pool again.
      if (s.code() == StatusCode::kNotFound) s = pool_->Remove(id, *incarnation);
    }
  }
  const std::string pool_name = LogValue(pool_->options().pool);
  if (!s.ok()) {
    pool_->CountPushFailure(s);
    spdlog::warn("pool pool={} op=push id={} result=failed retry={} error={}", pool_name,
                 LogValue(id), MayPassLater(s), LogValue(s.message()));
    return s;
  }
  spdlog::info("pool pool={} op=push id={} result=ok total_s={:.3f}", pool_name, LogValue(id),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return s;
}

Status StoreImpl::RecordPoolIncarnation(const std::string& id, uint64_t key, uint64_t incarnation) {
  // Under the lock Remove() holds across its write: the record is either
  // still the one pushed (and rewritten here) or gone (and stays gone).
  MutexLock lock(&pins_->mu);
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, LocalGet(id));
  if (info.key != key) return Status::NotFound("snapshot '" + id + "' was replaced");
  info.pool_incarnation = incarnation;
  return catalog_->PutSnapshot(info, options_.sync,
                               "recording that snapshot '" + id + "' is in the pool");
}

}  // namespace gpuckpt
