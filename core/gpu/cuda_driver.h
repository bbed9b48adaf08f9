// CudaDriver: the CUDA driver API (libcuda.so.1) opened at run time, reduced
// to what checkpointing needs: the devices, and the per-process checkpoint
// calls (cuCheckpointProcess*, driver >= 570 / CUDA 12.8) that lock a
// process's CUDA calls, move its GPU memory into host memory and back, and
// unlock it.
//
// gpuckpt is built with cuda.h alone and links no CUDA library: where no
// NVIDIA driver is installed, Load() says so and the GPU features are off.
// $GPUCKPT_LIBCUDA, when set, names the library to open instead of
// libcuda.so.1; the tests use it for a stand-in driver.
//
// Errors: every message names the pid, the driver call and the CUDA error
// (name and text), e.g. "pid 42: cuCheckpointProcessLock: CUDA_ERROR_...".
// Codes:
//   kNoSuchProcess    the process is gone
//   kInvalidArgument  CUDA_ERROR_INVALID_VALUE for a live process (it has no
//                     CUDA state, or not yet), a bad device map, or a call in
//                     the wrong state (ILLEGAL_STATE) other than lock
//   kBusy             lock timed out, or lock in the wrong state (the process
//                     is already locked or checkpointed: someone holds it)
//   kUnavailable      no driver, too old a driver, NOT_SUPPORTED
//   kNoSpace          out of device or host memory (OUT_OF_MEMORY)
//   kPermissionDenied NOT_PERMITTED
//   kIOError          any other driver failure
//
// Thread-safety: after Load() a CudaDriver is immutable; all const methods
// may be called concurrently (the driver's own calls are thread-safe).
// The library stays loaded for the life of the process (see ~CudaDriver()).
#ifndef GPUCKPT_CORE_GPU_CUDA_DRIVER_H_
#define GPUCKPT_CORE_GPU_CUDA_DRIVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/gpu/gpu_uuid.h"
#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// CUprocessState.
enum class CudaProcessState { kRunning, kLocked, kCheckpointed, kFailed };

// The backend-neutral state (gpuckpt/gpu_backend.h) of a CUDA state.
GpuState GpuStateOf(CudaProcessState state);

// "running", "locked", "checkpointed", "failed": the words CRIU's
// cuda_plugin expects from `cuda-checkpoint --get-state`.
inline std::string_view CudaProcessStateName(CudaProcessState state) {
  return GpuStateName(GpuStateOf(state));
}

struct CudaDevice {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (FormatGpuUuid)
  uint64_t total_memory_bytes = 0;
};

class CudaDriver {
 public:
  // Opens libcuda.so.1 (or $GPUCKPT_LIBCUDA), resolves every call used
  // here and calls cuInit(0). kUnavailable with a sentence when there is
  // no driver ("no NVIDIA driver: libcuda.so.1: cannot open shared object
  // file: ..."), when the library lacks the checkpoint API (driver too old)
  // or when cuInit fails.
  static Result<std::unique_ptr<CudaDriver>> Load();

  // Leaves the library loaded: libcuda starts threads in cuInit and is not
  // safe to unload.
  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // cuDriverGetVersion: 1000 * major + 10 * minor, e.g. 13000.
  int version() const;
  // "13.0".
  std::string version_string() const;

  // Every device the driver shows this process, by ordinal.
  Result<std::vector<CudaDevice>> Devices() const;

  // The CUDA state of `pid`; kInvalidArgument when it has no CUDA state.
  Result<CudaProcessState> GetState(int pid) const;

  // The thread of `pid` that the driver uses to checkpoint and restore it
  // (CRIU lets it run while the rest of the process is frozen).
  Result<int> GetRestoreThreadId(int pid) const;

  // running -> locked: further CUDA calls of the process block. Waits at
  // most `timeout_ms` for work in flight (0: no limit); on timeout kAborted
  // "pid P: CUDA not locked within N ms; the process is left running" (a
  // process another checkpoint holds locked is kBusy).
  Status Lock(int pid, unsigned timeout_ms) const;

  // locked -> checkpointed: GPU memory moved into the process's host memory,
  // GPU resources released.
  Status Checkpoint(int pid) const;

  // checkpointed -> locked, onto the GPUs of `gpu_map` (each old GPU of the
  // process onto its new one; the map must then name every GPU the process
  // used). Empty: the same GPUs.
  Status Restore(int pid, const std::vector<GpuUuidPair>& gpu_map) const;

  // locked -> running.
  Status Unlock(int pid) const;

 private:
  struct Api;  // the resolved entry points
  CudaDriver(std::unique_ptr<const Api> api, int version);

  // The status for `result` (not CUDA_SUCCESS) of `call` on `pid`; `needs`
  // is the state the call needs, named when the driver says ILLEGAL_STATE.
  Status Error(int result, int pid, std::string_view call,
               std::optional<CudaProcessState> needs = std::nullopt) const;

  const std::unique_ptr<const Api> api_;
  const int version_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_CUDA_DRIVER_H_
