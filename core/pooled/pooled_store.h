// PooledStore: a Store over a LocalStore and the shared RADOS pool it is
// the local index and cache of (StoreOptions::pool; core/store/FORMAT.md,
// "The shared pool"). The local store knows nothing of the pool: this
// layer lists the pool's snapshots beside the local ones, fetches one into
// the local store when it is first read, removes from both, collects the
// pool's garbage after the local store's, and, as the local store's
// PublicationListener, reserves each new snapshot's name pool-wide and
// publishes it there (before the local store does, or in the background).
//
// Locks: names_mu_, pool_keys_mu_, pulls_mu_ and pusher_mu_ are each taken
// alone and never held across I/O (pulling_ marks a fetch in progress
// instead: fetches of different snapshots run side by side, and a second
// reader of a snapshot being fetched waits for that fetch).
//
// Thread-safe, as Store. Owns the local store and the pool's link.
#ifndef GPUCKPT_CORE_POOLED_POOLED_STORE_H_
#define GPUCKPT_CORE_POOLED_POOLED_STORE_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/mutex.h"
#include "core/pooled/pool_link.h"
#include "core/snapshot/local_store.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class PooledStore final : public Store, private PublicationListener {
 public:
  // Joins `local` to the pool of `options` (see PoolLink::Open for the
  // fingerprint seed they must share). `read_only`: `local` is open
  // read-only; the pool is then only listed.
  static Result<std::unique_ptr<PooledStore>> Open(std::unique_ptr<LocalStore> local,
                                                   const PoolOptions& options, bool read_only);
  ~PooledStore() override;

  using Store::BeginSnapshot;
  Result<std::unique_ptr<SnapshotWriter>> BeginSnapshot(
      const SnapshotSpec& spec, const SnapshotWriterOptions& options) override {
    return local_->BeginSnapshot(spec, options);
  }
  Result<SnapshotInfo> ImportDirectory(const std::string& src_dir, const SnapshotSpec& spec,
                                       const ProgressFn& progress) override {
    return local_->ImportDirectory(src_dir, spec, progress);
  }
  Status Export(const std::string& id, const std::string& dest_dir,
                const ProgressFn& progress) override;
  Result<std::vector<SnapshotInfo>> List() override;
  Result<SnapshotInfo> Get(const std::string& id) override;
  Result<std::vector<FileEntry>> ListFiles(const std::string& id) override;
  Result<std::unique_ptr<FileReader>> OpenFile(const std::string& id,
                                               const std::string& path) override;
  Result<std::unique_ptr<FileReader>> OpenListedFile(const std::string& id, uint64_t key,
                                                     const FileEntry& entry) override;
  Status Remove(const std::string& id) override;
  Result<GcReport> Gc() override;
  Result<FsckReport> Fsck() override { return local_->Fsck(); }
  uint64_t settled_snapshots() const override { return local_->settled_snapshots(); }
  Result<StoreStats> Stats() override { return local_->Stats(); }
  Result<uint64_t> HeldBytes(const std::vector<std::string>& ids) override {
    return local_->HeldBytes(ids);
  }
  Result<uint64_t> FreeBytes() override { return local_->FreeBytes(); }
  CacheStats cache_stats() const override { return local_->cache_stats(); }
  std::optional<PoolStats> pool_stats() const override { return link_->stats(); }
  const std::string& dir() const override { return local_->dir(); }

  // The local store beneath (tests).
  LocalStore& local() const { return *local_; }
  // Tests only, set before any fetch: called with the snapshot's id once a
  // fetch from the pool is the calling thread's, before it reads the pool.
  void SetPullHookForTesting(std::function<void(const std::string&)> hook) {
    pull_hook_ = std::move(hook);
  }

 private:
  PooledStore(std::unique_ptr<LocalStore> local, std::unique_ptr<PoolLink> link, bool read_only);

  // PublicationListener: the pool's part in the local store's snapshots.
  // Reserves a name pool-wide; with background pushes a pool that cannot
  // be reached defers that to the push.
  Status ReserveName(const std::string& name) override EXCLUDES(names_mu_);
  void AbandonName(const std::string& name) override EXCLUDES(names_mu_);
  // Without PoolOptions::background, publishes the committed snapshot in
  // the pool and sets info->pool_incarnation; a failure fails the commit.
  Status BeforePublish(SnapshotInfo* info) override;
  // With background, queues the snapshot for the pusher.
  void AfterPublish(const SnapshotInfo& info) override EXCLUDES(pusher_mu_);

  // The snapshot key a pool-only snapshot is listed with, and fetched
  // under: one per incarnation, for the life of this Store, so that a
  // listing and a later read agree.
  Result<uint64_t> PoolOnlyKey(const std::string& id, uint64_t incarnation) EXCLUDES(pool_keys_mu_);
  // The pool's snapshot `id` as listed (pool_only), kNotFound without one.
  Result<SnapshotInfo> PoolGet(const std::string& id);
  // Snapshot `id` as the local store holds it, fetched from the pool first
  // when it is pool-only there.
  Result<SnapshotInfo> EnsureLocal(const std::string& id) EXCLUDES(pulls_mu_);
  // Makes the fetch of `id` this thread's, waiting while another thread
  // fetches it; ReleasePull() gives it back.
  void ClaimPull(const std::string& id) EXCLUDES(pulls_mu_);
  void ReleasePull(const std::string& id) EXCLUDES(pulls_mu_);
  // Drops the local copy of a snapshot the pool no longer has (removed
  // through another store).
  void DropRemovedFromPool(const SnapshotInfo& info);
  // Gc()'s run of the pool's collector, into `report`.
  Status CollectPool(GcReport* report);
  // Failures that the pool's coming back may cure: worth another try.
  static bool MayPassLater(const Status& s);
  // The background pusher's loop, and one push of it (pooled_push.cc).
  void PushInBackground() EXCLUDES(pusher_mu_);
  Status PushQueued(const std::string& id) EXCLUDES(names_mu_);

  // Declared first, destroyed last: the link and the pusher use it.
  const std::unique_ptr<LocalStore> local_;
  const std::unique_ptr<PoolLink> link_;
  const bool read_only_;

  Mutex names_mu_;
  // Names reserved in the pool for the local store's snapshots and not
  // published there yet.
  std::set<std::string> pool_reserved_ GUARDED_BY(names_mu_);
  Mutex pool_keys_mu_;
  // id -> (incarnation, key) of pool-only snapshots listed so far.
  std::map<std::string, std::pair<uint64_t, uint64_t>> pool_keys_ GUARDED_BY(pool_keys_mu_);
  // The snapshots being fetched from the pool, each by one thread across
  // its whole fetch, I/O included: a second reader of a snapshot being
  // fetched waits for it rather than fetching it again, while fetches of
  // different snapshots run side by side.
  Mutex pulls_mu_;
  CondVar pull_ended_cv_;
  std::set<std::string> pulling_ GUARDED_BY(pulls_mu_);
  // See SetPullHookForTesting().
  std::function<void(const std::string&)> pull_hook_;
  // Background pushes (PoolOptions::background).
  Mutex pusher_mu_;
  CondVar pusher_cv_;
  std::deque<std::string> push_queue_ GUARDED_BY(pusher_mu_);
  bool stopping_ GUARDED_BY(pusher_mu_) = false;
  std::thread pusher_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_POOLED_POOLED_STORE_H_
