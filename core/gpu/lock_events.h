// Lock events: when the GPU driver locked and unlocked each CUDA process of
// a checkpoint, so that the engine can report how long the job's GPU work
// stood still (from the first lock to the last unlock).
//
// gpuckpt's cuda-checkpoint, run by CRIU's cuda_plugin, records each lock
// and unlock it did as a file in the checkpoint's scratch directory
// (GPUCKPT_DEVICE_RANGES_DIR):
//   gpu-lock-<pid>, gpu-unlock-<pid>: "<CLOCK_MONOTONIC nanoseconds>\n"
//   gpu-lock-timeout-<pid>: the same, for a lock the driver could not take
//   within the lock timeout (the process was left running)
// written through a temporary file and rename(2). CLOCK_MONOTONIC is one
// clock for every process of the machine.
//
// The files are as untrusted as their directory (a user's CRIU may write
// it): read without following links, bounded, and only numbers are taken.
//
// Thread-safety: free functions; reentrant.
#ifndef GPUCKPT_CORE_GPU_LOCK_EVENTS_H_
#define GPUCKPT_CORE_GPU_LOCK_EVENTS_H_

#include <cstdint>
#include <string>

#include "core/base/mono_clock.h"
#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

enum class LockEvent { kLock, kUnlock, kLockTimedOut };

// Records `event` of process `pid` at the present time in `dir`.
Status RecordLockEvent(const std::string& dir, LockEvent event, int pid);

// The earliest lock and the latest unlock recorded in `dir` (each absent
// when none was), in MonotonicNowNs() time, and whether a lock timed out.
// Files that are not well-formed are ignored.
GpuBackend::LockSpan ReadLockSpan(const std::string& dir);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_LOCK_EVENTS_H_
