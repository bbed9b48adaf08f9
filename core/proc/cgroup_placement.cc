#include "core/proc/cgroup_placement.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <optional>
#include <set>

#include "core/base/small_file.h"
#include "core/base/unique_fd.h"
#include "core/proc/memory_headroom.h"

namespace gpuckpt {
namespace {

// How many names MakeRestoreCgroup tries before giving up: each taken one
// belongs to a tree still running.
constexpr int kMaxNameTries = 1000;
// /proc/PID/cgroup: a line per hierarchy, each path at most a page or so.
constexpr size_t kMaxProcCgroupBytes = 256 << 10;
constexpr size_t kMaxCgroupFileBytes = 64 << 10;

// One line of /proc/PID/cgroup: "ID:CONTROLLERS:PATH".
struct ProcCgroupLine {
  std::string id;                        // "0" for v2
  std::vector<std::string> controllers;  // "memory", "name=systemd"; none for v2
  std::string path;                      // may hold ':' itself
  bool v2() const { return id == "0" && controllers.empty(); }
};

std::vector<std::string> SplitCommas(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) out.emplace_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::vector<ProcCgroupLine> ParseProcCgroup(std::string_view text) {
  std::vector<ProcCgroupLine> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    lines.push_back({std::string(line.substr(0, first)),
                     SplitCommas(line.substr(first + 1, second - first - 1)),
                     std::string(line.substr(second + 1))});
  }
  return lines;
}

// Whether the cgroup `inner` is `outer` or below it.
bool IsWithin(const std::string& inner, const std::string& outer) {
  if (outer == "/" || inner == outer) return true;
  return inner.size() > outer.size() && inner.starts_with(outer) && inner[outer.size()] == '/';
}

bool MountedReadWrite(const std::string& options) {
  return options == "rw" || options.compare(0, 3, "rw,") == 0;
}

// Whether `m` is a mount of the hierarchy of `line`: cgroup2 for the v2
// line; for a v1 line, a cgroup mount whose options name every controller
// of it (each controller, and each name=, belongs to one hierarchy only).
bool MountsHierarchy(const MountEntry& m, const ProcCgroupLine& line) {
  if (line.v2()) return m.type == "cgroup2";
  if (m.type != "cgroup") return false;
  const std::vector<std::string> options = SplitCommas(m.super_options);
  return std::all_of(line.controllers.begin(), line.controllers.end(), [&](const auto& c) {
    return std::find(options.begin(), options.end(), c) != options.end();
  });
}

// The directory of the cgroup of `line` under `m`, if `m` is a read-write
// mount of its hierarchy that shows it.
std::optional<std::string> DirUnder(const MountEntry& m, const ProcCgroupLine& line) {
  if (!MountedReadWrite(m.options) || !MountsHierarchy(m, line)) return std::nullopt;
  if (!IsSafeCgroupPath(m.root) || !IsWithin(line.path, m.root)) return std::nullopt;
  const std::string below = m.root == "/" ? line.path : line.path.substr(m.root.size());
  return below.empty() || below == "/" ? m.mountpoint : m.mountpoint + below;
}

// "cgroup v2", or "the v1 hierarchy cpu,cpuacct", for messages.
std::string HierarchyName(const ProcCgroupLine& line) {
  if (line.v2()) return "cgroup v2";
  std::string names;
  for (const std::string& c : line.controllers) names += (names.empty() ? "" : ",") + c;
  return "the v1 hierarchy " + names;
}

// A v1 hierarchy of named ones only (name=systemd): it has no limit to
// escape.
bool HasNoController(const ProcCgroupLine& line) {
  return !line.v2() && std::all_of(line.controllers.begin(), line.controllers.end(),
                                   [](const auto& c) { return c.starts_with("name="); });
}

// Where a hierarchy with no usable mount leaves the tree: in the daemon's
// cgroup, which is fine only when that is within the restorer's.
Status CheckStaysWithin(const ProcCgroupLine& line, const std::vector<ProcCgroupLine>& daemon) {
  if (HasNoController(line)) return Status::Ok();
  for (const ProcCgroupLine& own : daemon) {
    if (own.id == line.id && IsSafeCgroupPath(own.path) && IsWithin(own.path, line.path))
      return Status::Ok();
  }
  return Status::Unavailable(
      "cannot place the restored tree below the restoring process's cgroup " + line.path + " of " +
      HierarchyName(line) +
      ": gpuckptfs has no read-write mount of that hierarchy that shows it, and its own cgroup "
      "there is not within it, so the tree would escape that cgroup's limits");
}

// --- Sweeping emptied cgroups ---------------------------------------------------

// Parents where this process has seen a cgroup of gpuckpt's still holding
// a tree; every placement sweeps them.
struct LeftParents {
  std::mutex mu;
  std::set<std::string> dirs;
};

LeftParents& Left() {
  static LeftParents left;
  return left;
}

// Removes the cgroups gpuckpt made under `parent` whose trees have gone:
// rmdir of a cgroup that still holds a process (or a child cgroup) fails
// with EBUSY, so only empty ones go; one whose RestoreCgroup lives (in this
// daemon or another) is flock()ed shared and skipped. Returns whether any
// of gpuckpt's is left there.
bool SweepEmptied(const std::string& parent) {
  DIR* d = opendir(parent.c_str());
  if (d == nullptr) return false;  // gone with everything below it
  bool left = false;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (e->d_type != DT_DIR || !name.starts_with(kRestoreCgroupPrefix)) continue;
    const std::string dir = parent + "/" + name;
    UniqueFd lock(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (lock.get() < 0) continue;  // removed meanwhile
    if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0 || (rmdir(dir.c_str()) != 0 && errno != ENOENT))
      left = true;
  }
  closedir(d);
  return left;
}

// Sweeps the parents of `places` and those left before, and keeps in the
// set those where a cgroup of gpuckpt's is left (an earlier daemon's too).
// Under the mutex, so that a RestoreCgroup going meanwhile does not have
// its parent forgotten.
void SweepAll(const std::vector<RestoreCgroupPlace>& places) {
  LeftParents& left = Left();
  std::lock_guard<std::mutex> hold(left.mu);
  for (const RestoreCgroupPlace& place : places) left.dirs.insert(place.parent);
  for (auto it = left.dirs.begin(); it != left.dirs.end();)
    it = SweepEmptied(*it) ? std::next(it) : left.dirs.erase(it);
}

// --- Making one cgroup ------------------------------------------------------------

// A v1 cpuset cgroup starts with no CPUs and no memory nodes, and takes no
// process until it has some: `dir` gets those of `parent`. Elsewhere (no
// cpuset.cpus file) nothing is done.
Status InheritCpuset(const std::string& parent, const std::string& dir) {
  for (const char* file : {"cpuset.cpus", "cpuset.mems"}) {
    const std::string target = dir + "/" + file;
    if (access(target.c_str(), F_OK) != 0) return Status::Ok();
    auto current = ReadSmallFileNoFollow(target, kMaxCgroupFileBytes);
    if (current.ok() && current->find_first_not_of(" \n") != std::string::npos) continue;
    GPUCKPT_ASSIGN_OR_RETURN(std::string value,
                             ReadSmallFileNoFollow(parent + "/" + file, kMaxCgroupFileBytes));
    UniqueFd fd(open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0 || write(fd.get(), value.data(), value.size()) < 0)
      return StatusFromErrno(errno, "setting " + target);
  }
  return Status::Ok();
}

// Whether the limits of the parent apply to the new cgroup `dir`, and it
// can take processes. v1 memory with use_hierarchy 0 (kernels before 5.11
// allowed it) charges a child to none of its ancestors. A v2 cgroup made
// in a threaded subtree is no domain, and refuses processes.
Status CheckKeepsLimits(const RestoreCgroupPlace& place, const std::string& dir) {
  if (place.v2) {
    auto type = ReadSmallFileNoFollow(dir + "/cgroup.type", kMaxCgroupFileBytes);
    if (type.ok() && *type != "domain\n")
      return Status::Unavailable("the cgroup " + dir + " made for the restored tree is '" +
                                 type->substr(0, type->find('\n')) +
                                 "', not a domain (the restoring process's cgroup is in a "
                                 "threaded subtree), and could take no process");
    return Status::Ok();
  }
  auto hierarchical = ReadSmallFileNoFollow(dir + "/memory.use_hierarchy", kMaxCgroupFileBytes);
  if (hierarchical.ok() && hierarchical->starts_with("0"))
    return Status::Unavailable("memory.use_hierarchy is 0 in " + place.parent +
                               ": its memory limit would not apply to the restored tree below it");
  return InheritCpuset(place.parent, dir);
}

// One cgroup made for a tree, locked against sweeps, and its cgroup.procs.
struct MadeCgroup {
  UniqueFd lock;
  UniqueFd procs;
};

// Makes `dir` in `place`: kAlreadyExists when the name is taken, or when a
// sweep removed it before it was locked (the next name is tried then).
// `*made` says whether the directory is this call's, so that a failure
// after its making still removes it.
Result<MadeCgroup> MakeCgroup(const RestoreCgroupPlace& place, const std::string& dir, bool* made) {
  if (mkdir(dir.c_str(), 0755) != 0) {
    if (errno == EEXIST) return Status::AlreadyExists(dir);
    return StatusFromErrno(errno, "making the cgroup " + dir);
  }
  *made = true;
  UniqueFd lock(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (lock.get() < 0) {
    *made = false;  // swept: the name may be someone else's by now
    return Status::AlreadyExists(dir);
  }
  while (flock(lock.get(), LOCK_SH) != 0)
    if (errno != EINTR) return StatusFromErrno(errno, "locking " + dir);
  // Locked, no sweep removes it any more; one that removed it before
  // leaves a directory without files.
  UniqueFd procs(openat(lock.get(), "cgroup.procs", O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
  if (procs.get() < 0) {
    if (errno != ENOENT && errno != ENODEV)
      return StatusFromErrno(errno, "opening " + dir + "/cgroup.procs");
    *made = false;
    return Status::AlreadyExists(dir);
  }
  GPUCKPT_RETURN_IF_ERROR(CheckKeepsLimits(place, dir));
  return MadeCgroup{std::move(lock), std::move(procs)};
}

// The cgroups named `name` in every place, or kAlreadyExists when one of
// them is taken; on any failure those made are removed again.
Result<std::unique_ptr<RestoreCgroup>> MakeNamed(const std::vector<RestoreCgroupPlace>& places,
                                                 const std::string& name) {
  std::vector<std::string> dirs;
  std::vector<int> procs_fds, lock_fds;
  Status failed = Status::Ok();
  for (const RestoreCgroupPlace& place : places) {
    const std::string dir = place.parent + "/" + name;
    bool made = false;
    Result<MadeCgroup> cgroup = MakeCgroup(place, dir, &made);
    if (made) dirs.push_back(dir);
    if (!cgroup.ok()) {
      failed = cgroup.status();
      break;
    }
    procs_fds.push_back(cgroup->procs.release());
    lock_fds.push_back(cgroup->lock.release());
  }
  // Owned (and undone on failure) from here on.
  auto cgroups =
      std::make_unique<RestoreCgroup>(std::move(dirs), std::move(procs_fds), std::move(lock_fds));
  if (!failed.ok()) return failed;
  return cgroups;
}

// The text of /proc/PID/cgroup of the process that asked for the restore.
Result<std::string> ReadRestorerCgroups(int restorer_pid, const std::string& proc_root) {
  if (restorer_pid <= 0)
    return Status::PermissionDenied(
        "the process that asked for the restore is not in gpuckptfs's pid namespace: its "
        "cgroups, whose limits the restored tree must stay within, are unknown");
  const std::string path = proc_root + "/" + std::to_string(restorer_pid) + "/cgroup";
  auto text = ReadSmallFileNoFollow(path, kMaxProcCgroupBytes);
  if (!text.ok() || text->empty())
    return Status::NoSuchProcess("cannot read the cgroups of process " +
                                 std::to_string(restorer_pid) +
                                 ", which asked for the restore (gone?): the restored tree must "
                                 "stay within their limits");
  return text;
}

}  // namespace

Result<std::vector<RestoreCgroupPlace>> PlanRestoreCgroups(std::string_view restorer,
                                                           std::string_view daemon,
                                                           const std::vector<MountEntry>& mounts) {
  const std::vector<ProcCgroupLine> lines = ParseProcCgroup(restorer);
  if (lines.empty()) return Status::NoSuchProcess("the restoring process is in no cgroup (gone?)");
  const std::vector<ProcCgroupLine> own = ParseProcCgroup(daemon);
  std::vector<RestoreCgroupPlace> places;
  std::set<std::string> ids;
  for (const ProcCgroupLine& line : lines) {
    // Older kernels took a '\n' in a cgroup's name, which could make up a
    // line: a hierarchy named twice is not believed.
    if (!ids.insert(line.id).second)
      return Status::PermissionDenied("the restoring process's cgroups name " +
                                      HierarchyName(line) + " twice");
    if (!IsSafeCgroupPath(line.path))
      return Status::PermissionDenied("the restoring process's cgroup '" + line.path + "' of " +
                                      HierarchyName(line) +
                                      " is outside what gpuckptfs sees (another cgroup namespace)");
    std::optional<std::string> dir;
    for (auto m = mounts.begin(); m != mounts.end() && !dir; ++m) dir = DirUnder(*m, line);
    if (dir) {
      places.push_back({*dir, line.v2()});
    } else {
      GPUCKPT_RETURN_IF_ERROR(CheckStaysWithin(line, own));
    }
  }
  return places;
}

RestoreCgroup::~RestoreCgroup() {
  for (int fd : procs_fds_) close(fd);
  std::set<std::string> busy;  // still holding a tree: swept later
  for (const std::string& dir : dirs_)
    if (rmdir(dir.c_str()) != 0 && errno != ENOENT) busy.insert(dir.substr(0, dir.rfind('/')));
  if (!busy.empty()) {
    LeftParents& left = Left();
    std::lock_guard<std::mutex> hold(left.mu);
    left.dirs.insert(busy.begin(), busy.end());
  }
  for (int fd : lock_fds_) close(fd);  // releases the flocks
}

namespace {

// Where a tree restored for `restorer_pid` goes, as PlanRestoreCgroups
// says for its cgroups as they are now.
Result<std::vector<RestoreCgroupPlace>> PlacesFor(int restorer_pid, const CgroupSources& sources) {
  GPUCKPT_ASSIGN_OR_RETURN(std::string restorer,
                           ReadRestorerCgroups(restorer_pid, sources.proc_root));
  GPUCKPT_ASSIGN_OR_RETURN(
      std::string daemon,
      ReadSmallFileNoFollow(sources.proc_root + "/self/cgroup", kMaxProcCgroupBytes));
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<MountEntry> mounts, ReadMountTable(sources.mountinfo));
  return PlanRestoreCgroups(restorer, daemon, mounts);
}

}  // namespace

Result<std::unique_ptr<RestoreCgroup>> JoinRestorerCgroup(int restorer_pid,
                                                          const CgroupSources& sources) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<RestoreCgroupPlace> places,
                           PlacesFor(restorer_pid, sources));
  std::vector<int> procs_fds;
  for (const RestoreCgroupPlace& place : places) {
    UniqueFd dir(open(place.parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    UniqueFd procs(
        dir.get() < 0 ? -1 : openat(dir.get(), "cgroup.procs", O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    if (procs.get() < 0) {
      for (int fd : procs_fds) close(fd);
      return StatusFromErrno(errno, "opening the cgroup " + place.parent + " to join it");
    }
    procs_fds.push_back(procs.release());
  }
  return std::make_unique<RestoreCgroup>(std::vector<std::string>{}, std::move(procs_fds),
                                         std::vector<int>{});
}

Result<std::unique_ptr<RestoreCgroup>> MakeRestoreCgroup(int restorer_pid, int root_pid,
                                                         const CgroupSources& sources) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<RestoreCgroupPlace> places,
                           PlacesFor(restorer_pid, sources));
  SweepAll(places);
  // A counter shared by all restores of this daemon keeps concurrent ones
  // apart; a name left by an earlier daemon's tree is skipped.
  static std::atomic<uint64_t> next{1};
  const std::string prefix = kRestoreCgroupPrefix + std::to_string(root_pid) + "-";
  for (int attempt = 0; attempt < kMaxNameTries; ++attempt) {
    auto made = MakeNamed(places, prefix + std::to_string(next.fetch_add(1)));
    if (made.ok() || made.status().code() != StatusCode::kAlreadyExists) return made;
  }
  return Status::Busy("no free cgroup name " + prefix + "N for a restored tree after " +
                      std::to_string(kMaxNameTries) + " tries");
}

}  // namespace gpuckpt
