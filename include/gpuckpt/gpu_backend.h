// GpuBackend: what the checkpoint engine asks of a GPU stack, for every
// process it checkpoints or restores. The method is the CRIUgpu one: the
// driver's own checkpoint support quiesces the device and moves its state
// into the process's memory (CUDA) or into image files (AMD), driven by
// CRIU's plugins; the backend says which plugins CRIU loads, what is put
// first on CRIU's PATH (gpuckpt's own cuda-checkpoint), and describes the
// process's GPUs for status and the manifest.
//
// NoGpuBackend (MakeNoGpuBackend()) is the backend for processes without a
// GPU: no plugins, nothing on PATH, no GPUs.
//
// Implementations are safe for concurrent use: several checkpoints of
// different processes may run at once.
#ifndef GPUCKPT_GPU_BACKEND_H_
#define GPUCKPT_GPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// The GPU stacks a process uses, a setup is for, or a checkpoint was made
// with: a set of bits, since one process tree may use both.
enum class GpuStacks : uint8_t { kNone = 0, kCuda = 1, kRocm = 2, kCudaAndRocm = 3 };

constexpr GpuStacks operator|(GpuStacks a, GpuStacks b) {
  return static_cast<GpuStacks>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}
constexpr bool HasCuda(GpuStacks s) { return (static_cast<uint8_t>(s) & 1) != 0; }
constexpr bool HasRocm(GpuStacks s) { return (static_cast<uint8_t>(s) & 2) != 0; }

// "none", "cuda", "rocm", "cuda+rocm": the words of the manifest's
// gpu_backend and of status.
constexpr std::string_view GpuStacksName(GpuStacks s) {
  switch (s) {
    case GpuStacks::kNone:
      return "none";
    case GpuStacks::kCuda:
      return "cuda";
    case GpuStacks::kRocm:
      return "rocm";
    case GpuStacks::kCudaAndRocm:
      return "cuda+rocm";
  }
  return "none";
}

// The inverse of GpuStacksName; nullopt for any other word.
constexpr std::optional<GpuStacks> ParseGpuStacks(std::string_view name) {
  for (GpuStacks s :
       {GpuStacks::kNone, GpuStacks::kCuda, GpuStacks::kRocm, GpuStacks::kCudaAndRocm})
    if (GpuStacksName(s) == name) return s;
  return std::nullopt;
}

// Where a process's GPU context stands. kNone: it has none (no GPU, or a
// process that only opened a device node). The others are the driver's
// states (CUDA's CUprocessState; an AMD process is always kRunning here).
enum class GpuState : uint8_t { kNone, kRunning, kLocked, kCheckpointed, kFailed };

// "none", "running", "locked", "checkpointed", "failed": the words of
// status and of `cuda-checkpoint --get-state`, which CRIU's plugin expects.
constexpr std::string_view GpuStateName(GpuState s) {
  switch (s) {
    case GpuState::kNone:
      return "none";
    case GpuState::kRunning:
      return "running";
    case GpuState::kLocked:
      return "locked";
    case GpuState::kCheckpointed:
      return "checkpointed";
    case GpuState::kFailed:
      return "failed";
  }
  return "failed";
}

struct GpuDevice {
  std::string name;
  std::string uuid;
  uint64_t memory_bytes = 0;
};

// What a backend knows of one process's GPU use.
struct GpuProcessState {
  GpuState state = GpuState::kNone;
  std::vector<GpuDevice> gpus;
  uint64_t device_memory_bytes = 0;
};

// How CRIU must be run for the processes of one checkpoint or restore.
struct CriuGpuSetup {
  // The GPU stacks this setup is for (recorded in the manifest as
  // gpu_backend).
  GpuStacks stacks = GpuStacks::kNone;
  // Directory CRIU loads plugins from (--libdir). Empty: a directory with
  // no plugin, so a process without a GPU is dumped exactly as plain CRIU
  // would, and no plugin can fail it.
  std::string plugin_dir;
  // Directories put first on CRIU's PATH (where the plugins find the
  // cuda-checkpoint command).
  std::vector<std::string> path_prepend;
  // Extra environment for CRIU, "NAME=value" (the plugins' commands inherit it).
  std::vector<std::string> environment;
  // Extra arguments for CRIU (e.g. a --timeout that covers the lock timeout).
  std::vector<std::string> criu_args;
  // Processes SetupForCheckpoint() locked itself, before CRIU runs (the
  // GPU processes of one job, locked together; see core/gpu/group_lock.h).
  // CRIU's plugin leaves them locked: the caller must Release() them once
  // CRIU is done, or when it does not run CRIU after all.
  std::vector<int> locked_pids;
};

struct GpuCheckpointOptions {
  // How long the driver may take to lock the process (wait for its GPU
  // work in flight); past it the checkpoint fails and the process runs on.
  uint32_t lock_timeout_ms = 10000;
  // A directory the backend's helpers may write what they find during the
  // dump into (the CUDA device-memory ranges); read with DeviceRanges().
  std::string scratch_dir;
};

struct GpuRestoreOptions {
  // "OLD_UUID=NEW_UUID,...": restore the checkpoint's GPUs onto others.
  // Empty: onto the same GPUs.
  std::string gpu_map;
  // The GPU stacks the checkpoint was made with; nullopt when unknown
  // (a plain CRIU image directory).
  std::optional<GpuStacks> checkpoint_stacks;
  // The UUIDs of the GPUs the checkpoint used, where known.
  std::vector<std::string> checkpoint_gpus;
};

// Device memory that the driver moved into a process's host memory at the
// checkpoint step: the range [start, end) of process `pid`.
struct DeviceRange {
  int pid = 0;
  uint64_t start = 0;
  uint64_t end = 0;
};

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;

  // The GPU stacks this backend can checkpoint here.
  virtual GpuStacks stacks() const = 0;

  // A line for status when the backend cannot work here (no driver), else "".
  virtual std::string unavailable_reason() const = 0;

  // The GPU state of `pid` (kNoSuchProcess when gone). Cheap enough to call
  // for every read of a status file.
  virtual Result<GpuProcessState> Describe(int pid) = 0;

  // How to run CRIU to checkpoint the tree of `pids`: no plugin for a tree
  // without GPU processes; kUnavailable when the tree uses a GPU whose
  // driver or plugin is missing here (a dump would lose the device state).
  // A tree with several CUDA processes has them locked together here
  // (CriuGpuSetup::locked_pids); kAborted when they could not be locked
  // within options.lock_timeout_ms (they are left running).
  virtual Result<CriuGpuSetup> SetupForCheckpoint(const std::vector<int>& pids,
                                                  const GpuCheckpointOptions& options) = 0;

  // What the helpers found during a successful dump run with `options`.
  virtual Result<std::vector<DeviceRange>> DeviceRanges(const GpuCheckpointOptions& options) = 0;

  // When the helpers locked the first GPU process and unlocked the last one
  // during a dump run with `options`, on CLOCK_MONOTONIC in nanoseconds
  // (the job's GPU work stood still in between). Absent where nothing was
  // recorded (no GPU, or locks the backend took itself: the caller times
  // those). Default: nothing recorded.
  struct LockSpan {
    std::optional<int64_t> first_lock_ns;
    std::optional<int64_t> last_unlock_ns;
    // A helper could not lock a process within the lock timeout (GPU work
    // in flight): the dump failed, and the process was left running.
    bool lock_timed_out = false;
  };
  virtual LockSpan LockTimes(const GpuCheckpointOptions& options) {
    (void)options;
    return {};
  }

  // How to run CRIU to restore; kInvalidArgument for a bad gpu_map,
  // kUnavailable when the checkpoint needs a GPU stack missing here.
  virtual Result<CriuGpuSetup> SetupForRestore(const GpuRestoreOptions& options) = 0;

  // Brings the GPU processes of `pids` that a failed or abandoned
  // checkpoint left locked or checkpointed back to running (best effort;
  // the first error is returned after trying all).
  virtual Status Release(const std::vector<int>& pids) = 0;

  // The driver version for the manifest ("" when none).
  virtual std::string driver_version() const = 0;
};

// The backend for processes that use no GPU.
std::unique_ptr<GpuBackend> MakeNoGpuBackend();

}  // namespace gpuckpt

#endif  // GPUCKPT_GPU_BACKEND_H_
