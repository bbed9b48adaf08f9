// The checks of checkpoint_resources.h, and EngineImpl::CheckRoomForCheckpoint,
// which gathers their figures.
#include "core/engine/checkpoint_resources.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "core/base/display_text.h"
#include "core/engine/engine_impl.h"
#include "core/proc/process_info.h"

namespace gpuckpt {
namespace {

// One cgroup level and what a checkpoint would charge to it.
struct ChargedLevel {
  const CgroupLimit* limit = nullptr;
  uint64_t device_bytes = 0;
  std::vector<int> device_pids;
  uint64_t staging_bytes = 0;
};

std::string JoinPids(const std::vector<int>& pids) {
  std::string out;
  for (int pid : pids) out += (out.empty() ? "" : ", ") + std::to_string(pid);
  return out;
}

// A cgroup path for a status line: its name is anybody's bytes (a user
// may make cgroups in a delegated subtree), shown as UTF-8 on one line.
std::string ShownCgroup(const std::string& path) {
  std::string shown = DisplayText(path);
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return shown;
}

Status CgroupRefusal(int pid, const ChargedLevel& level) {
  std::string parts;
  if (level.device_bytes != 0) {
    parts = fmt::format("{} of device memory the driver moves into the host memory of process{} {}",
                        BytesForPeople(level.device_bytes),
                        level.device_pids.size() > 1 ? "es" : "", JoinPids(level.device_pids));
  }
  if (level.staging_bytes != 0) {
    parts += fmt::format("{}{} of staging for gpuckptfs", parts.empty() ? "" : ", ",
                         BytesForPeople(level.staging_bytes));
  }
  const std::string_view advice = level.staging_bytes == 0 ? "raise its limit, or free memory in it"
                                  : level.device_bytes == 0
                                      ? "lower --staging-memory, or raise its limit"
                                      : "raise its limit, or lower --staging-memory";
  return Status::NoMemory(fmt::format(
      "not enough memory in the memory cgroup {} for a checkpoint of process {}: it needs {} there "
      "({}) and its limit of {} leaves {}; {}",
      ShownCgroup(level.limit->cgroup), pid,
      BytesForPeople(level.device_bytes + level.staging_bytes), parts,
      BytesForPeople(level.limit->limit_bytes), BytesForPeople(level.limit->headroom_bytes()),
      advice));
}

}  // namespace

std::string BytesForPeople(uint64_t bytes) {
  if (bytes >= 1000 * 1000 * 1000)
    return fmt::format("{:.1f} GB", static_cast<double>(bytes) / 1e9);
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

uint64_t StagingPrefaultBytes(uint64_t tree_rss_bytes, uint64_t device_memory_bytes,
                              uint64_t staging_capacity_bytes) {
  return std::min(tree_rss_bytes + device_memory_bytes, staging_capacity_bytes);
}

Status CheckCheckpointMemory(const CheckpointMemoryNeed& need) {
  uint64_t device_bytes = 0;
  for (const auto& charge : need.device_memory) device_bytes += charge.bytes;
  const uint64_t total = device_bytes + need.staging.bytes;
  if (need.host_available_bytes && total > *need.host_available_bytes) {
    const std::string staging = BytesForPeople(need.staging.bytes) + " of staging";
    return Status::NoMemory(fmt::format(
        "not enough host memory for a checkpoint of process {}: it needs {} ({}) and {} is "
        "available; free memory, or lower --staging-memory",
        need.pid, BytesForPeople(total),
        device_bytes == 0 ? staging
                          : BytesForPeople(device_bytes) +
                                " of device memory the driver moves into host memory, " + staging,
        BytesForPeople(*need.host_available_bytes)));
  }

  // Every limited level charged, in the order first met (each GPU
  // process's own cgroup, its ancestors, then gpuckptfs's): a level that
  // several of them share (a job's slice, a container holding the job and
  // gpuckptfs) is charged all of theirs.
  std::vector<ChargedLevel> levels;
  auto level_of = [&](const CgroupLimit& limit) -> ChargedLevel& {
    for (auto& level : levels) {
      if (level.limit->cgroup == limit.cgroup) return level;
    }
    ChargedLevel level;
    level.limit = &limit;
    levels.push_back(std::move(level));
    return levels.back();
  };
  for (const auto& charge : need.device_memory) {
    if (charge.bytes == 0) continue;
    for (const auto& limit : charge.cgroup) {
      ChargedLevel& level = level_of(limit);
      level.device_bytes += charge.bytes;
      level.device_pids.push_back(charge.pid);
    }
  }
  if (need.staging.bytes != 0) {
    for (const auto& limit : need.staging.cgroup)
      level_of(limit).staging_bytes += need.staging.bytes;
  }
  for (const auto& level : levels) {
    if (level.device_bytes + level.staging_bytes > level.limit->headroom_bytes())
      return CgroupRefusal(need.pid, level);
  }
  return Status::Ok();
}

uint64_t WorstCaseStoreBytes(uint64_t memory_bytes) {
  // The store's own records come on top of the bytes: per chunk (16 KiB
  // on average for pages) a 53-byte record header in the pack, its
  // location and meta records and the file's extent record (about 200
  // bytes with RocksDB's keys, 1.2%): 1/64 covers them. 8 MiB more covers
  // CRIU's other images (a few hundred KiB for most trees), the file
  // records and manifest, and the tables RocksDB writes them into.
  constexpr uint64_t kFixedMargin = 8 << 20;
  return memory_bytes + memory_bytes / 64 + kFixedMargin;
}

Status CheckStoreSpace(int pid, uint64_t memory_bytes, uint64_t free_bytes) {
  const uint64_t worst_case = WorstCaseStoreBytes(memory_bytes);
  if (worst_case <= free_bytes) return Status::Ok();
  return Status::NoSpace(fmt::format(
      "the store's disk has {} free and a checkpoint of process {} may add up to {} (its memory "
      "and device memory, counted as new): free space, or rm -r some checkpoints and run gc",
      BytesForPeople(free_bytes), pid, BytesForPeople(worst_case)));
}

EngineImpl::TreeFootprint EngineImpl::MeasureTree(const std::vector<int>& tree) {
  TreeFootprint footprint;
  for (int member : tree) {
    auto process = ReadProcess(member, ProcReadOptions{.read_gpu_devices = false});
    if (!process.ok()) continue;  // exited meanwhile; CRIU sees the tree anew
    footprint.rss_bytes += process->rss_bytes;
    auto gpu = gpu_->Describe(member);
    if (!gpu.ok() || gpu->device_memory_bytes == 0) continue;
    footprint.device_memory_bytes += gpu->device_memory_bytes;
    footprint.device_memory.emplace_back(member, gpu->device_memory_bytes);
  }
  return footprint;
}

Status EngineImpl::CheckRoomForCheckpoint(int pid, const TreeFootprint& footprint,
                                          bool check_space) {
  // The mounts are read once for all the processes: the same hierarchy is
  // then seen for each, and a level they share is recognised as one.
  MemoryReadOptions read_options;
  read_options.cgroup_mounts = FindCgroupMounts(read_options.proc_root);
  CheckpointMemoryNeed need;
  need.pid = pid;
  for (const auto& [member, bytes] : footprint.device_memory) {
    need.device_memory.push_back(
        {member, bytes, ReadProcessMemoryLimits(std::to_string(member), read_options)});
  }
  need.staging = {0,
                  StagingPrefaultBytes(footprint.rss_bytes, footprint.device_memory_bytes,
                                       staging_->capacity()),
                  ReadProcessMemoryLimits("self", read_options)};
  // Unknown figures are not checked: the checkpoint then goes ahead as it
  // did before these checks.
  if (auto available = ReadMemAvailable(read_options.proc_root); available.ok())
    need.host_available_bytes = *available;
  GPUCKPT_RETURN_IF_ERROR(CheckCheckpointMemory(need));
  if (!check_space) return Status::Ok();
  if (auto free = store_->FreeBytes(); free.ok())
    GPUCKPT_RETURN_IF_ERROR(
        CheckStoreSpace(pid, footprint.rss_bytes + footprint.device_memory_bytes, *free));
  return Status::Ok();
}

}  // namespace gpuckpt
