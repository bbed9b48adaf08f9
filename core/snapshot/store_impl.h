// StoreImpl: the LocalStore (local_store.h) on a StoreDb.
//
// Locks, in acquisition order: gc_mu_ (shared by snapshot writers for their
// whole life, exclusive for Gc) before names_mu_ (names reserved by writers
// not yet committed) and pins_->mu (snapshots that open readers read).
// names_mu_ is never held across I/O: a name is reserved in memory first
// and looked up in the database after, and only its reserver publishes it.
// gc_mu_ is held across chunk I/O, its purpose being exactly to keep Gc
// from sweeping chunks a running writer has decided to reuse; pins_->mu
// across one write of Remove() (see RemoveOnce()); key_mu_ across the
// synced write of the next snapshot key (see AllocateSnapshotKey()).
//
// The store's tables are reached only through their owners: the chunk
// tables through the ChunkStore, the snapshot, file and extent records
// through the SnapshotCatalog (and its ExtentIndex).
//
// Pins: a FileReader (and an Export) holds a SnapshotPin on the snapshot's
// key for its whole life. Remove() deletes the snapshot record at once (it
// is gone from List and Get), but leaves the file and extent records of a
// pinned snapshot in place, and Gc() counts pinned keys among the live
// ones: it keeps their records and every chunk they name. The first Gc()
// after the last pin goes sweeps them as orphans.
#ifndef GPUCKPT_CORE_SNAPSHOT_STORE_IMPL_H_
#define GPUCKPT_CORE_SNAPSHOT_STORE_IMPL_H_

#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>

#include "core/base/mutex.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/snapshot/local_store.h"
#include "core/snapshot/spool.h"
#include "core/store/chunk_cache.h"
#include "core/store/chunk_store.h"
#include "core/store/store_db.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

// Whether one of two existing paths contains the other (after resolving
// symlinks): an import of the store into itself, or an export into it.
bool PathsOverlap(const std::string& a, const std::string& b);
// Whether existing `path` is `dir` or inside it (after resolving symlinks).
bool IsInside(const std::string& path, const std::string& dir);

class StoreImpl final : public LocalStore {
 public:
  StoreImpl(std::unique_ptr<StoreDb> db, std::unique_ptr<SnapshotCatalog> catalog,
            std::unique_ptr<ChunkCache> cache, std::unique_ptr<ChunkStore> chunks,
            std::unique_ptr<Spool> spool, const StoreOptions& options);
  ~StoreImpl() override;

  using Store::BeginSnapshot;
  Result<std::unique_ptr<SnapshotWriter>> BeginSnapshot(
      const SnapshotSpec& spec, const SnapshotWriterOptions& options) override;
  Result<SnapshotInfo> ImportDirectory(const std::string& src_dir, const SnapshotSpec& spec,
                                       const ProgressFn& progress) override;
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
  Result<GcReport> Gc() override EXCLUDES(gc_mu_);
  Result<FsckReport> Fsck() override EXCLUDES(gc_mu_);
  uint64_t settled_snapshots() const override {
    return settled_snapshots_.load(std::memory_order_acquire);
  }
  Result<StoreStats> Stats() override;
  Result<uint64_t> HeldBytes(const std::vector<std::string>& ids) override;
  Result<uint64_t> FreeBytes() override { return db_->FreeBytesForIngest(); }
  CacheStats cache_stats() const override {
    return CacheStats{cache_->hits(), cache_->misses(), options_.chunk_cache_bytes};
  }
  std::optional<PoolStats> pool_stats() const override { return std::nullopt; }
  const std::string& dir() const override { return db_->dir(); }

  // LocalStore.
  void SetPublicationListener(PublicationListener* listener) override { listener_ = listener; }
  Result<uint64_t> AllocateSnapshotKey() override EXCLUDES(key_mu_);
  Status ReserveLocalName(const std::string& name) override EXCLUDES(names_mu_);
  void ReleaseLocalName(const std::string& name) override EXCLUDES(names_mu_);
  // Publishes a committed writer's manifest under the name BeginSnapshot()
  // reserved for it (info.id), which the writer still holds: no one else
  // publishes that name meanwhile. Fails if a snapshot of that name exists.
  Status Publish(const SnapshotInfo& info) override EXCLUDES(names_mu_);
  // Held by a writer for its whole life: Gc waits for it.
  SharedMutexHold LockAgainstGc() override { return SharedMutexHold(&gc_mu_); }
  Result<std::pair<SnapshotInfo, SnapshotPin>> PinSnapshot(const std::string& id) override;
  Status RecordPoolIncarnation(const std::string& id, uint64_t key, uint64_t incarnation) override
      EXCLUDES(pins_->mu);
  StoreDb* db() const override { return db_.get(); }
  SnapshotCatalog& catalog() const override { return *catalog_; }
  ChunkStore& chunks() const override { return *chunk_store_; }
  const StoreOptions& options() const override { return options_; }

  // For the snapshot writer.
  const Spool& spool() const { return *spool_; }
  // Whether a listener takes part in publication: its writers do not spool
  // (PublicationListener::BeforePublish() reads chunked files).
  bool has_listener() const { return listener_ != nullptr; }

  // Settling spooled snapshots (settle.cc): chunking the files a spooling
  // writer made durable raw (SnapshotWriterOptions::spool), in the
  // background, oldest first. A settled file's extents and record are
  // flushed before its spool file goes, so a crash at any point leaves the
  // file readable from one or the other; ResumeSettling() (at open) queues
  // what a stopped store left spooled and removes spool files nothing
  // needs.
  // Queues published snapshot `id`, which has spooled files.
  void QueueSettle(const std::string& id) EXCLUDES(settle_mu_);
  // Settles snapshot `id` now, on this thread, unless it is settled or
  // gone. The settler thread calls it; so may tests.
  Status Settle(const std::string& id) EXCLUDES(settle_mu_);
  // Settle(), for a caller that holds LockAgainstGc() already (a writer
  // settling its base first).
  Status SettleHoldingGcGuard(const std::string& id) EXCLUDES(settle_mu_);
  // Stops the settler (what it is settling is given up, and settled again
  // later) until the pause is destroyed: a spooling writer holds one, so
  // that its spool files reach the disk without the settler's writes
  // beside them, which the kernel's writeback would make the frozen tree
  // wait for. Move-only; destroy it before the store.
  class SettlePause {
   public:
    SettlePause(SettlePause&& other) noexcept : store_(std::exchange(other.store_, nullptr)) {}
    SettlePause& operator=(SettlePause&&) = delete;
    ~SettlePause() {
      if (store_ != nullptr) store_->EndSettlePause();
    }

   private:
    friend class StoreImpl;
    explicit SettlePause(StoreImpl* store) : store_(store) {}
    StoreImpl* store_;
  };
  SettlePause PauseSettling() EXCLUDES(settle_mu_);
  // Waits until nothing queued is left to settle (tests, benchmarks).
  void WaitSettled() EXCLUDES(settle_mu_);
  // At open: queues the snapshots a stopped store left spooled, and removes
  // spool files no published snapshot has.
  Status ResumeSettling() EXCLUDES(settle_mu_);
  // Forgets a name reserved by BeginSnapshot(): once its snapshot is
  // published, or when it was abandoned (which the listener is told of).
  enum class NameFate { kPublished, kAbandoned };
  void ReleaseName(const std::string& name, NameFate fate) EXCLUDES(names_mu_);

  // The listener's part of a commit (PublicationListener), where there is
  // one: before the writer publishes, and after.
  Status BeforePublish(SnapshotInfo* info) {
    return listener_ == nullptr ? Status::Ok() : listener_->BeforePublish(info);
  }
  void AfterPublish(const SnapshotInfo& info) {
    if (listener_ != nullptr) listener_->AfterPublish(info);
  }

  // This store's snapshots, oldest first, as of `view` when given, else as
  // of now.
  Result<std::vector<SnapshotInfo>> LocalList(const DbView* view = nullptr) {
    return catalog_->ListSnapshots(view);
  }

 private:
  // Reserves `name` and checks the database for it: kAlreadyExists when a
  // writer holds it or a snapshot has it. With a listener, the listener
  // reserves it too.
  Status ReserveUnusedName(const std::string& name) EXCLUDES(names_mu_);
  Result<SnapshotInfo> LocalGet(const std::string& id);
  // Another pin of snapshot `key`, which the caller has pinned already.
  SnapshotPin PinAgain(uint64_t key) EXCLUDES(pins_->mu);
  // A reader of file `index` of snapshot `info`, from its spool file while
  // it has one.
  Result<std::unique_ptr<FileReader>> MakeReader(SnapshotPin pin, const SnapshotInfo& info,
                                                 uint32_t index, FileEntry entry);

  // Settling (settle.cc).
  void EndSettlePause() EXCLUDES(settle_mu_);
  void StopSettling() EXCLUDES(settle_mu_);
  void SettleInBackground() EXCLUDES(settle_mu_);
  // Settle()'s work, with the hold against gc and settle_one_mu_ taken; in
  // the background (on idle CPU, and given up, kCancelled, when a writer
  // takes over), or at the caller's priority.
  Status SettleLocked(const std::string& id, bool in_background);
  // Writes the settled records of snapshot `info` unless it was removed
  // meanwhile; returns whether it wrote them.
  Result<bool> RecordSettled(const SnapshotInfo& info,
                             const std::vector<std::pair<uint32_t, FileEntry>>& settled)
      EXCLUDES(pins_->mu);
  // Removes the spool files of snapshots that are neither listed nor
  // pinned (gc).
  Status RemoveOrphanSpoolFiles(const std::unordered_set<uint64_t>& live_or_pinned);

  Status RemoveOnce(const std::string& id) EXCLUDES(pins_->mu);
  Result<GcReport> GcLocked() REQUIRES(gc_mu_) EXCLUDES(pins_->mu);
  // One pass of Fsck() over the database as this Store sees it now: one
  // DbView of it, with gc held off.
  Result<FsckReport> FsckOnce() EXCLUDES(gc_mu_);

  std::unique_ptr<StoreDb> db_;
  std::unique_ptr<SnapshotCatalog> catalog_;  // borrows db_
  StoreOptions options_;
  std::unique_ptr<ChunkCache> cache_;
  std::unique_ptr<ChunkStore> chunk_store_;  // borrows db_ and cache_
  std::unique_ptr<Spool> spool_;             // borrows db_'s file ops

  SharedMutex gc_mu_ ACQUIRED_BEFORE(names_mu_);
  Mutex names_mu_;
  std::set<std::string> reserved_names_ GUARDED_BY(names_mu_);
  // Held through a whole key allocation, its synced write included.
  Mutex key_mu_;
  const std::shared_ptr<PinRegistry> pins_ = std::make_shared<PinRegistry>();

  PublicationListener* listener_ = nullptr;  // see SetPublicationListener()
  // The settler: ids queued, the one being settled, and its thread
  // (started by the first QueueSettle()).
  Mutex settle_mu_;
  CondVar settle_cv_;
  std::deque<std::string> settle_queue_ GUARDED_BY(settle_mu_);
  int settling_now_ GUARDED_BY(settle_mu_) = 0;
  bool settle_stopping_ GUARDED_BY(settle_mu_) = false;
  int settle_pauses_ GUARDED_BY(settle_mu_) = 0;  // SettlePause objects alive
  std::thread settler_ GUARDED_BY(settle_mu_);
  // One settle at a time, by the settler or a caller of Settle().
  Mutex settle_one_mu_;
  // Writers waiting to settle a snapshot themselves: the settler gives up.
  std::atomic<int> settle_takeovers_{0};
  std::atomic<uint64_t> settled_snapshots_{0};  // see settled_snapshots()
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_STORE_IMPL_H_
