// LockTogether: locks the CUDA processes of one job (the ranks of a data- or
// tensor-parallel run, one process per GPU) as one unit, before CRIU
// freezes any of them.
//
// Why: the driver's lock waits for the process's GPU work in flight. A rank
// whose in-flight work is a collective (NCCL all-reduce) finishes it only
// while its peers still run and take part. CRIU's cuda_plugin locks the
// processes of a tree one after another and freezes each right after its
// lock, so a later rank can wait forever on a peer already frozen (the lock
// times out and the checkpoint fails). Locking them all at once, and when
// one of them cannot be locked in time, unlocking the others so the job can
// reach a point where none has work in flight, and trying again, gets every
// rank locked with nothing in flight; the plugin then sees them locked,
// checkpoints them and leaves them locked for the caller to unlock.
//
// Thread-safety: LockTogether may run concurrently for disjoint sets of
// processes; it starts one short-lived thread per process.
#ifndef GPUCKPT_CORE_GPU_GROUP_LOCK_H_
#define GPUCKPT_CORE_GPU_GROUP_LOCK_H_

#include <vector>

#include "core/gpu/cuda_driver.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

struct GroupLockOptions {
  // The whole budget: past it every process is left running (unlocked).
  unsigned timeout_ms = 10000;
  // The first attempt's lock timeout; each failed attempt doubles it (a
  // long kernel gets its time), bounded by what is left of timeout_ms.
  unsigned first_attempt_ms = 500;
  // The pause between attempts, in which the unlocked ranks catch up.
  unsigned backoff_ms = 20;
};

// Locks every process of `pids` (CUDA processes in the "running" state)
// together. On success all are locked. kAborted when they could not be
// locked together within the timeout ("processes A, B: CUDA not locked
// together within N ms ..."); another error (a process exited, the driver
// failed) as it is; on any failure none of `pids` is left locked by this
// call. The caller unlocks them after use (CudaDriver::Unlock, or
// GpuBackend::Release).
Status LockTogether(const CudaDriver& cuda, const std::vector<int>& pids,
                    const GroupLockOptions& options);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_GROUP_LOCK_H_
