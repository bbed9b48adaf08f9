// ProcessTable: the set of processes gpuckptfs shows as <pid>/ directories,
// cached so that `ls /mnt/gpuckpt` stays fast with thousands of processes.
//
// A process is shown when it holds a GPU device open or mapped (see
// ProcReadOptions::gpu_device_prefixes), when it is a job launcher (below),
// when it was tracked (`track <pid>`), or, with all_processes, when it is any
// user process. Never shown: kernel threads, zombies (they have exited;
// nothing is left to checkpoint) and the process that owns the table (the
// daemon). Processes are keyed by (pid, start_time): a reused pid is a
// different process.
//
// A job launcher is the parent of a multi-GPU job (torchrun,
// torch.multiprocessing.spawn's parent, MPI's prted): a process that holds no
// GPU device itself but has at least two direct children (ppid) that do. It
// is shown so that one checkpoint of it takes the whole job, since CRIU dumps
// the tree. Two, not one: a shell running one GPU program is no job, and that
// program is checkpointed by itself. Pid 1 (init) never is one. The rule is
// IsJobLauncher(); ProcessInfo::gpu_children names the children.
//
// Cost: List() scans /proc at most once per ttl. The scan reads every
// process's stat (one small read), but the costly part, its fd links and maps
// (GPU detection), only for processes not seen before; the result is kept per
// (pid, start_time) and looked at again after gpu_rescan for processes that
// had no GPU device (a program opens the GPU some time after it starts).
// Finding launchers adds no reads to a scan (ppids come with stat); Get() of
// a process with no GPU device reads its children and their devices (cached
// like the rest), or every stat where the kernel has no children files.
//
// Thread-safety: safe for concurrent use (FUSE threads). One mutex guards the
// cached state; it is a leaf (no other lock is taken under it) and is never
// held while reading /proc: a scan runs unlocked, and concurrent List()
// callers wait on a condition variable for the scan in flight rather than
// start a second one.
#ifndef GPUCKPT_CORE_PROC_PROCESS_TABLE_H_
#define GPUCKPT_CORE_PROC_PROCESS_TABLE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/base/mutex.h"
#include "core/proc/process_info.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// The job launcher rule (see the top of this file), in one place.
// MayBeJobLauncher() is what can be told before reading the children.
inline constexpr size_t kJobLauncherMinGpuChildren = 2;
inline bool MayBeJobLauncher(int pid, const std::vector<std::string>& gpu_devices) {
  return pid != 1 && gpu_devices.empty();
}
inline bool IsJobLauncher(int pid, const std::vector<std::string>& gpu_devices,
                          const std::vector<int>& gpu_children) {
  return MayBeJobLauncher(pid, gpu_devices) && gpu_children.size() >= kJobLauncherMinGpuChildren;
}

struct ProcessTableOptions {
  // How processes are read: proc_root, GPU device prefixes. read_gpu_devices
  // is ignored: the table always looks for GPU devices, that is what it is
  // for. Default: see ProcReadOptions.
  ProcReadOptions read;

  // Show every user process, not only GPU and tracked ones (gpuckptfs
  // --all-processes). Default: false.
  bool all_processes = false;

  // List() returns the last scan's result for this long. Longer is cheaper
  // with many processes; shorter shows new processes sooner. Invalidate()
  // and Track() end it early. Default: 1 s.
  std::chrono::milliseconds ttl{1000};

  // A process seen with no GPU device has its fds and maps read again after
  // this long (once per process per interval, not all at once). Default: 10 s.
  std::chrono::milliseconds gpu_rescan{10000};
};

class ProcessTable {
 public:
  explicit ProcessTable(ProcessTableOptions options);
  ProcessTable(const ProcessTable&) = delete;
  ProcessTable& operator=(const ProcessTable&) = delete;

  // The shown processes, sorted by pid. Processes that exit during the scan
  // are left out. Fails only when proc_root itself cannot be read.
  Result<std::vector<ProcessInfo>> List() EXCLUDES(mu_);

  // One process by pid if it is shown, read now (no full scan; its GPU
  // devices, and for one without any its children's, come from the cache
  // when fresh). kNoSuchProcess if it is gone or not shown, the message
  // saying which.
  Result<ProcessInfo> Get(int pid) EXCLUDES(mu_);

  // `track <pid>`: show this process from now on, even without GPU devices;
  // forgotten once it exits (a later process with its pid is not tracked).
  // kNoSuchProcess if gone, kInvalidArgument for a kernel thread or the
  // daemon itself. Checking that the caller may do this is up to the caller
  // (MayCheckpoint()).
  Status Track(int pid) EXCLUDES(mu_);

  // The next List() scans again (after a checkpoint --kill, a restore).
  void Invalidate() EXCLUDES(mu_);

  // Counters, for tests and metrics.
  struct Counters {
    uint64_t scans = 0;         // full /proc scans by List()
    uint64_t device_scans = 0;  // processes whose fds and maps were read
  };
  Counters counters() const EXCLUDES(mu_);

 private:
  using Clock = std::chrono::steady_clock;
  struct Key {
    int pid = 0;
    uint64_t start_time = 0;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<uint64_t>()((static_cast<uint64_t>(k.pid) << 40) ^ k.start_time);
    }
  };
  struct Devices {
    std::vector<std::string> paths;
    Clock::time_point scanned_at;
  };
  using DeviceMap = std::unordered_map<Key, Devices, KeyHash>;
  using KeySet = std::unordered_set<Key, KeyHash>;

  // What one scan found; built without the lock.
  struct ScanResult {
    std::vector<ProcessInfo> shown;
    DeviceMap devices;
    KeySet alive;  // every live user process seen, shown or not
    uint64_t device_scans = 0;
  };
  Result<ScanResult> Scan(const DeviceMap& old_devices, const KeySet& tracked) const EXCLUDES(mu_);
  // Adds to result->shown the job launchers among the processes the scan
  // saw (start_times: pid -> start_time of each), and their gpu_children
  // to launchers already shown; result->shown ends sorted by pid.
  void AddLaunchers(const std::unordered_map<int, uint64_t>& start_times,
                    std::unordered_map<int, std::vector<int>> gpu_children_of,
                    ScanResult* result) const;
  // The GPU devices of an open process: from `cache` if fresh, else read
  // (and *scanned set). kNoSuchProcess if it exited.
  Result<std::vector<std::string>> DevicesOf(const ProcessHandle& handle, const Key& key,
                                             const DeviceMap& cache, Clock::time_point now,
                                             bool* scanned) const EXCLUDES(mu_);
  // DevicesOf with devices_ as the cache, kept up to date (for Get()).
  Result<std::vector<std::string>> CachedDevicesOf(const ProcessHandle& handle, const Key& key,
                                                   Clock::time_point now) EXCLUDES(mu_);
  // The direct children of `parent` that hold GPU devices, sorted (for Get()).
  Result<std::vector<int>> GpuChildrenOf(const ProcessHandle& parent, Clock::time_point now)
      EXCLUDES(mu_);
  bool FreshLocked(Clock::time_point now) const REQUIRES(mu_);

  const ProcessTableOptions options_;
  const int self_pid_;

  mutable Mutex mu_;  // leaf lock; never held during /proc reads
  CondVar scan_done_;
  bool scanning_ GUARDED_BY(mu_) = false;    // a List() scan is in flight
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped by Invalidate() and Track()
  // generation_ when the scan behind list_ began
  uint64_t list_generation_ GUARDED_BY(mu_) = 0;
  bool have_list_ GUARDED_BY(mu_) = false;
  Clock::time_point listed_at_ GUARDED_BY(mu_);  // when the scan behind list_ began
  std::vector<ProcessInfo> list_ GUARDED_BY(mu_);
  DeviceMap devices_ GUARDED_BY(mu_);
  KeySet tracked_ GUARDED_BY(mu_);
  Counters counters_ GUARDED_BY(mu_);
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_PROCESS_TABLE_H_
