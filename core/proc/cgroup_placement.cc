#include "core/proc/cgroup_placement.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <set>

#include "core/base/small_file.h"
#include "core/base/unique_fd.h"

namespace gpuckpt {
namespace {

// How many names MakeRestoreCgroup tries before giving up: each taken one
// belongs to a tree still running.
constexpr int kMaxNameTries = 1000;

bool MountedReadWrite(const std::string& options) {
  return options == "rw" || options.compare(0, 3, "rw,") == 0;
}

// A v1 cpuset cgroup starts with no CPUs and no memory nodes, and takes no
// process until it has some: `dir` gets those of `parent`. Elsewhere (no
// cpuset.cpus file) nothing is done.
Status InheritCpuset(const std::string& parent, const std::string& dir) {
  for (const char* file : {"cpuset.cpus", "cpuset.mems"}) {
    const std::string target = dir + "/" + file;
    if (access(target.c_str(), F_OK) != 0) return Status::Ok();
    auto current = ReadSmallFileNoFollow(target, 64 << 10);
    if (current.ok() && current->find_first_not_of(" \n") != std::string::npos) continue;
    GPUCKPT_ASSIGN_OR_RETURN(std::string value,
                             ReadSmallFileNoFollow(parent + "/" + file, 64 << 10));
    UniqueFd fd(open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0 || write(fd.get(), value.data(), value.size()) < 0)
      return StatusFromErrno(errno, "setting " + target);
  }
  return Status::Ok();
}

// <root>/gpuckpt, made if missing.
Result<std::string> RestoredCgroupsDir(const CgroupHierarchy& hierarchy) {
  const std::string dir = hierarchy.mountpoint + "/" + kRestoredCgroupsDir;
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return StatusFromErrno(errno, "making the cgroup " + dir);
  if (!hierarchy.v2) GPUCKPT_RETURN_IF_ERROR(InheritCpuset(hierarchy.mountpoint, dir));
  return dir;
}

// Removes the cgroups under `dir` whose trees have gone: rmdir of a cgroup
// that still holds a process (or a child cgroup) fails with EBUSY, so only
// empty ones go, and nothing but directories is ever removed. Done only
// under an exclusive flock of `dir`, which every RestoreCgroup holds shared
// (in this daemon or another) from before it makes its cgroup, which stays
// empty until CRIU joins it, until it goes: when one is held, nothing is
// removed this time.
void RemoveEmptied(const std::string& dir) {
  UniqueFd lock(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (lock.get() < 0 || flock(lock.get(), LOCK_EX | LOCK_NB) != 0) return;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (e->d_type == DT_DIR && name != "." && name != "..")
      rmdir((dir + "/" + name).c_str());  // EBUSY: still in use
  }
  closedir(d);
}

}  // namespace

std::vector<CgroupHierarchy> PlaceableCgroupHierarchies(const std::vector<MountEntry>& mounts) {
  std::vector<CgroupHierarchy> out;
  std::set<std::string> seen;  // by device: one hierarchy may be mounted twice
  for (const MountEntry& m : mounts) {
    const bool v2 = m.type == "cgroup2";
    if ((!v2 && m.type != "cgroup") || m.root != "/" || !MountedReadWrite(m.options)) continue;
    if (!seen.insert(m.device).second) continue;
    out.push_back({m.mountpoint, v2});
  }
  return out;
}

RestoreCgroup::~RestoreCgroup() {
  for (int fd : procs_fds_) close(fd);
  for (const std::string& dir : dirs_) rmdir(dir.c_str());  // EBUSY while the tree lives
  for (int fd : lock_fds_) close(fd);                       // releases the flocks
}

Result<std::unique_ptr<RestoreCgroup>> MakeRestoreCgroup(const std::string& prefix,
                                                         const std::string& mountinfo) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<MountEntry> mounts, ReadMountTable(mountinfo));
  const std::vector<CgroupHierarchy> hierarchies = PlaceableCgroupHierarchies(mounts);
  std::vector<std::string> parents;
  for (const CgroupHierarchy& h : hierarchies) {
    GPUCKPT_ASSIGN_OR_RETURN(std::string parent, RestoredCgroupsDir(h));
    RemoveEmptied(parent);
    parents.push_back(std::move(parent));
  }
  // Shared flocks of the parents (RemoveEmptied), kept by the RestoreCgroup.
  std::vector<UniqueFd> locks;
  for (const std::string& parent : parents) {
    UniqueFd lock(open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (lock.get() < 0) return StatusFromErrno(errno, "opening " + parent);
    while (flock(lock.get(), LOCK_SH) != 0)
      if (errno != EINTR) return StatusFromErrno(errno, "locking " + parent);
    locks.push_back(std::move(lock));
  }
  // A counter shared by all restores of this daemon keeps concurrent ones
  // apart; a name left by an earlier daemon's tree is skipped.
  static std::atomic<uint64_t> next{1};
  for (int attempt = 0; attempt < kMaxNameTries; ++attempt) {
    const std::string name = prefix + "-" + std::to_string(next.fetch_add(1));
    std::vector<std::string> dirs;
    std::vector<int> fds;
    bool taken = false;
    Status failed = Status::Ok();
    for (size_t i = 0; i < hierarchies.size(); ++i) {
      const std::string dir = parents[i] + "/" + name;
      if (mkdir(dir.c_str(), 0755) != 0) {
        if (errno == EEXIST) {
          taken = true;
        } else {
          failed = StatusFromErrno(errno, "making the cgroup " + dir);
        }
        break;
      }
      dirs.push_back(dir);
      if (!hierarchies[i].v2) {
        failed = InheritCpuset(parents[i], dir);
        if (!failed.ok()) break;
      }
      const std::string procs = dir + "/cgroup.procs";
      const int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) {
        failed = StatusFromErrno(errno, "opening " + procs);
        break;
      }
      fds.push_back(fd);
    }
    // Owned (and undone on failure) from here on.
    auto made = std::make_unique<RestoreCgroup>(std::move(dirs), std::move(fds));
    if (!failed.ok()) return failed;
    if (!taken) {
      for (UniqueFd& lock : locks) made->lock_fds_.push_back(lock.release());
      return made;
    }
  }
  return Status::Busy("no free cgroup name " + prefix + "-N for a restored tree after " +
                      std::to_string(kMaxNameTries) + " tries");
}

}  // namespace gpuckpt
