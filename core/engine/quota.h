// QuotaLedger: each user's share of the store (EngineOptions::user_quota_bytes),
// charged by what their checkpoints hold and by what their operations in
// flight could add.
//
// What an owner's checkpoints hold is the stored size of the distinct
// chunks they name (Store::HeldBytes), however the chunks got there: a
// second import of the same bytes adds nothing new, but removing the first
// leaves the second charged for all of them. Every checkpoint or import
// reserves its worst case (all its bytes new) against its owner before it
// reads or freezes anything and keeps it until it is stored and the store's
// change is noted, so operations running side by side see each other's
// reservations and cannot together go beyond the quota. The owner is whose
// checkpoint it becomes (root's checkpoint of a user's job, root's import of
// a user's copy are that user's); only a request by an ordinary user is
// refused, root's are counted but never limited.
//
// Thread-safe. Borrows the Store and the catalog (which says which
// checkpoints an owner holds), which must outlive it.
#ifndef GPUCKPT_CORE_ENGINE_QUOTA_H_
#define GPUCKPT_CORE_ENGINE_QUOTA_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/base/mutex.h"
#include "core/engine/checkpoint_catalog.h"
#include "core/proc/caller.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class QuotaLedger {
 public:
  // `limit_bytes` 0: no quota (reservations are then free and never refused).
  QuotaLedger(Store* store, CheckpointCatalog* catalog, uint64_t limit_bytes)
      : store_(store), catalog_(catalog), limit_(limit_bytes) {}

  // Bytes reserved for one operation in flight; given back when destroyed.
  class Reservation {
   public:
    Reservation(QuotaLedger* ledger, uint32_t owner, uint64_t bytes)
        : ledger_(ledger), owner_(owner), bytes_(bytes) {}
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    uint64_t bytes() const { return bytes_; }

   private:
    QuotaLedger* ledger_;
    uint32_t owner_;
    uint64_t bytes_;
  };

  // Reserves `worst_case_bytes` for an operation of `requester` that stores
  // a checkpoint of `owner_uid`. kNoSpace (saying what holds the quota, and
  // naming `what`) when an ordinary user's request could take the owner
  // beyond the quota with what their checkpoints hold and every reservation
  // in flight.
  Result<std::unique_ptr<Reservation>> Reserve(const Caller& requester, uint32_t owner_uid,
                                               uint64_t worst_case_bytes, const std::string& what)
      EXCLUDES(mu_);
  // What `owner_uid` may still add with nothing else in flight: the quota
  // less what their checkpoints hold and the reservations in flight; the
  // most a reservation of theirs could be. UINT64_MAX without a quota.
  Result<uint64_t> Remaining(uint32_t owner_uid) EXCLUDES(mu_);
  // Once an operation stored its checkpoint: kNoSpace when an ordinary
  // user's request took the owner beyond the quota after all (the
  // operation then removes what it stored).
  Status CheckHeld(const Caller& requester, uint32_t owner_uid, const std::string& what)
      EXCLUDES(mu_);
  // The store changed (a checkpoint stored or removed): held bytes are
  // measured again. Call it before an operation's reservation goes.
  void NoteStoreChanged() { epoch_.fetch_add(1, std::memory_order_acq_rel); }

  uint64_t limit() const { return limit_; }

 private:
  void Release(uint32_t owner, uint64_t bytes) EXCLUDES(mu_);
  // What `owner`'s checkpoints hold now, measured again only after the
  // store changed or settled a snapshot (a spooled file is charged its
  // whole size until then). *epoch: the store's change count it was
  // measured at.
  Result<uint64_t> Held(uint32_t owner, uint64_t* epoch) EXCLUDES(mu_);
  Status Refusal(uint32_t owner, uint64_t held, uint64_t reserved, uint64_t worst_case,
                 const std::string& what) const;

  Store* const store_;
  CheckpointCatalog* const catalog_;
  const uint64_t limit_;
  std::atomic<uint64_t> epoch_{0};
  struct Measured {
    uint64_t epoch = 0;
    uint64_t settled = 0;  // Store::settled_snapshots() then
    uint64_t bytes = 0;
  };
  Mutex mu_;
  std::map<uint32_t, uint64_t> reserved_ GUARDED_BY(mu_);  // by owner
  std::map<uint32_t, Measured> held_ GUARDED_BY(mu_);      // by owner
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_QUOTA_H_
