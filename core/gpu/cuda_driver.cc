#include "core/gpu/cuda_driver.h"

#include <cuda.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace gpuckpt {

namespace {

// The entry points, resolved once by Load(); the types come from the
// prototypes in cuda.h, so a mismatch with the header fails the build.
struct CudaApi {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceGetUuid_v2) device_get_uuid = nullptr;  // or cuDeviceGetUuid
  decltype(&::cuDeviceTotalMem_v2) device_total_mem = nullptr;
  decltype(&::cuCheckpointProcessLock) lock = nullptr;
  decltype(&::cuCheckpointProcessCheckpoint) checkpoint = nullptr;
  decltype(&::cuCheckpointProcessRestore) restore = nullptr;
  decltype(&::cuCheckpointProcessUnlock) unlock = nullptr;
  decltype(&::cuCheckpointProcessGetState) get_state = nullptr;
  decltype(&::cuCheckpointProcessGetRestoreThreadId) get_restore_tid = nullptr;
};

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return *fn != nullptr;
}

// "CUDA_ERROR_TIMEOUT: the launch timed out and was terminated".
std::string DescribeCudaError(const CudaApi& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name(r, &name) != CUDA_SUCCESS || name == nullptr) {
    return fmt::format("CUDA error {}", static_cast<int>(r));
  }
  if (api.get_error_string(r, &text) != CUDA_SUCCESS || text == nullptr) return name;
  return fmt::format("{}: {}", name, text);
}

Result<CudaProcessState> StateFromCuda(CUprocessState s) {
  switch (s) {
    case CU_PROCESS_STATE_RUNNING:
      return CudaProcessState::kRunning;
    case CU_PROCESS_STATE_LOCKED:
      return CudaProcessState::kLocked;
    case CU_PROCESS_STATE_CHECKPOINTED:
      return CudaProcessState::kCheckpointed;
    case CU_PROCESS_STATE_FAILED:
      return CudaProcessState::kFailed;
  }
  return Status::IOError(fmt::format("unknown CUDA process state {}", static_cast<int>(s)));
}

Status CheckPid(int pid) {
  // pid 0 and negative pids mean process groups to kill(2), and nothing to
  // the driver.
  if (pid <= 0) return Status::InvalidArgument(fmt::format("pid {}: not a process id", pid));
  return Status::Ok();
}

}  // namespace

GpuState GpuStateOf(CudaProcessState state) {
  switch (state) {
    case CudaProcessState::kRunning:
      return GpuState::kRunning;
    case CudaProcessState::kLocked:
      return GpuState::kLocked;
    case CudaProcessState::kCheckpointed:
      return GpuState::kCheckpointed;
    case CudaProcessState::kFailed:
      return GpuState::kFailed;
  }
  return GpuState::kFailed;
}

struct CudaDriver::Api : CudaApi {};

Result<std::unique_ptr<CudaDriver>> CudaDriver::Load() {
  const char* env = std::getenv("GPUCKPT_LIBCUDA");
  const char* file = env != nullptr && env[0] != '\0' ? env : "libcuda.so.1";
  void* lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    return Status::Unavailable(fmt::format("no NVIDIA driver: {}", err != nullptr ? err : file));
  }
  // Until cuInit has run, the library has started nothing and may be
  // unloaded again; after, it stays (see ~CudaDriver()).
  auto unload = [lib](Status s) {
    dlclose(lib);
    return s;
  };
  auto api = std::make_unique<Api>();
  const char* missing = nullptr;
  auto need = [&](const char* name, auto* fn) {
    if (missing == nullptr && !Resolve(lib, name, fn)) missing = name;
  };
  need("cuInit", &api->init);
  need("cuDriverGetVersion", &api->driver_get_version);
  need("cuGetErrorName", &api->get_error_name);
  need("cuGetErrorString", &api->get_error_string);
  need("cuDeviceGetCount", &api->device_get_count);
  need("cuDeviceGet", &api->device_get);
  need("cuDeviceGetName", &api->device_get_name);
  need("cuDeviceTotalMem_v2", &api->device_total_mem);
  // cuDeviceGetUuid_v2 came with CUDA 11.4; the older call has the same
  // signature and differs only for MIG instances.
  if (!Resolve(lib, "cuDeviceGetUuid_v2", &api->device_get_uuid)) {
    need("cuDeviceGetUuid", &api->device_get_uuid);
  }
  if (missing != nullptr) {
    return unload(Status::Unavailable(
        fmt::format("no NVIDIA driver: {} lacks {}, so it is not a CUDA driver", file, missing)));
  }
  int version = 0;
  if (CUresult r = api->driver_get_version(&version); r != CUDA_SUCCESS) {
    return unload(Status::Unavailable(
        fmt::format("NVIDIA driver: cuDriverGetVersion: {}", DescribeCudaError(*api, r))));
  }
  need("cuCheckpointProcessLock", &api->lock);
  need("cuCheckpointProcessCheckpoint", &api->checkpoint);
  need("cuCheckpointProcessRestore", &api->restore);
  need("cuCheckpointProcessUnlock", &api->unlock);
  need("cuCheckpointProcessGetState", &api->get_state);
  need("cuCheckpointProcessGetRestoreThreadId", &api->get_restore_tid);
  if (missing != nullptr) {
    return unload(Status::Unavailable(fmt::format(
        "NVIDIA driver too old: CUDA {}.{} has no checkpoint API ({}); it needs driver >= 570 "
        "(CUDA 12.8)",
        version / 1000, version % 1000 / 10, missing)));
  }
  if (CUresult r = api->init(0); r != CUDA_SUCCESS) {
    return Status::Unavailable(
        fmt::format("NVIDIA driver: cuInit: {}", DescribeCudaError(*api, r)));
  }
  return std::unique_ptr<CudaDriver>(new CudaDriver(std::move(api), version));
}

CudaDriver::CudaDriver(std::unique_ptr<const Api> api, int version)
    : api_(std::move(api)), version_(version) {}

// No dlclose(): the threads libcuda started in cuInit would run on in
// unmapped code. A later Load() gets the same handle back from dlopen().
CudaDriver::~CudaDriver() = default;

int CudaDriver::version() const { return version_; }

std::string CudaDriver::version_string() const {
  return fmt::format("{}.{}", version_ / 1000, version_ % 1000 / 10);
}

Result<std::vector<CudaDevice>> CudaDriver::Devices() const {
  auto fail = [&](std::string_view call, CUresult r) {
    return Status::IOError(fmt::format("{}: {}", call, DescribeCudaError(*api_, r)));
  };
  int count = 0;
  if (CUresult r = api_->device_get_count(&count); r != CUDA_SUCCESS) {
    return fail("cuDeviceGetCount", r);
  }
  std::vector<CudaDevice> devices;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if (CUresult r = api_->device_get(&dev, i); r != CUDA_SUCCESS) {
      return fail(fmt::format("cuDeviceGet({})", i), r);
    }
    CudaDevice d;
    d.ordinal = i;
    char name[256] = {};
    if (CUresult r = api_->device_get_name(name, sizeof(name) - 1, dev); r != CUDA_SUCCESS) {
      return fail(fmt::format("cuDeviceGetName({})", i), r);
    }
    d.name = name;
    CUuuid uuid{};
    if (CUresult r = api_->device_get_uuid(&uuid, dev); r != CUDA_SUCCESS) {
      return fail(fmt::format("cuDeviceGetUuid({})", i), r);
    }
    GpuUuid bytes;
    std::memcpy(bytes.data(), uuid.bytes, bytes.size());
    d.uuid = FormatGpuUuid(bytes);
    size_t total = 0;
    if (CUresult r = api_->device_total_mem(&total, dev); r != CUDA_SUCCESS) {
      return fail(fmt::format("cuDeviceTotalMem({})", i), r);
    }
    d.total_memory_bytes = total;
    devices.push_back(std::move(d));
  }
  return devices;
}

Status CudaDriver::Error(int result, int pid, std::string_view call,
                         std::optional<CudaProcessState> needs) const {
  const CUresult r = static_cast<CUresult>(result);
  std::string what = fmt::format("pid {}: {}: {}", pid, call, DescribeCudaError(*api_, r));
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE:
      // What the driver says both for a pid that is gone and for one that
      // has no CUDA state: tell them apart.
      if (kill(pid, 0) != 0 && errno == ESRCH) {
        return Status::NoSuchProcess(fmt::format("pid {}: no such process ({})", pid, what));
      }
      return Status::InvalidArgument(std::move(what));
    case CUDA_ERROR_ILLEGAL_STATE: {
      // Say which state it is in and which the call needs: that is what the
      // reader has to know, so it comes before the CUDA error.
      CUprocessState s{};
      std::string state = "in an unknown state";
      if (api_->get_state(pid, &s) == CUDA_SUCCESS) {
        Result<CudaProcessState> st = StateFromCuda(s);
        if (st.ok()) state = std::string(CudaProcessStateName(st.value()));
      }
      std::string m = fmt::format("pid {}: {}: CUDA is {}, needs {}: {}", pid, call, state,
                                  needs ? CudaProcessStateName(*needs) : "another state",
                                  DescribeCudaError(*api_, r));
      // A lock that finds the process locked or checkpointed meets another
      // checkpoint holding it; the other calls were simply called out of turn.
      if (needs == CudaProcessState::kRunning) return Status::Busy(std::move(m));
      return Status::InvalidArgument(std::move(m));
    }
    case CUDA_ERROR_TIMEOUT:
    case CUDA_ERROR_NOT_READY:
      return Status::Busy(std::move(what));
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return Status::Unavailable(std::move(what));
    case CUDA_ERROR_INVALID_DEVICE:
      return Status::InvalidArgument(std::move(what));
    case CUDA_ERROR_OUT_OF_MEMORY:
      return Status::NoSpace(std::move(what));
    case CUDA_ERROR_NOT_PERMITTED:
      return Status::PermissionDenied(std::move(what));
    default:
      return Status::IOError(std::move(what));
  }
}

Result<CudaProcessState> CudaDriver::GetState(int pid) const {
  GPUCKPT_RETURN_IF_ERROR(CheckPid(pid));
  CUprocessState s{};
  if (CUresult r = api_->get_state(pid, &s); r != CUDA_SUCCESS) {
    return Error(r, pid, "cuCheckpointProcessGetState");
  }
  Result<CudaProcessState> state = StateFromCuda(s);
  if (!state.ok()) return state.status().WithContext(fmt::format("pid {}", pid));
  return state;
}

Result<int> CudaDriver::GetRestoreThreadId(int pid) const {
  GPUCKPT_RETURN_IF_ERROR(CheckPid(pid));
  int tid = 0;
  if (CUresult r = api_->get_restore_tid(pid, &tid); r != CUDA_SUCCESS) {
    return Error(r, pid, "cuCheckpointProcessGetRestoreThreadId");
  }
  if (tid <= 0) {
    return Status::IOError(
        fmt::format("pid {}: cuCheckpointProcessGetRestoreThreadId: returned tid {}", pid, tid));
  }
  return tid;
}

Status CudaDriver::Lock(int pid, unsigned timeout_ms) const {
  GPUCKPT_RETURN_IF_ERROR(CheckPid(pid));
  CUcheckpointLockArgs args{};  // reserved fields must be zero
  args.timeoutMs = timeout_ms;
  CUresult r = api_->lock(pid, &args);
  if (r == CUDA_SUCCESS) return Status::Ok();
  if ((r == CUDA_ERROR_TIMEOUT || r == CUDA_ERROR_NOT_READY) && timeout_ms > 0) {
    // The driver leaves the process running on timeout; say so first, since
    // CRIU keeps only the first 127 bytes of what cuda-checkpoint prints.
    return Status::Aborted(
        fmt::format("pid {}: CUDA not locked within {} ms; the process is left running "
                    "(cuCheckpointProcessLock: {})",
                    pid, timeout_ms, DescribeCudaError(*api_, r)));
  }
  return Error(r, pid, "cuCheckpointProcessLock", CudaProcessState::kRunning);
}

Status CudaDriver::Checkpoint(int pid) const {
  GPUCKPT_RETURN_IF_ERROR(CheckPid(pid));
  CUcheckpointCheckpointArgs args{};
  if (CUresult r = api_->checkpoint(pid, &args); r != CUDA_SUCCESS) {
    return Error(r, pid, "cuCheckpointProcessCheckpoint", CudaProcessState::kLocked);
  }
  return Status::Ok();
}

Status CudaDriver::Restore(int pid, const std::vector<GpuUuidPair>& gpu_map) const {
  GPUCKPT_RETURN_IF_ERROR(CheckPid(pid));
  std::vector<CUcheckpointGpuPair> pairs(gpu_map.size());
  for (size_t i = 0; i < gpu_map.size(); ++i) {
    std::memcpy(pairs[i].oldUuid.bytes, gpu_map[i].old_uuid.data(), sizeof(pairs[i].oldUuid.bytes));
    std::memcpy(pairs[i].newUuid.bytes, gpu_map[i].new_uuid.data(), sizeof(pairs[i].newUuid.bytes));
  }
  CUcheckpointRestoreArgs args{};
  if (!pairs.empty()) {
    args.gpuPairs = pairs.data();
    args.gpuPairsCount = static_cast<unsigned>(pairs.size());
  }
  if (CUresult r = api_->restore(pid, &args); r != CUDA_SUCCESS) {
    Status s = Error(r, pid, "cuCheckpointProcessRestore", CudaProcessState::kCheckpointed);
    if (!gpu_map.empty() && s.code() == StatusCode::kInvalidArgument) {
      // A map that lacks one of the process's GPUs, or names a GPU that is
      // not here, is the likely cause.
      return Status(s.code(), s.message() + " (GPU map " + FormatGpuMap(gpu_map) + ")");
    }
    return s;
  }
  return Status::Ok();
}

Status CudaDriver::Unlock(int pid) const {
  GPUCKPT_RETURN_IF_ERROR(CheckPid(pid));
  CUcheckpointUnlockArgs args{};
  if (CUresult r = api_->unlock(pid, &args); r != CUDA_SUCCESS) {
    return Error(r, pid, "cuCheckpointProcessUnlock", CudaProcessState::kLocked);
  }
  return Status::Ok();
}

}  // namespace gpuckpt
