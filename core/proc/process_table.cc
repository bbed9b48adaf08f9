#include "core/proc/process_table.h"

#include <unistd.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace gpuckpt {
namespace {

// Reads what ReadStat() did not: credentials, command line, executable.
Status ReadRest(const ProcessHandle& handle, const ProcReadOptions& options, ProcessInfo* info) {
  GPUCKPT_RETURN_IF_ERROR(handle.ReadStatus(info));
  GPUCKPT_RETURN_IF_ERROR(handle.ReadCmdline(options.max_cmdline_bytes, info));
  return handle.ReadExe(info);
}

}  // namespace

ProcessTable::ProcessTable(ProcessTableOptions options)
    : options_(std::move(options)), self_pid_(getpid()) {}

bool ProcessTable::FreshLocked(Clock::time_point now) const {
  return have_list_ && list_generation_ == generation_ && now - listed_at_ < options_.ttl;
}

Result<std::vector<std::string>> ProcessTable::DevicesOf(const ProcessHandle& handle,
                                                         const Key& key, const DeviceMap& cache,
                                                         Clock::time_point now,
                                                         bool* scanned) const {
  *scanned = false;
  auto it = cache.find(key);
  // Once seen holding a GPU device, a process keeps it (drivers are opened
  // once per process); one seen without is looked at again now and then.
  if (it != cache.end() &&
      (!it->second.paths.empty() || now - it->second.scanned_at < options_.gpu_rescan)) {
    return it->second.paths;
  }
  *scanned = true;
  auto devices = handle.ReadGpuDevices(options_.read.gpu_device_prefixes);
  if (!devices.ok() && devices.status().code() == StatusCode::kPermissionDenied) {
    return std::vector<std::string>();  // not ours to inspect: shown as no GPU
  }
  return devices;
}

Result<ProcessTable::ScanResult> ProcessTable::Scan(const DeviceMap& old_devices,
                                                    const KeySet& tracked) const {
  const ProcReadOptions& read = options_.read;
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<int> pids, ListPids(read.proc_root));
  std::sort(pids.begin(), pids.end());
  ScanResult result;
  const Clock::time_point now = Clock::now();
  std::unordered_map<int, uint64_t> start_times;  // every live user process seen
  // ppid -> its children holding GPU devices, in pid order (as `pids`).
  std::unordered_map<int, std::vector<int>> gpu_children_of;
  for (int pid : pids) {
    if (pid == self_pid_) continue;
    // Any failure below means the process exited (or its files do not
    // parse): it is left out of this listing, which is all a listing can say.
    auto handle = ProcessHandle::Open(pid, read.proc_root);
    if (!handle.ok()) continue;
    ProcessInfo info;
    if (!handle->ReadStat(&info).ok()) continue;
    if (info.kernel_thread || info.zombie()) continue;
    const Key key{pid, info.start_time};
    bool scanned = false;
    auto devices = DevicesOf(*handle, key, old_devices, now, &scanned);
    if (!devices.ok()) continue;
    if (scanned) ++result.device_scans;
    result.alive.insert(key);
    start_times[pid] = info.start_time;
    if (!devices->empty()) gpu_children_of[info.ppid].push_back(pid);
    auto old = old_devices.find(key);
    result.devices[key] =
        Devices{*devices, scanned || old == old_devices.end() ? now : old->second.scanned_at};
    const bool shown = options_.all_processes || !devices->empty() || tracked.count(key) != 0;
    if (!shown) continue;
    if (!ReadRest(*handle, read, &info).ok()) continue;
    info.gpu_devices = std::move(devices).value();
    result.shown.push_back(std::move(info));
  }
  // After the loop: a parent's children may come after it in pid order.
  AddLaunchers(start_times, std::move(gpu_children_of), &result);
  return result;
}

void ProcessTable::AddLaunchers(const std::unordered_map<int, uint64_t>& start_times,
                                std::unordered_map<int, std::vector<int>> gpu_children_of,
                                ScanResult* result) const {
  const auto by_pid = [](const ProcessInfo& a, const ProcessInfo& b) { return a.pid < b.pid; };
  std::vector<ProcessInfo> added;
  for (auto& [pid, children] : gpu_children_of) {
    // A parent the scan did not see as a live user process (pid 0, a kernel
    // thread, the daemon, one that exited) is no launcher.
    auto seen = start_times.find(pid);
    if (seen == start_times.end()) continue;
    const Key key{pid, seen->second};
    auto devices = result->devices.find(key);
    if (devices == result->devices.end() || !IsJobLauncher(pid, devices->second.paths, children)) {
      continue;
    }
    ProcessInfo probe;
    probe.pid = pid;
    auto shown = std::lower_bound(result->shown.begin(), result->shown.end(), probe, by_pid);
    if (shown != result->shown.end() && shown->pid == pid) {  // tracked, or all_processes
      shown->gpu_children = std::move(children);
      continue;
    }
    // Read again: the loop kept no descriptor open. Left out if it exited or
    // its pid now names another process.
    auto handle = ProcessHandle::Open(pid, options_.read.proc_root);
    if (!handle.ok()) continue;
    ProcessInfo info;
    if (!handle->ReadStat(&info).ok() || info.start_time != key.start_time || info.zombie()) {
      continue;
    }
    if (!ReadRest(*handle, options_.read, &info).ok()) continue;
    info.gpu_children = std::move(children);
    added.push_back(std::move(info));
  }
  if (added.empty()) return;
  // No duplicates: only parents not already shown were added, each once.
  for (ProcessInfo& info : added) result->shown.push_back(std::move(info));
  std::sort(result->shown.begin(), result->shown.end(), by_pid);
}

Result<std::vector<ProcessInfo>> ProcessTable::List() {
  MutexLock lock(&mu_);
  for (;;) {
    if (FreshLocked(Clock::now())) return list_;
    if (!scanning_) break;
    scan_done_.Wait(mu_);
  }
  scanning_ = true;
  const uint64_t generation = generation_;
  const Clock::time_point started = Clock::now();
  DeviceMap old_devices = devices_;
  KeySet tracked = tracked_;
  lock.Unlock();

  Result<ScanResult> scan = Scan(old_devices, tracked);

  lock.Lock();
  scanning_ = false;
  scan_done_.NotifyAll();
  if (!scan.ok()) return scan.status();
  ++counters_.scans;
  counters_.device_scans += scan->device_scans;
  // Entries Get() added during the scan are dropped with the rest; that
  // only costs one more read of those processes' fds.
  devices_ = std::move(scan->devices);
  // Forget tracked processes that were tracked when the scan began and are
  // no longer alive; ones tracked meanwhile may not have been seen yet.
  for (const Key& key : tracked) {
    if (scan->alive.count(key) == 0) tracked_.erase(key);
  }
  list_ = std::move(scan->shown);
  list_generation_ = generation;
  listed_at_ = started;
  have_list_ = true;
  return list_;
}

Result<std::vector<std::string>> ProcessTable::CachedDevicesOf(const ProcessHandle& handle,
                                                               const Key& key,
                                                               Clock::time_point now) {
  DeviceMap cached;
  {
    MutexLock lock(&mu_);
    auto it = devices_.find(key);
    if (it != devices_.end()) cached.emplace(key, it->second);
  }
  bool scanned = false;
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<std::string> devices,
                           DevicesOf(handle, key, cached, now, &scanned));
  if (scanned) {
    MutexLock lock(&mu_);
    ++counters_.device_scans;
    devices_[key] = Devices{devices, now};
  }
  return devices;
}

Result<std::vector<int>> ProcessTable::GpuChildrenOf(const ProcessHandle& parent,
                                                     Clock::time_point now) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<int> children,
                           DirectChildren(parent, options_.read.proc_root));
  std::vector<int> with_gpu;
  for (int pid : children) {
    if (pid == self_pid_) continue;  // as in Scan(): the daemon is not looked at
    // As in Scan(): a child that exits meanwhile, or whose files do not
    // parse, is left out.
    auto handle = ProcessHandle::Open(pid, options_.read.proc_root);
    if (!handle.ok()) continue;
    ProcessInfo info;
    if (!handle->ReadStat(&info).ok()) continue;
    // The ppid is what Scan() goes by; a children file may lag a reparenting.
    if (info.kernel_thread || info.zombie() || info.ppid != parent.pid()) continue;
    auto devices = CachedDevicesOf(*handle, Key{pid, info.start_time}, now);
    if (devices.ok() && !devices->empty()) with_gpu.push_back(pid);
  }
  return with_gpu;  // sorted, as DirectChildren() returns them
}

Result<ProcessInfo> ProcessTable::Get(int pid) {
  const std::string name = "process " + std::to_string(pid);
  if (pid == self_pid_) return Status::NoSuchProcess(name + " is gpuckptfs itself, not shown");
  GPUCKPT_ASSIGN_OR_RETURN(ProcessHandle handle, ProcessHandle::Open(pid, options_.read.proc_root));
  ProcessInfo info;
  GPUCKPT_RETURN_IF_ERROR(handle.ReadStat(&info));
  if (info.kernel_thread) return Status::NoSuchProcess(name + " is a kernel thread, not shown");
  if (info.zombie()) return Status::NoSuchProcess(name + " has exited (zombie)");
  const Key key{pid, info.start_time};

  bool tracked = false;
  {
    MutexLock lock(&mu_);
    tracked = tracked_.count(key) != 0;
  }
  const Clock::time_point now = Clock::now();
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<std::string> devices, CachedDevicesOf(handle, key, now));
  // Looked for even when tracked or all_processes shows it anyway, so that
  // gpu_children agrees with List().
  std::vector<int> gpu_children;
  if (MayBeJobLauncher(pid, devices)) {
    GPUCKPT_ASSIGN_OR_RETURN(gpu_children, GpuChildrenOf(handle, now));
    if (!IsJobLauncher(pid, devices, gpu_children)) gpu_children.clear();
  }
  const bool launcher = !gpu_children.empty();
  if (!options_.all_processes && !tracked && devices.empty() && !launcher) {
    return Status::NoSuchProcess(name + " is not shown: it holds no GPU device (`track " +
                                 std::to_string(pid) + "` shows it)");
  }
  GPUCKPT_RETURN_IF_ERROR(ReadRest(handle, options_.read, &info));
  info.gpu_devices = std::move(devices);
  info.gpu_children = std::move(gpu_children);
  return info;
}

Status ProcessTable::Track(int pid) {
  const std::string name = "process " + std::to_string(pid);
  if (pid == self_pid_) return Status::InvalidArgument(name + " is gpuckptfs itself");
  GPUCKPT_ASSIGN_OR_RETURN(ProcessHandle handle, ProcessHandle::Open(pid, options_.read.proc_root));
  ProcessInfo info;
  GPUCKPT_RETURN_IF_ERROR(handle.ReadStat(&info));
  if (info.kernel_thread) return Status::InvalidArgument(name + " is a kernel thread");
  if (info.zombie()) return Status::NoSuchProcess(name + " has exited (zombie)");
  // A thread id is not a process (ReadStatus says so).
  GPUCKPT_RETURN_IF_ERROR(handle.ReadStatus(&info));
  MutexLock lock(&mu_);
  tracked_.insert(Key{pid, info.start_time});
  ++generation_;
  return Status::Ok();
}

void ProcessTable::Invalidate() {
  MutexLock lock(&mu_);
  ++generation_;
}

ProcessTable::Counters ProcessTable::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

}  // namespace gpuckpt
