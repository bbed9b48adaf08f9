#include "core/proc/process_table.h"

#include <unistd.h>

#include <algorithm>
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
    auto old = old_devices.find(key);
    result.devices[key] =
        Devices{*devices, scanned || old == old_devices.end() ? now : old->second.scanned_at};
    const bool shown = options_.all_processes || !devices->empty() || tracked.count(key) != 0;
    if (!shown) continue;
    if (!ReadRest(*handle, read, &info).ok()) continue;
    info.gpu_devices = std::move(devices).value();
    result.shown.push_back(std::move(info));
  }
  return result;
}

Result<std::vector<ProcessInfo>> ProcessTable::List() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (FreshLocked(Clock::now())) return list_;
    if (!scanning_) break;
    scan_done_.wait(lock);
  }
  scanning_ = true;
  const uint64_t generation = generation_;
  const Clock::time_point started = Clock::now();
  DeviceMap old_devices = devices_;
  KeySet tracked = tracked_;
  lock.unlock();

  Result<ScanResult> scan = Scan(old_devices, tracked);

  lock.lock();
  scanning_ = false;
  scan_done_.notify_all();
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

Result<ProcessInfo> ProcessTable::Get(int pid) {
  const std::string name = "process " + std::to_string(pid);
  if (pid == self_pid_) return Status::NoSuchProcess(name + " is gpuckptfs itself, not shown");
  GPUCKPT_ASSIGN_OR_RETURN(ProcessHandle handle, ProcessHandle::Open(pid, options_.read.proc_root));
  ProcessInfo info;
  GPUCKPT_RETURN_IF_ERROR(handle.ReadStat(&info));
  if (info.kernel_thread) return Status::NoSuchProcess(name + " is a kernel thread, not shown");
  if (info.zombie()) return Status::NoSuchProcess(name + " has exited (zombie)");
  const Key key{pid, info.start_time};

  DeviceMap cached;
  bool tracked = false;
  {
    std::lock_guard lock(mu_);
    tracked = tracked_.count(key) != 0;
    auto it = devices_.find(key);
    if (it != devices_.end()) cached.emplace(key, it->second);
  }
  bool scanned = false;
  const Clock::time_point now = Clock::now();
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<std::string> devices,
                           DevicesOf(handle, key, cached, now, &scanned));
  if (scanned) {
    std::lock_guard lock(mu_);
    ++counters_.device_scans;
    devices_[key] = Devices{devices, now};
  }
  if (!options_.all_processes && !tracked && devices.empty()) {
    return Status::NoSuchProcess(name + " is not shown: it holds no GPU device (`track " +
                                 std::to_string(pid) + "` shows it)");
  }
  GPUCKPT_RETURN_IF_ERROR(ReadRest(handle, options_.read, &info));
  info.gpu_devices = std::move(devices);
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
  std::lock_guard lock(mu_);
  tracked_.insert(Key{pid, info.start_time});
  ++generation_;
  return Status::Ok();
}

void ProcessTable::Invalidate() {
  std::lock_guard lock(mu_);
  ++generation_;
}

ProcessTable::Counters ProcessTable::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

}  // namespace gpuckpt
