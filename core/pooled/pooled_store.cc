// PooledStore (pooled_store.h): opening it over a local store, listing the
// pool's snapshots beside the local ones, fetching one when it is first
// read, the pool's part in each commit, removals and the pool's
// collection. The background pusher is in pooled_push.cc.
#include "core/pooled/pooled_store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "core/base/log.h"
#include "core/base/scope_exit.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/store/store_env.h"

namespace gpuckpt {

Result<std::unique_ptr<Store>> Store::Open(const std::string& dir, const StoreOptions& options) {
  GPUCKPT_ASSIGN_OR_RETURN(std::unique_ptr<LocalStore> local,
                           LocalStore::Open(dir, options, StoreEnv()));
  if (!options.pool) return std::unique_ptr<Store>(std::move(local));
  GPUCKPT_ASSIGN_OR_RETURN(std::unique_ptr<PooledStore> pooled,
                           PooledStore::Open(std::move(local), *options.pool, options.read_only));
  return std::unique_ptr<Store>(std::move(pooled));
}

Result<std::unique_ptr<PooledStore>> PooledStore::Open(std::unique_ptr<LocalStore> local,
                                                       const PoolOptions& options, bool read_only) {
  GPUCKPT_ASSIGN_OR_RETURN(const bool has_snapshots, local->catalog().HasAnySnapshot());
  GPUCKPT_ASSIGN_OR_RETURN(auto link,
                           PoolLink::Open(options, local->db(), has_snapshots, read_only));
  return std::unique_ptr<PooledStore>(
      new PooledStore(std::move(local), std::move(link), read_only));
}

PooledStore::PooledStore(std::unique_ptr<LocalStore> local, std::unique_ptr<PoolLink> link,
                         bool read_only)
    : local_(std::move(local)), link_(std::move(link)), read_only_(read_only) {
  local_->SetPublicationListener(this);
  if (link_->options().background) {
    // A pool back from a timeout (seen by any operation) wakes the pusher
    // from its pause.
    link_->SetOnReachable([this] { pusher_cv_.NotifyAll(); });
    pusher_ = std::thread([this] { PushInBackground(); });
  }
}

PooledStore::~PooledStore() {
  if (pusher_.joinable()) {
    {
      MutexLock lock(&pusher_mu_);
      stopping_ = true;
    }
    pusher_cv_.NotifyAll();
    pusher_.join();
  }
  // No writer is left (they must not outlive the store): nothing calls the
  // listener from now on.
  local_->SetPublicationListener(nullptr);
}

bool PooledStore::MayPassLater(const Status& s) {
  return s.code() == StatusCode::kTimedOut || s.code() == StatusCode::kIOError ||
         s.code() == StatusCode::kNoSpace || s.code() == StatusCode::kUnavailable ||
         s.code() == StatusCode::kBusy;
}

Status PooledStore::ReserveName(const std::string& name) {
  // Fed in the background, the store takes snapshots while the pool is
  // away, without waiting for it to time out each time; the name is
  // reserved when the snapshot is pushed.
  if (link_->options().background && link_->KnownUnreachable()) return Status::Ok();
  Status s = link_->ReserveName(name);
  if (s.ok()) {
    MutexLock lock(&names_mu_);
    pool_reserved_.insert(name);
    return s;
  }
  if (link_->options().background && s.code() != StatusCode::kAlreadyExists && MayPassLater(s)) {
    return Status::Ok();
  }
  return s;
}

void PooledStore::AbandonName(const std::string& name) {
  bool reserved;
  {
    MutexLock lock(&names_mu_);
    reserved = pool_reserved_.erase(name) != 0;
  }
  // Outside the lock: a round trip to the pool.
  if (reserved) link_->ReleaseName(name);
}

Status PooledStore::BeforePublish(SnapshotInfo* info) {
  if (link_->options().background) return Status::Ok();
  auto incarnation = link_->Push(local_.get(), *info);
  if (!incarnation.ok()) {
    link_->CountPushFailure(incarnation.status());
    return incarnation.status().WithContext("publishing snapshot '" + info->id + "' in pool " +
                                            link_->options().pool);
  }
  info->pool_incarnation = *incarnation;
  // Published there: the reservation is the pool's snapshot now.
  MutexLock lock(&names_mu_);
  pool_reserved_.erase(info->id);
  return Status::Ok();
}

void PooledStore::AfterPublish(const SnapshotInfo& info) {
  if (!link_->options().background) return;
  {
    MutexLock lock(&pusher_mu_);
    push_queue_.push_back(info.id);
    link_->set_pending(push_queue_.size());
  }
  pusher_cv_.NotifyAll();
}

Result<SnapshotInfo> PooledStore::Get(const std::string& id) {
  auto local = local_->Get(id);
  if (local.ok() || local.status().code() != StatusCode::kNotFound) return local;
  if (!ValidateSnapshotName(id).ok()) return local;
  auto pooled = PoolGet(id);
  if (pooled.ok() || pooled.status().code() == StatusCode::kNotFound) return pooled;
  return pooled.status().WithContext("looking snapshot '" + id + "' up in pool " +
                                     link_->options().pool);
}

Result<SnapshotInfo> PooledStore::PoolGet(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(auto entry, link_->CatalogEntryOf(id));
  if (!entry) return Status::NotFound("no snapshot '" + id + "' in store " + dir());
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, PoolLink::InfoOf(id, *entry));
  GPUCKPT_ASSIGN_OR_RETURN(info.key, PoolOnlyKey(id, entry->incarnation));
  return info;
}

Result<uint64_t> PooledStore::PoolOnlyKey(const std::string& id, uint64_t incarnation) {
  {
    MutexLock lock(&pool_keys_mu_);
    auto it = pool_keys_.find(id);
    if (it != pool_keys_.end() && it->second.first == incarnation) return it->second.second;
  }
  uint64_t key;
  if (read_only_) {
    // Writes nothing: a listing key only, far above the holder's keys (a
    // read-only store never fetches under it).
    MutexLock lock(&pool_keys_mu_);
    key = (uint64_t{1} << 62) + pool_keys_.size();
  } else {
    GPUCKPT_ASSIGN_OR_RETURN(key, local_->AllocateSnapshotKey());
  }
  MutexLock lock(&pool_keys_mu_);
  auto [it, added] = pool_keys_.try_emplace(id, incarnation, key);
  // Two threads may allocate for one snapshot: the first key stays (the
  // other is never used: keys are not reused anyway).
  if (!added && it->second.first != incarnation) it->second = {incarnation, key};
  return it->second.second;
}

Result<std::vector<SnapshotInfo>> PooledStore::List() {
  // The local store's first, then the catalog: a snapshot recorded there
  // as pushed was in the catalog before it was recorded, so a catalog read
  // after it lacks it only when it was removed from the pool since.
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<SnapshotInfo> local, local_->List());
  auto catalog = link_->Catalog();
  if (!catalog.ok()) {
    // The local snapshots stay usable while the pool is away.
    spdlog::warn("pool pool={} result=unreachable op=list error={}",
                 LogValue(link_->options().pool), LogValue(catalog.status().message()));
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
        if (!read_only_) DropRemovedFromPool(s);
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

void PooledStore::DropRemovedFromPool(const SnapshotInfo& info) {
  Status s = local_->Remove(info.id);
  if (s.ok()) {
    spdlog::info("pool pool={} op=drop id={} reason=removed_from_pool",
                 LogValue(link_->options().pool), LogValue(info.id));
  } else if (s.code() != StatusCode::kNotFound) {
    spdlog::warn("pool pool={} op=drop id={} error={}", LogValue(link_->options().pool),
                 LogValue(info.id), LogValue(s.message()));
  }
}

Result<SnapshotInfo> PooledStore::EnsureLocal(const std::string& id) {
  auto local = local_->Get(id);
  if (local.ok() || local.status().code() != StatusCode::kNotFound) return local;
  if (!ValidateSnapshotName(id).ok()) return local;
  if (read_only_) {
    auto pooled = PoolGet(id);
    if (!pooled.ok()) return local;
    return Status::PermissionDenied(fmt::format(
        "snapshot '{}' is in pool {} and not yet in store {}, which is open read-only and "
        "cannot fetch it: read it through the gpuckptfs that holds the store",
        id, link_->options().pool, dir()));
  }
  ClaimPull(id);
  ScopeExit release([this, &id] { ReleasePull(id); });
  local = local_->Get(id);  // fetched while we waited?
  if (local.ok() || local.status().code() != StatusCode::kNotFound) return local;
  if (pull_hook_) pull_hook_(id);
  GPUCKPT_ASSIGN_OR_RETURN(auto entry, link_->CatalogEntryOf(id));
  if (!entry) return local;
  GPUCKPT_ASSIGN_OR_RETURN(const uint64_t key, PoolOnlyKey(id, entry->incarnation));
  // The local store's name alone: the pool's reservation is not ours.
  GPUCKPT_RETURN_IF_ERROR(local_->ReserveLocalName(id));
  // The fetched chunks are named by no published snapshot until the end:
  // gc must not sweep them meanwhile.
  SharedMutexHold gc_hold = local_->LockAgainstGc();
  const auto start = std::chrono::steady_clock::now();
  const PoolStats before = link_->stats();
  auto pulled = link_->Pull(local_.get(), id, *entry, key);
  Status published = pulled.ok() ? local_->Publish(*pulled) : pulled.status();
  local_->ReleaseLocalName(id);
  if (!published.ok()) {
    link_->CountPullFailure(published);
    return published.WithContext("fetching snapshot '" + id + "' from pool " +
                                 link_->options().pool);
  }
  const PoolStats after = link_->stats();
  spdlog::info(
      "pool pool={} op=pull id={} result=ok fetched_chunks={} fetched_bytes={} total_s={:.3f}",
      LogValue(link_->options().pool), LogValue(id), after.fetched_chunks - before.fetched_chunks,
      after.fetched_bytes - before.fetched_bytes,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return local_->Get(id);
}

void PooledStore::ClaimPull(const std::string& id) {
  MutexLock lock(&pulls_mu_);
  while (pulling_.count(id) != 0) pull_ended_cv_.Wait(pulls_mu_);
  pulling_.insert(id);
}

void PooledStore::ReleasePull(const std::string& id) {
  MutexLock lock(&pulls_mu_);
  pulling_.erase(id);
  pull_ended_cv_.NotifyAll();
}

// Reads: the snapshot fetched first where it is the pool's alone, then
// read from the local store like any of its own.
Result<std::vector<FileEntry>> PooledStore::ListFiles(const std::string& id) {
  GPUCKPT_RETURN_IF_ERROR(EnsureLocal(id).status());
  return local_->ListFiles(id);
}

Result<std::unique_ptr<FileReader>> PooledStore::OpenFile(const std::string& id,
                                                          const std::string& path) {
  GPUCKPT_RETURN_IF_ERROR(EnsureLocal(id).status());
  return local_->OpenFile(id, path);
}

Result<std::unique_ptr<FileReader>> PooledStore::OpenListedFile(const std::string& id, uint64_t key,
                                                                const FileEntry& entry) {
  GPUCKPT_RETURN_IF_ERROR(EnsureLocal(id).status());
  return local_->OpenListedFile(id, key, entry);
}

Status PooledStore::Export(const std::string& id, const std::string& dest_dir,
                           const ProgressFn& progress) {
  GPUCKPT_RETURN_IF_ERROR(EnsureLocal(id).status());
  return local_->Export(id, dest_dir, progress);
}

Status PooledStore::Remove(const std::string& id) {
  auto local = local_->Get(id);
  if (local.ok()) {
    // From the pool first: a snapshot gone here but still in the pool
    // would be listed again as the pool's.
    if (local->pool_incarnation != 0) {
      GPUCKPT_RETURN_IF_ERROR(link_->Remove(id, local->pool_incarnation));
    }
    GPUCKPT_RETURN_IF_ERROR(local_->Remove(id));
    // Not pushed yet (background): its reservation in the pool goes too.
    if (local->pool_incarnation == 0) AbandonName(id);
    return Status::Ok();
  }
  if (local.status().code() != StatusCode::kNotFound) return local.status();
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo pooled, PoolGet(id));
  return link_->Remove(id, pooled.pool_incarnation);
}

Result<GcReport> PooledStore::Gc() {
  // Copies of snapshots removed from the pool through other stores go
  // first (a listing drops them), so that their chunks are collected now.
  GPUCKPT_RETURN_IF_ERROR(List().status());
  GPUCKPT_ASSIGN_OR_RETURN(GcReport report, local_->Gc());
  // The pool's collection runs after the local store's gc has let its
  // writers go: it is the pool's business, and they have nothing to wait
  // for.
  GPUCKPT_RETURN_IF_ERROR(CollectPool(&report));
  return report;
}

Status PooledStore::CollectPool(GcReport* report) {
  auto collected = link_->Collect();
  if (!collected.ok()) {
    return collected.status().WithContext("collecting the garbage of pool " +
                                          link_->options().pool);
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
      LogValue(link_->options().pool), collected->collected, collected->snapshots,
      collected->live_chunks, collected->marked_chunks, collected->swept, collected->swept_chunks,
      collected->swept_objects, collected->swept_bytes, collected->sweep_due_in_s);
  return Status::Ok();
}

}  // namespace gpuckpt
