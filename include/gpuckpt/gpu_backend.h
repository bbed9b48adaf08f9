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
#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

struct GpuDevice {
  std::string name;
  std::string uuid;
  uint64_t memory_bytes = 0;
};

// What a backend knows of one process's GPU use.
struct GpuProcessState {
  // "none" for a process without GPU state; otherwise the driver's word:
  // "running", "locked", "checkpointed", "failed".
  std::string state = "none";
  std::vector<GpuDevice> gpus;
  uint64_t device_memory_bytes = 0;
};

// How CRIU must be run for the processes of one checkpoint or restore.
struct CriuGpuSetup {
  // Directory CRIU loads plugins from (--libdir). Empty: a directory with
  // no plugin, so a process without a GPU is dumped exactly as plain CRIU
  // would, and no plugin can fail it.
  std::string plugin_dir;
  // Directories put first on CRIU's PATH (where the plugins find the
  // cuda-checkpoint command).
  std::vector<std::string> path_prepend;
  // Extra environment for CRIU, "NAME=value".
  std::vector<std::string> environment;
};

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;

  // "none", "cuda", "rocm".
  virtual std::string name() const = 0;

  // A line for status when the backend cannot work here (no driver), else "".
  virtual std::string unavailable_reason() const = 0;

  // The GPU state of `pid` (kNoSuchProcess when gone). Cheap enough to call
  // for every read of a status file.
  virtual Result<GpuProcessState> Describe(int pid) = 0;

  // How to run CRIU to checkpoint (or restore) the tree of `pids`.
  virtual Result<CriuGpuSetup> SetupFor(const std::vector<int>& pids) = 0;

  // The driver version for the manifest ("" when none).
  virtual std::string driver_version() const = 0;
};

// The backend for processes that use no GPU.
std::unique_ptr<GpuBackend> MakeNoGpuBackend();

}  // namespace gpuckpt

#endif  // GPUCKPT_GPU_BACKEND_H_
