// Cgroups of their own for the process trees gpuckptfs restores.
//
// CRIU is the daemon's child, so what it restores would start in the
// daemon's cgroups, and whatever ends those (systemd stopping or
// restarting the service kills every process of its cgroup) would kill
// the restored jobs too. Instead, before CRIU starts, MakeRestoreCgroup()
// makes one cgroup for the tree in every cgroup hierarchy this process
// sees mounted and writable (cgroup v2, and each v1 hierarchy: the
// controllers' and named ones such as name=systemd), as
// <hierarchy root>/gpuckpt/<name>, beside the daemon's rather than below
// it; CRIU joins them before it execs (CriuCommand::join_cgroup_fds), and
// everything it restores starts there. The cgroups an image records are
// not used (the engine runs CRIU with --manage-cgroups=ignore, but for a
// container root checkpointed): they may name another user's session,
// which root must not be made to move a process into.
//
// A cgroup that has emptied (its tree exited, or its restore failed) is
// removed when its RestoreCgroup goes, if empty by then, and otherwise at
// a later MakeRestoreCgroup() (of this daemon or another): while any
// RestoreCgroup lives, whose cgroups are empty until CRIU joins them, the
// directory is flock()ed shared and none is removed.
//
// Thread-safe: free functions; RestoreCgroup is owned by one operation.
#ifndef GPUCKPT_CORE_PROC_CGROUP_PLACEMENT_H_
#define GPUCKPT_CORE_PROC_CGROUP_PLACEMENT_H_

#include <memory>
#include <string>
#include <vector>

#include "core/proc/mount_table.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// The directory under each hierarchy's root that holds the trees' cgroups.
inline constexpr char kRestoredCgroupsDir[] = "gpuckpt";

struct CgroupHierarchy {
  std::string mountpoint;  // e.g. /sys/fs/cgroup/memory, or /sys/fs/cgroup
  bool v2 = false;
};

// The hierarchies of `mounts` to place a tree in: each cgroup (v1) and
// cgroup2 mount of a hierarchy's root ("/"), mounted read-write, once per
// hierarchy (the first mount of it).
std::vector<CgroupHierarchy> PlaceableCgroupHierarchies(const std::vector<MountEntry>& mounts);

// One restored tree's cgroups, one per hierarchy.
class RestoreCgroup {
 public:
  RestoreCgroup(std::vector<std::string> dirs, std::vector<int> procs_fds)
      : dirs_(std::move(dirs)), procs_fds_(std::move(procs_fds)) {}
  // Closes the descriptors, removes each cgroup that is empty, and drops
  // the lock that kept other placements from removing them meanwhile.
  ~RestoreCgroup();
  RestoreCgroup(const RestoreCgroup&) = delete;
  RestoreCgroup& operator=(const RestoreCgroup&) = delete;

  // The cgroups' directories, e.g. /sys/fs/cgroup/memory/gpuckpt/restore-42-1.
  const std::vector<std::string>& dirs() const { return dirs_; }
  // Their cgroup.procs, open for writing (close-on-exec): what CRIU joins.
  // Valid while this object lives.
  const std::vector<int>& procs_fds() const { return procs_fds_; }

 private:
  friend Result<std::unique_ptr<RestoreCgroup>> MakeRestoreCgroup(const std::string&,
                                                                  const std::string&);
  std::vector<std::string> dirs_;
  std::vector<int> procs_fds_;
  std::vector<int> lock_fds_;  // the parents, flock()ed shared
};

// Makes the cgroups "<prefix>-<n>" (the first n free in every hierarchy)
// under <root>/gpuckpt/ of each hierarchy PlaceableCgroupHierarchies()
// finds in `mountinfo`, and removes that directory's cgroups that have
// emptied. In a v1 cpuset hierarchy the new cgroups get their parent's CPUs
// and memory nodes (a v1 cpuset without any takes no process). No
// hierarchy at all (no cgroup filesystem mounted) gives a RestoreCgroup
// with none. Errors: kIOError (or what errno says) naming the directory
// that could not be made or opened.
Result<std::unique_ptr<RestoreCgroup>> MakeRestoreCgroup(
    const std::string& prefix, const std::string& mountinfo = "/proc/self/mountinfo");

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_CGROUP_PLACEMENT_H_
