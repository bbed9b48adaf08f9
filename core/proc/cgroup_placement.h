// Cgroups for the process trees gpuckptfs restores, below the cgroups of
// whoever asked for the restore.
//
// CRIU is the daemon's child, so what it restores would start in the
// daemon's cgroups, and whatever ends those (systemd stopping or
// restarting the service kills every process of its cgroup) would kill
// the restored jobs too. A cgroup beside the daemon's would keep them
// alive but let them escape the limits (memory, tasks, CPU, ...) of the
// process that asked: a job confined to 64 MiB would come back unlimited.
// So, before CRIU starts, MakeRestoreCgroup() makes one cgroup for the tree
// in every cgroup hierarchy, as a child of the restoring process's own
// cgroup there: <its cgroup>/gpuckpt-restore-<root pid>-<n>. Every limit
// of that cgroup and its ancestors applies to the tree, since cgroups
// count their descendants; nothing is ever placed above it. CRIU joins
// them before it execs (CriuCommand::join_cgroup_fds), so everything it
// restores starts there. The cgroups an image records are not used (the
// engine runs CRIU with --manage-cgroups=ignore, but for a container root
// checkpointed): they may name another user's session, which root must
// not be made to move a process into.
//
// The restoring process is the one whose thread wrote to `restore` (a
// FUSE request's pid); it stays blocked in its write(2) until the restore
// ends, so its pid cannot be reused meanwhile. Where that pid is unknown
// (0: the writer is in a pid namespace the daemon does not see) or its
// cgroups cannot be read, the restore is refused rather than placed where
// no limit of the writer's would apply.
//
// A cgroup that has emptied (its tree exited, or its restore failed) is
// removed when its RestoreCgroup goes, if empty by then, and otherwise
// later, when a placement sweeps its parent: each placement sweeps the
// restoring process's cgroups and every parent where this process (the
// daemon) has seen one of these cgroups still holding a tree (when its
// RestoreCgroup went, or at a sweep). A RestoreCgroup holds a
// shared flock() on each of its directories from their making, empty as
// they are until CRIU joins them, so no sweep (of this daemon or another)
// removes them meanwhile.
//
// Thread-safety: free functions, safe to call concurrently; the set of
// parents to sweep is the process's, behind a mutex. A RestoreCgroup is
// owned by one operation.
#ifndef GPUCKPT_CORE_PROC_CGROUP_PLACEMENT_H_
#define GPUCKPT_CORE_PROC_CGROUP_PLACEMENT_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/proc/mount_table.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// The start of the name of every cgroup made for a restored tree
// ("gpuckpt-restore-<root pid>-<n>"); sweeps remove nothing else.
inline constexpr char kRestoreCgroupPrefix[] = "gpuckpt-restore-";

// Where a restored tree's cgroup is made in one hierarchy.
struct RestoreCgroupPlace {
  // The directory of the restoring process's cgroup, e.g.
  // /sys/fs/cgroup/memory/batch/job7; the tree's is made in it.
  std::string parent;
  bool v2 = false;
};

// Where to place a tree restored for a process whose /proc/PID/cgroup text
// is `restorer`, by a daemon whose own is `daemon`, with the daemon's
// `mounts`. In each hierarchy of `restorer` (its v2 line "0::PATH" and its
// v1 lines "ID:CONTROLLERS:PATH"):
//  - the first mount of that hierarchy (cgroup2; or cgroup whose options
//    name every controller of the line) mounted read-write that shows the
//    restorer's cgroup (its root is that cgroup or an ancestor): a place;
//  - none, without an error, where nothing escapes: a v1 hierarchy with no
//    controller (name=systemd alone), or one where the daemon's own cgroup
//    is the restorer's or below it (the tree stays in the daemon's);
//  - otherwise kUnavailable, naming the hierarchy and the cgroup.
// A path that is not a plain absolute cgroup path (one with "..": the
// restorer is outside the daemon's cgroup namespace) is kPermissionDenied;
// no line at all is kNoSuchProcess (a process that has exited).
Result<std::vector<RestoreCgroupPlace>> PlanRestoreCgroups(std::string_view restorer,
                                                           std::string_view daemon,
                                                           const std::vector<MountEntry>& mounts);

// One restored tree's cgroups, one per place.
class RestoreCgroup {
 public:
  // Takes the cgroups `dirs` made for a tree, with their cgroup.procs open
  // for writing (`procs_fds`) and the directories themselves open and
  // flock()ed shared (`lock_fds`); the descriptors are its own from here on.
  RestoreCgroup(std::vector<std::string> dirs, std::vector<int> procs_fds,
                std::vector<int> lock_fds)
      : dirs_(std::move(dirs)), procs_fds_(std::move(procs_fds)), lock_fds_(std::move(lock_fds)) {}
  // Closes the descriptors, removes each cgroup that is empty, remembers
  // the parents of those that are not for a later sweep, and drops the
  // locks that kept sweeps from removing them meanwhile.
  ~RestoreCgroup();
  RestoreCgroup(const RestoreCgroup&) = delete;
  RestoreCgroup& operator=(const RestoreCgroup&) = delete;

  // The cgroups made for the tree, e.g.
  // /sys/fs/cgroup/memory/batch/job7/gpuckpt-restore-42-1; none for the
  // restorer's own (JoinRestorerCgroup).
  const std::vector<std::string>& dirs() const { return dirs_; }
  // Their cgroup.procs, open for writing (close-on-exec): what CRIU joins.
  // Valid while this object lives.
  const std::vector<int>& procs_fds() const { return procs_fds_; }

 private:
  std::vector<std::string> dirs_;
  std::vector<int> procs_fds_;
  std::vector<int> lock_fds_;
};

// Where MakeRestoreCgroup reads; tests point these at fabricated files.
struct CgroupSources {
  std::string proc_root = "/proc";                 // <proc_root>/<pid>/cgroup, self/cgroup
  std::string mountinfo = "/proc/self/mountinfo";  // the daemon's mounts
};

// Makes the cgroups "gpuckpt-restore-<root_pid>-<n>" (the first n free in
// every place) where PlanRestoreCgroups() places a tree restored for the
// process `restorer_pid` (in the daemon's pid namespace), after sweeping
// the emptied ones of those places and of earlier ones. In a v1 cpuset
// hierarchy the new cgroup gets its parent's CPUs and memory nodes (a v1
// cpuset without any takes no process). No place at all (no cgroup
// filesystem mounted, and nothing to escape) gives a RestoreCgroup with
// none. Errors: kPermissionDenied when `restorer_pid` is 0 (unknown) or
// its cgroup is outside the daemon's view, kNoSuchProcess when it is gone,
// kUnavailable where a hierarchy's limits could not be kept (no writable
// mount of it; a v1 memory cgroup that does not count its descendants; a
// v2 cgroup that could take no process: a threaded subtree), kIOError (or
// what errno says) naming the cgroup that could not be made or opened.
Result<std::unique_ptr<RestoreCgroup>> MakeRestoreCgroup(int restorer_pid, int root_pid,
                                                         const CgroupSources& sources = {});

// The restoring process's own cgroups, where PlanRestoreCgroups() would
// make the tree's, for a tree that is to be one with that process's: a
// batch scheduler finds, signals and ends a job's processes by the cgroup
// it made for the job (Slurm's proctrack/cgroup reads that cgroup's
// cgroup.procs, not those below it). The limits are the restorer's, as
// below it. Nothing is made, and nothing is removed when it goes (its
// dirs() is empty). Errors as MakeRestoreCgroup's, and what opening a
// cgroup.procs gives.
Result<std::unique_ptr<RestoreCgroup>> JoinRestorerCgroup(int restorer_pid,
                                                          const CgroupSources& sources = {});

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_CGROUP_PLACEMENT_H_
