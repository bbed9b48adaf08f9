// PoolLink: a local store's link to its shared RADOS pool (StoreOptions::pool;
// core/store/FORMAT.md, "The shared pool"). It moves snapshots both ways:
// Push() publishes one of the store's snapshots in the pool (the chunks the
// pool lacks, then its body, then its catalog entry, so that a snapshot is
// in the pool exactly when its catalog entry is), Pull() fetches one of the
// pool's into the store (its body and the chunks the store lacks). Names
// are reserved pool-wide before a snapshot is written, so that two
// machines never publish two snapshots under one name.
//
// Thread-safe: any number of pushes, pulls and lookups may run at once;
// counters are atomic. Borrows the StoreDb it was opened with, which must
// outlive it; the LocalStore given to Push() and Pull() likewise.
#ifndef GPUCKPT_CORE_POOLED_POOL_LINK_H_
#define GPUCKPT_CORE_POOLED_POOL_LINK_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/base/mutex.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/pool/pool_format.h"
#include "core/pool/pool_gc.h"
#include "core/pool/rados_pool.h"
#include "core/store/store_db.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class LocalStore;

class PoolLink {
 public:
  // Connects to the pool and gives the store the pool's fingerprint seed
  // (the pool takes the store's when it has none yet). A store holding
  // snapshots made under another seed cannot join: kInvalidArgument.
  // `store_has_snapshots`: whether it holds any. `read_only`: the store is
  // open read-only (Store::Open's read_only): the pool is only listed, and
  // its seed must be the store's already.
  static Result<std::unique_ptr<PoolLink>> Open(const PoolOptions& options, StoreDb* db,
                                                bool store_has_snapshots, bool read_only);
  ~PoolLink();

  const PoolOptions& options() const { return options_; }

  // Reserves `id` pool-wide for a snapshot about to be written:
  // kAlreadyExists when the pool has a snapshot of that name or another
  // store is writing one.
  Status ReserveName(const std::string& id);
  // Gives up a reservation of ours whose snapshot was not published.
  void ReleaseName(const std::string& id);

  // Publishes `info` (its records under info.key in `store`, committed and
  // durable there) in the pool under the name this link reserved; returns
  // its incarnation. Nothing of it is visible in the pool unless it
  // succeeds.
  Result<uint64_t> Push(LocalStore* store, const SnapshotInfo& info);

  // The pool's published snapshots: id -> catalog entry, and the ids whose
  // entries do not decode (damaged, or of a newer format): those are in the
  // pool, but cannot be listed.
  struct CatalogListing {
    std::map<std::string, pool::CatalogEntry> entries;
    std::set<std::string> unreadable;
  };
  Result<CatalogListing> Catalog();
  // One entry; nullopt when the pool has no snapshot `id`.
  Result<std::optional<pool::CatalogEntry>> CatalogEntryOf(const std::string& id);
  // The snapshot an entry describes, as the store lists it (pool_only).
  static Result<SnapshotInfo> InfoOf(const std::string& id, const pool::CatalogEntry& entry);

  // Fetches snapshot `id`, as `entry` describes it, into `store` under
  // snapshot key `key`: its file and extent records and every chunk the
  // store lacks, all durable when it returns. The caller publishes the
  // returned manifest.
  Result<SnapshotInfo> Pull(LocalStore* store, const std::string& id,
                            const pool::CatalogEntry& entry, uint64_t key);

  // Removes `id` from the pool if its incarnation there is `incarnation`
  // (a later snapshot of the same name is left alone): the catalog entry
  // first, then its body and reservation. OK when it is not there.
  Status Remove(const std::string& id, uint64_t incarnation);

  // One run of the pool's collector (pool_gc.h) with the grace of the
  // options; collected = false when another store's collector runs.
  Result<pool::CollectReport> Collect();

  // Whether an operation timed out in the last seconds (and none
  // succeeded since): listings then leave the pool out at once.
  bool KnownUnreachable() const;
  // Called (from whichever thread saw it) when the pool answers again after
  // it timed out: the background pusher retries at once. Set before use.
  void SetOnReachable(std::function<void()> on_reachable) {
    on_reachable_ = std::move(on_reachable);
  }

  PoolStats stats() const;
  void CountPushFailure(const Status& error);
  void CountPullFailure(const Status& error);
  void set_pending(uint64_t pending) { pending_ = pending; }

 private:
  PoolLink(PoolOptions options, std::unique_ptr<RadosPool> rados, StoreDb* db);
  struct Counters {
    std::atomic<uint64_t> pushes{0}, push_failures{0}, pulls{0}, pull_failures{0};
    std::atomic<uint64_t> uploaded_chunks{0}, uploaded_bytes{0}, reused_chunks{0};
    std::atomic<uint64_t> fetched_chunks{0}, fetched_bytes{0};
  };
  class Upload;  // pool_upload.cc
  class Fetch;   // pool_fetch.cc
  // Keys per omap operation: large enough that a lookup of a snapshot's
  // chunks is few round trips, small enough to stay far below the OSD's
  // message limits (64 KiB of keys).
  static constexpr size_t kKeysPerOmapOp = 2048;
  // Pack and body objects in flight at once.
  static constexpr unsigned kObjectsInFlight = 4;
  // Random, never 0: pack writers' names and incarnations.
  static uint64_t RandomNonZero64();
  // The index entries the pool holds for `hashes` (absent ones are missing).
  using IndexEntries = std::unordered_map<ChunkHash, pool::IndexEntry, ChunkHashHasher>;
  Result<IndexEntries> LookUpIndex(const std::vector<ChunkHash>& hashes);
  // Where each chunk of a fetched snapshot is in this store: its sequence
  // number, by name.
  using ChunkSeqs = std::unordered_map<ChunkHash, uint64_t, ChunkHashHasher>;
  // Steps of Pull(): the chunks `files` name, fetched where this store
  // lacks them; then their file and extent records under `key`.
  Result<ChunkSeqs> StoreChunksOf(LocalStore* store, const std::vector<pool::BodyFile>& files,
                                  const ChunkDomainKey* domain);
  Status WriteFetchedRecords(SnapshotCatalog* catalog, const std::string& id,
                             const std::vector<pool::BodyFile>& files, const ChunkSeqs& seqs,
                             uint64_t key);
  struct ChunkTally {
    uint64_t uploaded_chunks = 0, uploaded_bytes = 0, reused_chunks = 0;
  };
  // Steps of Push(): looks the snapshot's distinct chunks (`order`; where
  // each lies here, `chunks`) up in the pool, takes back those condemned,
  // and sends those missing.
  Result<ChunkTally> EnsureChunksInPool(
      LocalStore* store, const std::vector<ChunkHash>& order,
      const std::unordered_map<ChunkHash, std::pair<uint64_t, uint64_t>, ChunkHashHasher>& chunks);
  // OK when the name's reservation is still ours (made again if a
  // collector swept it); kAlreadyExists when another store has it now.
  Status ConfirmReservation(const std::string& id);

  // Notes whether the pool answered: a timeout marks it unreachable for a
  // while (logged once), a success reachable again. Returns `s`.
  Status Observe(Status s);
  // `s` in words a user can act on: a full pool, an unreachable one.
  Status Explain(const Status& s) const;
  Result<CatalogListing> ReadCatalog();
  Result<uint64_t> PushOnce(LocalStore* store, const SnapshotInfo& info);
  // The reservation object's contents for this link: who holds the name.
  std::string ReservationText() const;
  Status WriteBody(const std::string& id, uint64_t incarnation, const std::string& body);
  Result<std::string> ReadBody(const std::string& id, const pool::CatalogEntry& entry);

  PoolOptions options_;
  std::unique_ptr<RadosPool> rados_;
  StoreDb* db_;
  // Names this link's pack objects: random per link, so that two stores
  // (or two runs of one) never write the same pack object.
  const uint64_t writer_;
  std::atomic<uint64_t> next_pack_{0};
  Counters counters_;
  std::atomic<uint64_t> pending_{0};
  std::function<void()> on_reachable_;
  // Monotonic ns until which the pool counts as unreachable; 0: reachable.
  std::atomic<int64_t> unreachable_until_ns_{0};
  mutable Mutex error_mu_;
  std::string last_error_ GUARDED_BY(error_mu_);
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_POOLED_POOL_LINK_H_
