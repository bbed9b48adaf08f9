// Whether a checkpoint fits in host memory and on the store's disk, decided
// before anything of the process is locked or frozen, so that a checkpoint
// that could not fit is refused at once with the process untouched, rather
// than left to the OOM killer or to fill the disk half-way.
//
// Host memory: the GPU driver moves a process's device memory into its host
// memory at the checkpoint step (charged to that process's memory cgroup),
// and the snapshot writer faults in staging memory for the images (charged
// to gpuckptfs's cgroup). Store: at worst every byte of the tree's memory
// and device memory is new and incompressible.
//
// The decisions are pure functions over figures the engine gathers
// (EngineImpl::CheckRoomForCheckpoint, in checkpoint_resources.cc, reads them
// from /proc, the cgroups, the GPU backend and the store).
//
// Thread-safety: free functions over values, safe to call concurrently.
#ifndef GPUCKPT_CORE_ENGINE_CHECKPOINT_RESOURCES_H_
#define GPUCKPT_CORE_ENGINE_CHECKPOINT_RESOURCES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/proc/memory_headroom.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// Memory a checkpoint makes one process take, charged to its memory cgroup.
struct MemoryCharge {
  int pid = 0;  // the process charged; 0 for gpuckptfs itself
  uint64_t bytes = 0;
  CgroupLimits cgroup;  // the limited levels of that process's memory cgroup
};

// What a checkpoint of the tree of `pid` will take of host memory.
struct CheckpointMemoryNeed {
  int pid = 0;
  // Per GPU process of the tree, its device memory, which the driver moves
  // into that process's host memory.
  std::vector<MemoryCharge> device_memory;
  // The staging memory the writer faults in before CRIU starts (pid 0).
  MemoryCharge staging;
  // The host's MemAvailable; nullopt when unknown (then not checked).
  std::optional<uint64_t> host_available_bytes;
};

// The staging a checkpoint's writer faults in: what the image is expected
// to take (the tree's memory and the device memory moved into it), capped
// at the daemon's staging memory (SnapshotWriterOptions::prefault_bytes).
uint64_t StagingPrefaultBytes(uint64_t tree_rss_bytes, uint64_t device_memory_bytes,
                              uint64_t staging_capacity_bytes);

// OK when `need` fits; else kNoMemory saying what is needed, what is
// available and what to do. Refused when the host's MemAvailable is below
// all device memory plus the staging, or when a cgroup level (of a GPU
// process, of gpuckptfs, or one they share, e.g. a container's) would be
// charged more than its headroom (limit less what it holds): the device
// memory of the GPU processes below it plus, if gpuckptfs is below it, the
// staging.
Status CheckCheckpointMemory(const CheckpointMemoryNeed& need);

// What a checkpoint of `memory_bytes` (the tree's memory and device memory)
// may add to the store at worst: all of it, stored raw, with the store's
// records of it (see the margin in checkpoint_resources.cc).
uint64_t WorstCaseStoreBytes(uint64_t memory_bytes);

// OK when WorstCaseStoreBytes(memory_bytes) fits in `free_bytes` (what new
// snapshots may still take on the store's disk, Store::FreeBytes()); else
// kNoSpace saying so.
Status CheckStoreSpace(int pid, uint64_t memory_bytes, uint64_t free_bytes);

// "34.4 GB", "268.4 MB": decimal units, as the status lines use.
std::string BytesForPeople(uint64_t bytes);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_CHECKPOINT_RESOURCES_H_
