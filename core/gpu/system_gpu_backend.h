// The GpuBackend of a real machine: CUDA through the driver's checkpoint
// API and CRIU's cuda_plugin (with gpuckpt's own cuda-checkpoint first on
// CRIU's PATH), ROCm through CRIU's amdgpu_plugin; whichever of the two is
// present. Processes are told apart by the device files they hold:
// /dev/nvidia* for CUDA, /dev/kfd for ROCm; a tree with neither is dumped
// with no plugin at all, exactly as before.
//
// Where no NVIDIA driver is installed the CUDA side is off and says why
// (unavailable_reason()); a checkpoint of a process that uses an NVIDIA GPU
// then fails with that reason instead of losing its device state.
//
// Thread-safe: every method may be called concurrently; the driver handles
// are loaded once, in MakeSystemGpuBackend().
#ifndef GPUCKPT_CORE_GPU_SYSTEM_GPU_BACKEND_H_
#define GPUCKPT_CORE_GPU_SYSTEM_GPU_BACKEND_H_

#include <memory>
#include <string>

#include "gpuckpt/gpu_backend.h"

namespace gpuckpt {

struct SystemGpuBackendOptions {
  // Where CRIU's plugins are (cuda_plugin.so, amdgpu_plugin.so).
  // Default: /usr/local/lib/criu.
  std::string criu_plugin_dir = "/usr/local/lib/criu";
  // The directory holding gpuckpt's cuda-checkpoint, put first on CRIU's
  // PATH (never installed on the system PATH).
  std::string cuda_checkpoint_dir;
  // A root-owned directory where per-stack plugin directories are made
  // (CRIU loads every plugin in --libdir; each stack gets only its own).
  // Default: /run/gpuckpt.
  std::string work_dir = "/run/gpuckpt";
  // Where sysfs is mounted (the KFD topology); tests use a fabricated tree.
  // Default: /sys.
  std::string sysfs_root = "/sys";
};

std::unique_ptr<GpuBackend> MakeSystemGpuBackend(const SystemGpuBackendOptions& options);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_SYSTEM_GPU_BACKEND_H_
