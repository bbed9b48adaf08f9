// LocalStore: the Store on this machine's disk, and what a layer over it
// needs beyond the Store API. A layer (the shared pool's PooledStore,
// core/pooled) is itself a Store: it answers what it can from the local
// store, adds what it has, and takes part in each snapshot the local store
// makes through the PublicationListener it sets. The local store knows
// nothing of what the layer is.
//
// Thread-safety: as Store. SetPublicationListener() alone must be called
// before any snapshot is begun, and again (with null) only once no writer
// is left.
#ifndef GPUCKPT_CORE_SNAPSHOT_LOCAL_STORE_H_
#define GPUCKPT_CORE_SNAPSHOT_LOCAL_STORE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "core/base/mutex.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class ChunkStore;
class SnapshotCatalog;
class StoreDb;
struct StoreEnv;

// What must take part in each snapshot a LocalStore makes (its writers'
// and imports' alike). Called from the threads of those who make them;
// must be thread-safe.
class PublicationListener {
 public:
  virtual ~PublicationListener() = default;
  // `name` is reserved in the local store for a snapshot about to be
  // written: reserve it wherever else it must be unique. An error gives
  // the name up (kAlreadyExists: an automatic name moves on to the next).
  virtual Status ReserveName(const std::string& name) = 0;
  // A name given to ReserveName() whose snapshot will not be published (or
  // was removed before the layer had taken it over): give it up.
  virtual void AbandonName(const std::string& name) = 0;
  // Snapshot `info` is committed and durable in the local store, and not
  // yet published there: an error fails the commit (nothing of it is
  // visible). May set info->pool_incarnation. Its files are all chunked:
  // a store with a listener never spools.
  virtual Status BeforePublish(SnapshotInfo* info) = 0;
  // Snapshot `info` is published in the local store.
  virtual void AfterPublish(const SnapshotInfo& info) = 0;
};

// The keys of the live SnapshotPins, a multiset. Shared by the store and
// its pins, so that a pin destroyed after its store (which the API forbids,
// but a destructor should survive) finds it still there.
struct PinRegistry {
  Mutex mu;  // after StoreImpl's gc_mu_ and names_mu_
  std::multiset<uint64_t> keys GUARDED_BY(mu);
};

// Keeps snapshot `key` readable while it lives: Remove() leaves a pinned
// snapshot's records in place and Gc() keeps them and their chunks.
// Move-only.
class SnapshotPin {
 public:
  SnapshotPin() = default;
  SnapshotPin(SnapshotPin&& other) noexcept = default;
  SnapshotPin& operator=(SnapshotPin&& other) noexcept;
  SnapshotPin(const SnapshotPin&) = delete;
  SnapshotPin& operator=(const SnapshotPin&) = delete;
  ~SnapshotPin() { Release(); }

 private:
  friend class StoreImpl;
  SnapshotPin(std::shared_ptr<PinRegistry> registry, uint64_t key)
      : registry_(std::move(registry)), key_(key) {}
  void Release();

  std::shared_ptr<PinRegistry> registry_;  // null: pins nothing
  uint64_t key_ = 0;
};

class LocalStore : public Store {
 public:
  // Store::Open() of this disk alone: StoreOptions::pool is the layer's
  // business and is ignored. The store's file I/O goes through `env` (see
  // core/store/store_env.h): how tests watch what a store makes durable.
  // A read-only store ignores `env`.
  static Result<std::unique_ptr<LocalStore>> Open(const std::string& dir,
                                                  const StoreOptions& options, const StoreEnv& env);

  // Borrowed; null: none. See the class comment for when.
  virtual void SetPublicationListener(PublicationListener* listener) = 0;

  // For a layer that brings in snapshots written elsewhere (the pool's
  // fetch), under names and keys of this store:
  // A new snapshot key, durable, never handed out again.
  virtual Result<uint64_t> AllocateSnapshotKey() = 0;
  // Reserves `name` here alone (the listener is not asked): kAlreadyExists
  // when a writer holds it or a snapshot has it.
  virtual Status ReserveLocalName(const std::string& name) = 0;
  // Gives a ReserveLocalName() up (the listener is not told).
  virtual void ReleaseLocalName(const std::string& name) = 0;
  // Publishes `info`, whose records are durable under info.key, under the
  // name the caller reserved. Fails if a snapshot of that name exists.
  virtual Status Publish(const SnapshotInfo& info) = 0;
  // Held while records and chunks no published snapshot names yet are
  // written: Gc() waits for it.
  virtual SharedMutexHold LockAgainstGc() = 0;
  // Snapshot `id` and a pin that keeps it readable, even if it is removed
  // meanwhile. kNotFound when there is no such snapshot.
  virtual Result<std::pair<SnapshotInfo, SnapshotPin>> PinSnapshot(const std::string& id) = 0;
  // Writes snapshot `id` again with `incarnation` as its pool_incarnation,
  // if it is still the one of snapshot key `key`; kNotFound when it was
  // removed (or replaced) meanwhile.
  virtual Status RecordPoolIncarnation(const std::string& id, uint64_t key,
                                       uint64_t incarnation) = 0;

  // The tables beneath, for a layer that moves records and chunks itself.
  virtual StoreDb* db() const = 0;
  virtual SnapshotCatalog& catalog() const = 0;
  virtual ChunkStore& chunks() const = 0;
  virtual const StoreOptions& options() const = 0;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_LOCAL_STORE_H_
