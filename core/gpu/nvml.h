// Nvml: the few NVIDIA Management Library queries that status and the
// manifest need — each GPU's name, UUID and memory, and the device memory
// each process holds on it — with libnvidia-ml.so.1 opened by dlopen, so
// that gpuckpt runs where no NVIDIA driver is installed.
//
// NVML has no header in the CUDA toolkit here; the handful of prototypes
// used are declared in nvml.cc from NVML's stable C ABI (versioned entry
// points: nvmlInit_v2, ..._v2, ComputeRunningProcesses_v3).
//
// Thread-safe: NVML's calls are; the object is immutable after Load().
#ifndef GPUCKPT_CORE_GPU_NVML_H_
#define GPUCKPT_CORE_GPU_NVML_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

struct NvmlGpu {
  unsigned index = 0;
  std::string name;
  std::string uuid;  // "GPU-..."
  uint64_t memory_total_bytes = 0;
};

// Device memory used by one process on one GPU.
struct NvmlProcessMemory {
  unsigned gpu_index = 0;
  int pid = 0;
  uint64_t used_bytes = 0;
};

class Nvml {
 public:
  // Opens libnvidia-ml.so.1 and initialises NVML; kUnavailable when the
  // library or a needed entry point is missing.
  static Result<std::unique_ptr<Nvml>> Load();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  Result<std::vector<NvmlGpu>> Gpus() const;
  // The kernel driver's version, e.g. "580.159.04"; "" if NVML cannot say.
  std::string DriverVersion() const;
  // The compute processes on every GPU, with their device memory.
  Result<std::vector<NvmlProcessMemory>> ComputeProcesses() const;

 private:
  struct Api;
  Nvml(void* handle, std::unique_ptr<Api> api);
  void* handle_;
  std::unique_ptr<Api> api_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_GPU_NVML_H_
