// How much more memory processes may take before the machine or a memory
// cgroup runs out: the host's MemAvailable (/proc/meminfo), and the limits
// of a process's memory cgroup and its ancestors (cgroup v2's memory.max,
// or v1's memory.limit_in_bytes), for the engine to check that a checkpoint
// fits before it locks or freezes anything.
//
// Everything read here is a hint, never a reason to fail: a file that is
// missing, unreadable or does not parse (a process in a container may not
// see its cgroup) makes that level count as unlimited. A cgroup path taken
// from /proc/PID/cgroup is untrusted text: a path with "..", ".", empty or
// over-long components is not read at all (it counts as unlimited), so no
// read ever leaves the cgroup mount. Every read is a small, bounded read of
// a regular file, the last component never followed.
//
// Thread-safety: free functions over values, safe to call concurrently.
// Nothing is held between calls; the results are plain values owned by the
// caller.
#ifndef GPUCKPT_CORE_PROC_MEMORY_HEADROOM_H_
#define GPUCKPT_CORE_PROC_MEMORY_HEADROOM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// --- The host -------------------------------------------------------------------

// MemAvailable of /proc/meminfo text, in bytes. kNotFound when the line is
// missing (kernels before 3.14), kIOError when it does not parse or its
// value does not fit 64 bits.
Result<uint64_t> ParseMemAvailable(std::string_view meminfo);
// The same, read from `proc_root`/meminfo.
Result<uint64_t> ReadMemAvailable(const std::string& proc_root = "/proc");

// --- Memory cgroups -------------------------------------------------------------

// Where the memory cgroup hierarchies are mounted. `*_root` is the cgroup
// the mount shows at its top ("/" unless only a subtree is mounted, as in
// some containers): a process's cgroup path is relative to the hierarchy's
// root, so it is found under the mount only when it lies below `*_root`.
struct CgroupMounts {
  std::string v2_dir;  // a cgroup2 mount; "" if none
  std::string v2_root = "/";
  std::string v1_memory_dir;  // a cgroup v1 mount with the memory controller; "" if none
  std::string v1_memory_root = "/";
};

// The first cgroup2 mount and the first v1 mount with the memory
// controller in /proc/PID/mountinfo text (octal escapes such as "\040"
// decoded). Lines that do not parse are skipped.
CgroupMounts ParseCgroupMounts(std::string_view mountinfo);
// The same, read from `proc_root`/self/mountinfo; none when unreadable.
CgroupMounts FindCgroupMounts(const std::string& proc_root = "/proc");

// A process's memory cgroup: where its limits are read.
struct MemoryCgroup {
  enum class Version { kV1, kV2 };
  Version version = Version::kV2;
  std::string path;  // as /proc/PID/cgroup names it, e.g. "/system.slice/job.service"
};

// The memory cgroup in /proc/PID/cgroup text: the line of the v1 hierarchy
// whose controllers include "memory" when `mounts` has a v1 memory mount
// (the memory controller is there, not in v2, on hybrid machines), else
// the v2 line ("0::PATH") when it has a cgroup2 mount. nullopt when there
// is neither, or the path is not one to read (see IsSafeCgroupPath).
std::optional<MemoryCgroup> ParseMemoryCgroup(std::string_view proc_cgroup,
                                              const CgroupMounts& mounts);

// Whether `path` names a cgroup without leaving the hierarchy: absolute,
// at most 4096 bytes, no NUL, and no empty, "." or ".." component.
bool IsSafeCgroupPath(std::string_view path);

// One cgroup level that has a memory limit.
struct CgroupLimit {
  std::string cgroup;  // its path in the hierarchy, e.g. "/system.slice/job.service"
  uint64_t limit_bytes = 0;
  // What its processes hold, less the page cache the kernel reclaims first
  // (inactive file pages): the "working set" that kubelet also compares
  // with the limit. Usage alone would count the store's written pages,
  // which the kernel drops before it would kill anything.
  uint64_t used_bytes = 0;

  uint64_t headroom_bytes() const {
    return limit_bytes > used_bytes ? limit_bytes - used_bytes : 0;
  }
};

// The levels with a limit of a cgroup: itself first, then its ancestors up
// to the top of the mount; levels without one (or unreadable) are left out.
using CgroupLimits = std::vector<CgroupLimit>;

// The smallest headroom among `limits`; nullopt when there is none (no
// limit anywhere).
std::optional<uint64_t> HeadroomOf(const CgroupLimits& limits);

// The limits of `cgroup` and its ancestors, read under `mounts`. v2:
// memory.max ("max": none), memory.current, memory.stat's inactive_file.
// v1: memory.limit_in_bytes (values of 2^60 and more, such as the 2^63 less
// a page that v1 shows for "unlimited", count as none), memory.usage_in_bytes,
// memory.stat's total_inactive_file. A usage that cannot be read counts as
// 0 (the limit alone still bounds what fits).
CgroupLimits ReadCgroupLimits(const CgroupMounts& mounts, const MemoryCgroup& cgroup);

// Where ReadProcessMemoryLimits reads; tests point these at fabricated
// trees.
struct MemoryReadOptions {
  // Default: "/proc".
  std::string proc_root = "/proc";
  // The cgroup mounts; nullopt: found in proc_root/self/mountinfo.
  // Default: nullopt.
  std::optional<CgroupMounts> cgroup_mounts;
};

// The memory cgroup limits of process `pid` ("self" for the caller), from
// proc_root/PID/cgroup. Empty when it has none, or none can be seen.
CgroupLimits ReadProcessMemoryLimits(const std::string& pid, const MemoryReadOptions& options = {});

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_MEMORY_HEADROOM_H_
