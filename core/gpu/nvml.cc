#include "core/gpu/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>

namespace gpuckpt {
namespace {

// From NVML's C ABI (nvml.h of CUDA 12/13, NVML_API_VERSION 12).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
// nvmlProcessInfo_t (= nvmlProcessInfo_v2_t), taken by the _v3 query.
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  const char* (*error_string)(nvmlReturn_t);
  nvmlReturn_t (*count)(unsigned int*);
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*);
  nvmlReturn_t (*driver_version)(char*, unsigned int);  // optional

  std::string Error(const char* call, nvmlReturn_t r) const {
    return fmt::format("NVML {}: {}", call, error_string ? error_string(r) : std::to_string(r));
  }
};

Result<std::unique_ptr<Nvml>> Nvml::Load() {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return Status::Unavailable(std::string("no NVIDIA management library: ") +
                               (err ? err : "libnvidia-ml.so.1 not found"));
  }
  auto api = std::make_unique<Api>();
  bool missing = false;
  std::string missing_name;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr && !missing) {
      missing = true;
      missing_name = name;
    }
  };
  sym(api->init, "nvmlInit_v2");
  sym(api->shutdown, "nvmlShutdown");
  sym(api->error_string, "nvmlErrorString");
  sym(api->count, "nvmlDeviceGetCount_v2");
  sym(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  sym(api->name, "nvmlDeviceGetName");
  sym(api->uuid, "nvmlDeviceGetUUID");
  sym(api->memory, "nvmlDeviceGetMemoryInfo");
  sym(api->processes, "nvmlDeviceGetComputeRunningProcesses_v3");
  // Optional: only the manifest's driver version string comes from it.
  api->driver_version = reinterpret_cast<nvmlReturn_t (*)(char*, unsigned int)>(
      dlsym(handle, "nvmlSystemGetDriverVersion"));
  if (missing) {
    dlclose(handle);
    return Status::Unavailable("libnvidia-ml.so.1 lacks " + missing_name + " (driver too old)");
  }
  if (nvmlReturn_t r = api->init(); r != kNvmlSuccess) {
    Status s = Status::Unavailable(api->Error("nvmlInit_v2", r));
    dlclose(handle);
    return s;
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

Result<std::vector<NvmlGpu>> Nvml::Gpus() const {
  unsigned int count = 0;
  if (nvmlReturn_t r = api_->count(&count); r != kNvmlSuccess)
    return Status::IOError(api_->Error("nvmlDeviceGetCount_v2", r));
  std::vector<NvmlGpu> gpus;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t r = api_->handle_by_index(i, &dev); r != kNvmlSuccess)
      return Status::IOError(api_->Error("nvmlDeviceGetHandleByIndex_v2", r));
    NvmlGpu gpu;
    gpu.index = i;
    char buf[256] = {};
    if (api_->name(dev, buf, sizeof(buf) - 1) == kNvmlSuccess) gpu.name = buf;
    char uuid[128] = {};
    if (api_->uuid(dev, uuid, sizeof(uuid) - 1) == kNvmlSuccess) gpu.uuid = uuid;
    nvmlMemory_t mem{};
    if (api_->memory(dev, &mem) == kNvmlSuccess) gpu.memory_total_bytes = mem.total;
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

std::string Nvml::DriverVersion() const {
  char buf[96] = {};
  if (api_->driver_version == nullptr || api_->driver_version(buf, sizeof(buf) - 1) != kNvmlSuccess)
    return "";
  return buf;
}

Result<std::vector<NvmlProcessMemory>> Nvml::ComputeProcesses() const {
  unsigned int count = 0;
  if (nvmlReturn_t r = api_->count(&count); r != kNvmlSuccess)
    return Status::IOError(api_->Error("nvmlDeviceGetCount_v2", r));
  std::vector<NvmlProcessMemory> out;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t r = api_->handle_by_index(i, &dev); r != kNvmlSuccess)
      return Status::IOError(api_->Error("nvmlDeviceGetHandleByIndex_v2", r));
    // The list can grow between the two calls: retry with more room.
    std::vector<nvmlProcessInfo_t> infos(64);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned int n = static_cast<unsigned int>(infos.size());
      nvmlReturn_t r = api_->processes(dev, &n, infos.data());
      if (r == kNvmlInsufficientSize) {
        infos.resize(std::max<size_t>(n + 16, infos.size() * 2));
        continue;
      }
      if (r != kNvmlSuccess)
        return Status::IOError(api_->Error("nvmlDeviceGetComputeRunningProcesses_v3", r));
      for (unsigned int k = 0; k < n && k < infos.size(); ++k) {
        // NVML reports NVML_VALUE_NOT_AVAILABLE (all ones) where it cannot
        // tell (e.g. under some virtualisation): shown as 0.
        const uint64_t used = infos[k].usedGpuMemory == ~0ULL ? 0 : infos[k].usedGpuMemory;
        out.push_back({i, static_cast<int>(infos[k].pid), used});
      }
      break;
    }
  }
  return out;
}

}  // namespace gpuckpt
