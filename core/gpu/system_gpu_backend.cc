// MakeSystemGpuBackend(): CUDA and ROCm behind one GpuBackend.
//
// CRIU's cuda_plugin does the CUDA steps by running `cuda-checkpoint`; the
// environment given to CRIU reaches gpuckpt's own command (tools/
// cuda-checkpoint) and carries what gpuckptfs decides per operation: the
// lock timeout (GPUCKPT_LOCK_TIMEOUT_MS, which wins over the --timeout the
// plugin derives from CRIU's own), where to record the device-memory ranges
// (GPUCKPT_DEVICE_RANGES_DIR) and the GPU remapping of a restore
// (GPUCKPT_GPU_MAP).
#include "core/gpu/system_gpu_backend.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "core/gpu/cuda_driver.h"
#include "core/gpu/device_ranges.h"
#include "core/gpu/gpu_uuid.h"
#include "core/gpu/group_lock.h"
#include "core/gpu/kfd_topology.h"
#include "core/gpu/lock_events.h"
#include "core/gpu/nvml.h"
#include "core/proc/process_info.h"

namespace gpuckpt {
namespace {

constexpr char kCudaPlugin[] = "cuda_plugin.so";
constexpr char kAmdPlugin[] = "amdgpu_plugin.so";

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

// A directory holding links to exactly `plugins` (CRIU loads every *.so in
// its --libdir). Made anew at start-up, readable by the users whose CRIU
// runs unprivileged.
Result<std::string> MakePluginDir(const std::string& work_dir, const std::string& name,
                                  const std::string& criu_plugin_dir,
                                  const std::vector<std::string>& plugins) {
  if (mkdir(work_dir.c_str(), 0711) != 0 && errno != EEXIST)
    return StatusFromErrno(errno, "creating " + work_dir);
  const std::string dir = work_dir + "/" + name;
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return StatusFromErrno(errno, "creating " + dir);
  chmod(dir.c_str(), 0755);
  for (const auto& plugin : plugins) {
    const std::string target = criu_plugin_dir + "/" + plugin;
    if (!Exists(target))
      return Status::Unavailable("CRIU's " + plugin + " is not in " + criu_plugin_dir);
    const std::string link = dir + "/" + plugin;
    unlink(link.c_str());
    if (symlink(target.c_str(), link.c_str()) != 0)
      return StatusFromErrno(errno, "linking " + link);
  }
  return dir;
}

struct TreeUse {
  std::vector<int> cuda, rocm;
};

TreeUse GpuUseOf(const std::vector<int>& pids) {
  TreeUse use;
  for (int pid : pids) {
    auto p = ReadProcess(pid);
    if (!p.ok()) continue;
    bool nvidia = false, kfd = false;
    for (const auto& d : p->gpu_devices) {
      if (d.rfind("/dev/nvidia", 0) == 0) nvidia = true;
      if (d.rfind("/dev/kfd", 0) == 0) kfd = true;
    }
    if (nvidia) use.cuda.push_back(pid);
    if (kfd) use.rocm.push_back(pid);
  }
  return use;
}

class SystemGpuBackend final : public GpuBackend {
 public:
  explicit SystemGpuBackend(const SystemGpuBackendOptions& options) : options_(options) {
    auto cuda = CudaDriver::Load();
    if (cuda.ok()) {
      cuda_ = std::move(cuda).value();
      if (auto nvml = Nvml::Load(); nvml.ok()) {
        nvml_ = std::move(nvml).value();
        // Names, UUIDs and sizes do not change while the daemon runs: read
        // once, not on every read of a status file.
        if (auto gpus = nvml_->Gpus(); gpus.ok()) nvml_gpus_ = std::move(gpus).value();
      }
      if (options_.cuda_checkpoint_dir.empty() ||
          !Exists(options_.cuda_checkpoint_dir + "/cuda-checkpoint")) {
        cuda_reason_ = "gpuckpt's cuda-checkpoint is not in '" + options_.cuda_checkpoint_dir + "'";
      } else if (auto dir = MakePluginDir(options_.work_dir, "plugins-cuda",
                                          options_.criu_plugin_dir, {kCudaPlugin});
                 dir.ok()) {
        cuda_plugin_dir_ = *dir;
      } else {
        cuda_reason_ = dir.status().message();
      }
    } else {
      cuda_reason_ = cuda.status().message();
    }
    auto kfd = ReadKfdTopology(options_.sysfs_root);
    if (kfd.ok() && !kfd->empty()) {
      amd_gpus_ = std::move(kfd).value();
      if (auto dir = MakePluginDir(options_.work_dir, "plugins-rocm", options_.criu_plugin_dir,
                                   {kAmdPlugin});
          dir.ok()) {
        rocm_plugin_dir_ = *dir;
      } else {
        rocm_reason_ = dir.status().message();
      }
    } else {
      rocm_reason_ = kfd.ok() ? "no AMD GPU in the KFD topology" : kfd.status().message();
    }
    if (!cuda_plugin_dir_.empty() && !rocm_plugin_dir_.empty()) {
      if (auto dir = MakePluginDir(options_.work_dir, "plugins-all", options_.criu_plugin_dir,
                                   {kCudaPlugin, kAmdPlugin});
          dir.ok())
        both_plugin_dir_ = *dir;
    }
  }

  GpuStacks stacks() const override {
    return (cuda_ready() ? GpuStacks::kCuda : GpuStacks::kNone) |
           (rocm_ready() ? GpuStacks::kRocm : GpuStacks::kNone);
  }

  std::string unavailable_reason() const override {
    if (cuda_ready() || rocm_ready()) return "";
    return "CUDA: " + cuda_reason_ + "; ROCm: " + rocm_reason_;
  }

  // "580.159.04 (CUDA 13.0)": the kernel driver's version where NVML
  // tells it, and the CUDA version of the driver API.
  std::string driver_version() const override {
    if (!cuda_) return "";
    const std::string cuda = "CUDA " + cuda_->version_string();
    const std::string kernel = nvml_ ? nvml_->DriverVersion() : "";
    return kernel.empty() ? cuda : kernel + " (" + cuda + ")";
  }

  Result<GpuProcessState> Describe(int pid) override {
    GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo p, ReadProcess(pid));
    GpuProcessState out;
    bool nvidia = false, kfd = false;
    for (const auto& d : p.gpu_devices) {
      if (d.rfind("/dev/nvidia", 0) == 0) nvidia = true;
      if (d.rfind("/dev/kfd", 0) == 0) kfd = true;
    }
    if (nvidia && cuda_) {
      // A process that only opened the control device (nvidia-smi, a
      // library probing) has no CUDA state: the driver says so with an
      // error, shown as "none".
      if (auto state = cuda_->GetState(pid); state.ok()) out.state = GpuStateOf(*state);
      if (nvml_) {
        if (auto used = nvml_->ComputeProcesses(); used.ok()) {
          for (const auto& u : *used) {
            if (u.pid != pid || u.gpu_index >= nvml_gpus_.size()) continue;
            const NvmlGpu& g = nvml_gpus_[u.gpu_index];
            out.gpus.push_back({g.name, g.uuid, g.memory_total_bytes});
            out.device_memory_bytes += u.used_bytes;
          }
        }
      }
    }
    if (kfd) {
      if (out.state == GpuState::kNone) out.state = GpuState::kRunning;
      for (const auto& g : amd_gpus_)
        out.gpus.push_back({KfdGpuDisplayName(g), g.uuid, g.vram_bytes});
    }
    return out;
  }

  Result<CriuGpuSetup> SetupForCheckpoint(const std::vector<int>& pids,
                                          const GpuCheckpointOptions& options) override {
    const TreeUse use = GpuUseOf(pids);
    CriuGpuSetup setup;
    if (use.cuda.empty() && use.rocm.empty()) return setup;
    if (!use.cuda.empty() && !cuda_ready())
      return Status::Unavailable(fmt::format(
          "process {} uses an NVIDIA GPU, but its state cannot be checkpointed here: {}",
          use.cuda[0], cuda_reason_));
    if (!use.rocm.empty() && !rocm_ready())
      return Status::Unavailable(fmt::format(
          "process {} uses an AMD GPU (/dev/kfd), but its state cannot be checkpointed here: {}",
          use.rocm[0], rocm_reason_));
    if (!use.cuda.empty()) {
      setup.path_prepend.push_back(options_.cuda_checkpoint_dir);
      setup.environment.push_back("GPUCKPT_LOCK_TIMEOUT_MS=" +
                                  std::to_string(options.lock_timeout_ms));
      if (!options.scratch_dir.empty())
        setup.environment.push_back("GPUCKPT_DEVICE_RANGES_DIR=" + options.scratch_dir);
      // CRIU's own --timeout (seconds, default 10) bounds its freezing and
      // the plugin's wait; it must outlast the lock timeout.
      const uint32_t seconds = std::max<uint32_t>(10, options.lock_timeout_ms / 1000 + 10);
      setup.criu_args = {"--timeout", std::to_string(seconds)};
    }
    setup.plugin_dir = PluginDirFor(!use.cuda.empty(), !use.rocm.empty());
    setup.stacks = (use.cuda.empty() ? GpuStacks::kNone : GpuStacks::kCuda) |
                   (use.rocm.empty() ? GpuStacks::kNone : GpuStacks::kRocm);
    // Several CUDA processes are one job (ranks exchanging data): locked
    // together now, not one by one by the plugin (group_lock.h says why).
    std::vector<int> running;
    for (int pid : use.cuda) {
      auto state = cuda_->GetState(pid);
      if (state.ok() && *state == CudaProcessState::kRunning) running.push_back(pid);
    }
    if (running.size() >= 2) {
      GroupLockOptions lock;
      lock.timeout_ms = options.lock_timeout_ms;
      GPUCKPT_RETURN_IF_ERROR(LockTogether(*cuda_, running, lock));
      setup.locked_pids = std::move(running);
    }
    return setup;
  }

  Result<std::vector<DeviceRange>> DeviceRanges(const GpuCheckpointOptions& options) override {
    std::vector<DeviceRange> out;
    if (options.scratch_dir.empty()) return out;
    DIR* dir = opendir(options.scratch_dir.c_str());
    if (dir == nullptr) {
      if (errno == ENOENT) return out;
      return StatusFromErrno(errno, options.scratch_dir);
    }
    std::vector<std::string> names;
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (name.rfind("cuda-ranges-", 0) == 0 && name.size() > 5 &&
          name.compare(name.size() - 5, 5, ".json") == 0)
        names.push_back(name);
    }
    closedir(dir);
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      GPUCKPT_ASSIGN_OR_RETURN(auto ranges, ReadDeviceRangesFile(options.scratch_dir + "/" + name));
      for (const auto& m : ranges.ranges) out.push_back({ranges.pid, m.start, m.end});
    }
    return out;
  }

  LockSpan LockTimes(const GpuCheckpointOptions& options) override {
    if (options.scratch_dir.empty()) return {};
    return ReadLockSpan(options.scratch_dir);
  }

  Result<CriuGpuSetup> SetupForRestore(const GpuRestoreOptions& options) override {
    const bool unknown = !options.checkpoint_stacks;
    const bool wants_cuda = !unknown && HasCuda(*options.checkpoint_stacks);
    const bool wants_rocm = !unknown && HasRocm(*options.checkpoint_stacks);
    if (wants_cuda && !cuda_ready())
      return Status::Unavailable(
          "the checkpoint holds CUDA state, which cannot be restored here: " + cuda_reason_);
    if (wants_rocm && !rocm_ready())
      return Status::Unavailable(
          "the checkpoint holds ROCm state, which cannot be restored here: " + rocm_reason_);
    CriuGpuSetup setup;
    const bool cuda = wants_cuda || (unknown && cuda_ready());
    const bool rocm = wants_rocm || (unknown && rocm_ready());
    if (!options.gpu_map.empty()) {
      if (!cuda) return Status::InvalidArgument("--gpu-map: the checkpoint uses no CUDA GPU");
      GPUCKPT_ASSIGN_OR_RETURN(std::string map, CompleteGpuMap(options));
      setup.environment.push_back("GPUCKPT_GPU_MAP=" + map);
    }
    if (cuda) setup.path_prepend.push_back(options_.cuda_checkpoint_dir);
    if (cuda || rocm) setup.plugin_dir = PluginDirFor(cuda, rocm);
    setup.stacks =
        (cuda ? GpuStacks::kCuda : GpuStacks::kNone) | (rocm ? GpuStacks::kRocm : GpuStacks::kNone);
    return setup;
  }

  Status Release(const std::vector<int>& pids) override {
    if (!cuda_) return Status::Ok();
    Status first;
    for (int pid : pids) {
      auto state = cuda_->GetState(pid);
      if (!state.ok()) continue;  // no CUDA in it, or gone
      Status s;
      if (*state == CudaProcessState::kCheckpointed) {
        s = cuda_->Restore(pid, {});
        if (s.ok()) s = cuda_->Unlock(pid);
      } else if (*state == CudaProcessState::kLocked) {
        s = cuda_->Unlock(pid);
      }
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }

 private:
  bool cuda_ready() const { return cuda_ != nullptr && !cuda_plugin_dir_.empty(); }
  bool rocm_ready() const { return !rocm_plugin_dir_.empty(); }

  std::string PluginDirFor(bool cuda, bool rocm) const {
    if (cuda && rocm) return both_plugin_dir_;
    return cuda ? cuda_plugin_dir_ : rocm_plugin_dir_;
  }

  // The driver wants every checkpointed GPU in the map: the ones the user
  // left out stay where they were. Every new GPU must be on this machine.
  Result<std::string> CompleteGpuMap(const GpuRestoreOptions& options) {
    GPUCKPT_ASSIGN_OR_RETURN(std::vector<GpuUuidPair> pairs, ParseGpuMap(options.gpu_map));
    GPUCKPT_ASSIGN_OR_RETURN(std::vector<CudaDevice> here, cuda_->Devices());
    std::set<GpuUuid> local;
    for (const auto& d : here) {
      if (auto u = ParseGpuUuid(d.uuid); u.ok()) local.insert(*u);
    }
    std::set<GpuUuid> old_gpus;
    for (const auto& text : options.checkpoint_gpus) {
      if (auto u = ParseGpuUuid(text); u.ok()) old_gpus.insert(*u);
    }
    std::set<GpuUuid> mapped;
    for (const auto& p : pairs) {
      if (!old_gpus.empty() && old_gpus.count(p.old_uuid) == 0)
        return Status::InvalidArgument("--gpu-map: " + FormatGpuUuid(p.old_uuid) +
                                       " is not a GPU of this checkpoint");
      if (local.count(p.new_uuid) == 0)
        return Status::InvalidArgument("--gpu-map: " + FormatGpuUuid(p.new_uuid) +
                                       " is not a GPU of this machine");
      mapped.insert(p.old_uuid);
    }
    std::set<GpuUuid> targets;
    for (const auto& p : pairs) targets.insert(p.new_uuid);
    for (const auto& old : old_gpus) {
      if (mapped.count(old)) continue;
      if (targets.count(old))
        return Status::InvalidArgument("--gpu-map: " + FormatGpuUuid(old) +
                                       " is a target and also a GPU of the checkpoint left "
                                       "unmapped; map it too");
      pairs.push_back({old, old});
    }
    return FormatGpuMap(pairs);
  }

  SystemGpuBackendOptions options_;
  std::unique_ptr<CudaDriver> cuda_;
  std::unique_ptr<Nvml> nvml_;
  std::vector<NvmlGpu> nvml_gpus_;  // by NVML index
  std::string cuda_reason_;
  std::string cuda_plugin_dir_;
  std::vector<KfdGpu> amd_gpus_;
  std::string rocm_reason_;
  std::string rocm_plugin_dir_;
  std::string both_plugin_dir_;
};

}  // namespace

std::unique_ptr<GpuBackend> MakeSystemGpuBackend(const SystemGpuBackendOptions& options) {
  return std::make_unique<SystemGpuBackend>(options);
}

}  // namespace gpuckpt
