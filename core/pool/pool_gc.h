// The shared pool's garbage collection: mark and sweep in two phases with
// a grace period between them, one collector at a time, and writers that
// take back a chunk marked for deletion (core/store/FORMAT.md, "The shared
// pool", "Collection").
//
// A run (Collect()) takes the collector's lock (a RADOS lock on
// gpuckpt.gc, with a lease, so a collector that dies lets it go), reads
// which chunks the published snapshots name, then:
//   - sweeps, when the previous run marked at least `grace` ago: removes
//     every index entry still marked by it and named by no snapshot, the
//     pack objects no entry points into, and reservations and bodies of
//     snapshots never published; all older than `grace`;
//   - marks, when no mark is pending: every index entry no snapshot names
//     gets the run's number (its epoch) in `condemned_by`.
// Every removal of an entry compares it with what was read, so an entry a
// writer took back (its mark cleared) or rewrote meanwhile stays.
//
// Writers keep their side through WriterGrace(): a push whose lookups are
// older than half the grace when it publishes looks its chunks up again.
//
// Thread-safe (no state of its own); borrows the RadosPool.
#ifndef GPUCKPT_CORE_POOL_POOL_GC_H_
#define GPUCKPT_CORE_POOL_POOL_GC_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "core/pool/rados_pool.h"
#include "gpuckpt/status.h"

namespace gpuckpt::pool {

struct CollectOptions {
  // How long a mark stands before its sweep, and how old an unreferenced
  // object must be before it goes: longer than any push takes (a push
  // older than half of it checks its chunks again before it publishes).
  std::chrono::seconds grace{3600};
  // How long the collector's lock holds without being renewed; it is
  // renewed between the steps of a run.
  std::chrono::seconds lease{600};
};

struct CollectReport {
  bool collected = false;  // false: another collector holds the lock
  uint64_t snapshots = 0;  // published snapshots read
  uint64_t live_chunks = 0;
  uint64_t marked_chunks = 0;  // condemned by this run's mark
  bool swept = false;          // whether this run swept
  uint64_t swept_chunks = 0;   // index entries removed
  uint64_t swept_objects = 0;  // pack objects, bodies and reservations removed
  uint64_t swept_bytes = 0;    // their size
  // Seconds until the next sweep is due (after a mark: the grace).
  uint64_t sweep_due_in_s = 0;
};

// One collection run; see above. kBusy is never returned: a run that finds
// the lock held reports collected = false.
Result<CollectReport> Collect(RadosPool* rados, const CollectOptions& options);

// The grace the pool's collector works with (its last run's), for writers;
// an hour when no collector ran yet.
Result<std::chrono::seconds> WriterGrace(RadosPool* rados);

}  // namespace gpuckpt::pool

#endif  // GPUCKPT_CORE_POOL_POOL_GC_H_
