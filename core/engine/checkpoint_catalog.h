// CheckpointCatalog: what the engine asks of every checkpoint in the store
// (whose it is, which process's, who made it, in which order), kept in
// memory so that a checkpoint, an import or a quota check does not read and
// decode every snapshot's manifest again (Store::List()).
//
// Loaded with one List() when the engine is created (Prime), then kept
// current by the engine: Add() when it publishes a snapshot (a
// checkpoint's or an import's commit), Remove() when it or the mount
// removes one (Engine::NoteRemoved). A load that failed is tried again at the next
// query, which then returns its error (as the List() it replaces did).
//
// The shared pool: with one (Store::pool_stats() set), other machines
// publish and remove snapshots this catalog never hears of, and List()
// merges the pool's catalog with this store's (dropping copies the pool no
// longer has). There every query loads the catalog again from List(), as
// the engine did before it kept one: the store has no cheap way to tell
// that the pool's catalog changed, and a pool's List() reads that catalog
// anyway, so this is the simplest rule that stays right. A store without a pool changes only
// through this daemon, which holds it: there no query reads the store.
//
// Thread-safe: queries, changes and loads may overlap; a change made while
// a load reads the store is applied again over what that load found.
// Borrows the Store, which must outlive it.
#ifndef GPUCKPT_CORE_ENGINE_CHECKPOINT_CATALOG_H_
#define GPUCKPT_CORE_ENGINE_CHECKPOINT_CATALOG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/base/mutex.h"
#include "core/engine/engine.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class CheckpointCatalog {
 public:
  explicit CheckpointCatalog(Store* store);

  // Reads every snapshot of the store (one List()) in place of what the
  // catalog held.
  Status Load() EXCLUDES(mu_);
  // Load() when the engine is created, but not with a pool, whose every
  // query loads anyway (and whose List() may wait on a pool that cannot be
  // reached). A failed load is tried again at the first query.
  Status Prime() EXCLUDES(mu_) { return follows_pool_ ? Status::Ok() : Load(); }
  // A snapshot the engine published.
  void Add(const SnapshotInfo& info) EXCLUDES(mu_);
  // A snapshot removed from the store; unknown ids are ignored. With `key`,
  // only the snapshot of that key: one made again under the id since is
  // kept.
  void Remove(const std::string& id, std::optional<uint64_t> key = std::nullopt) EXCLUDES(mu_);

  // The newest checkpoint listed under <pid>/checkpoints for the process
  // `pid` owned by `owner_uid` (IsCheckpointOfProcess); nullopt if none.
  Result<std::optional<std::string>> LatestOfProcess(int pid, uint32_t owner_uid) EXCLUDES(mu_);
  // Those checkpoints, oldest first. `owner_uid` nullopt: the owner of the
  // newest checkpoint gpuckpt itself dumped of `pid` (the process that last
  // had the pid); none when there is no such checkpoint.
  Result<std::vector<std::string>> CheckpointsOfProcess(int pid, std::optional<uint32_t> owner_uid)
      EXCLUDES(mu_);
  // The highest N of the ids "<pid>-<N>"; 0 when there is none.
  Result<uint64_t> HighestNumber(int pid) EXCLUDES(mu_);
  // The ids of the checkpoints `owner_uid` owns (OwnerOf), in no order.
  Result<std::vector<std::string>> HeldBy(uint32_t owner_uid) EXCLUDES(mu_);
  // The checkpoints gpuckpt itself dumped of a tree whose root was `pid`,
  // made by `maker_uid` (MakerOf), oldest first.
  Result<std::vector<std::string>> OwnDumpsOf(int pid, uint32_t maker_uid) EXCLUDES(mu_);

 private:
  // What is kept of one snapshot: its manifest decoded once.
  struct Entry {
    std::string id;
    uint64_t key = 0;
    SnapshotOwner owner;
    uint32_t maker_uid = 0;
    bool own_dump = false;
    uint64_t order = 0;  // List()'s order (Insert)
  };
  // A change made while a load was reading the store.
  struct Change {
    std::string id;
    std::optional<Entry> added;  // nullopt: removed
    std::optional<uint64_t> removed_key;
  };
  static Entry EntryOf(const SnapshotInfo& info);
  // Loads again where a pool may have changed, or where no load succeeded.
  Status Refresh() EXCLUDES(mu_);
  void Apply(const Change& change) REQUIRES(mu_);
  void Insert(Entry entry) REQUIRES(mu_);
  void Erase(const std::string& id) REQUIRES(mu_);
  void Clear() REQUIRES(mu_);

  Store* const store_;
  const bool follows_pool_;
  Mutex mu_;
  bool loaded_ GUARDED_BY(mu_) = false;
  uint64_t next_order_ GUARDED_BY(mu_) = 0;
  std::map<std::string, Entry> entries_ GUARDED_BY(mu_);  // by id
  // Of the checkpoints that count for (pid, owner uid): order -> id.
  std::map<std::pair<int, uint32_t>, std::map<uint64_t, std::string>> of_process_ GUARDED_BY(mu_);
  // Of gpuckpt's own dumps, by the pid of their tree's root: order -> id.
  std::map<int, std::map<uint64_t, std::string>> own_dumps_ GUARDED_BY(mu_);
  std::map<uint32_t, std::set<std::string>> by_owner_ GUARDED_BY(mu_);
  // The N of "<P>-<N>" ids, by P as written.
  std::map<std::string, std::set<uint64_t>> numbers_ GUARDED_BY(mu_);
  int loads_in_flight_ GUARDED_BY(mu_) = 0;
  std::vector<Change> changes_ GUARDED_BY(mu_);  // kept while a load is in flight
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_CHECKPOINT_CATALOG_H_
