// Tests of core/proc/cgroup_placement: where a restored tree is placed for
// a restoring process (fabricated /proc/PID/cgroup texts and mount tables:
// hybrid v1/v2, pure v2, subtree and read-only mounts, cgroups outside the
// daemon's view), restores refused when the restorer is unknown or gone,
// and, as root on this machine's real cgroup filesystems, cgroups made
// below the restorer's, joined by a child through the descriptors CRIU
// gets, kept while in use and removed once empty.
#include "core/proc/cgroup_placement.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;
using ::gpuckpt::testing::WriteFile;

// This machine's kind of layout: v1 controllers and a named hierarchy,
// plus the v2 hierarchy mounted at unified/, as mountinfo says it.
constexpr char kHybridMountinfo[] =
    "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "33 30 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
    "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n";

// A pure v2 host, as systemd sets it up.
constexpr char kV2Mountinfo[] =
    "25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

std::vector<MountEntry> Mounts(const std::string& mountinfo) {
  TempDir dir("gpuckpt-cgroup-placement");
  WriteFile(dir.Sub("mountinfo"), mountinfo);
  auto mounts = ReadMountTable(dir.Sub("mountinfo"));
  EXPECT_TRUE(mounts.ok()) << mounts.status().ToString();
  return mounts.ok() ? *mounts : std::vector<MountEntry>{};
}

std::vector<std::string> Parents(const std::vector<RestoreCgroupPlace>& places) {
  std::vector<std::string> out;
  for (const auto& p : places) out.push_back(p.parent + (p.v2 ? " (v2)" : ""));
  return out;
}

TEST(MountTableTest, SuperOptionsNameAHierarchysControllers) {
  const std::vector<MountEntry> mounts = Mounts(kHybridMountinfo);
  ASSERT_EQ(mounts.size(), 7u);
  EXPECT_EQ(mounts[1].super_options, "rw,cpu,cpuacct");
  EXPECT_EQ(mounts[5].super_options, "rw,xattr,name=systemd");
  EXPECT_EQ(mounts[6].type, "cgroup2");
}

TEST(PlanRestoreCgroupsTest, HybridBelowTheRestorersCgroupInEveryHierarchy) {
  const std::string restorer =
      "9:name=systemd:/user.slice/user-1000.slice/session-3.scope\n"
      "8:pids:/batch/job7\n"
      "4:memory:/batch/job7\n"
      "3:cpuset:/\n"
      "1:cpu,cpuacct:/batch\n"
      "0::/user.slice/user-1000.slice/session-3.scope\n";
  const std::string daemon =
      "9:name=systemd:/system.slice/gpuckptfs.service\n8:pids:/\n4:memory:/\n3:cpuset:/\n"
      "1:cpu,cpuacct:/\n0::/system.slice/gpuckptfs.service\n";
  ASSERT_OK_AND_ASSIGN(auto places, PlanRestoreCgroups(restorer, daemon, Mounts(kHybridMountinfo)));
  EXPECT_EQ(Parents(places),
            (std::vector<std::string>{
                "/sys/fs/cgroup/systemd/user.slice/user-1000.slice/session-3.scope",
                "/sys/fs/cgroup/pids/batch/job7",
                "/sys/fs/cgroup/memory/batch/job7",
                "/sys/fs/cgroup/cpuset",
                "/sys/fs/cgroup/cpu,cpuacct/batch",
                "/sys/fs/cgroup/unified/user.slice/user-1000.slice/session-3.scope (v2)",
            }));
}

TEST(PlanRestoreCgroupsTest, PureV2SessionAndHierarchyRoot) {
  const std::string daemon = "0::/system.slice/gpuckptfs.service\n";
  ASSERT_OK_AND_ASSIGN(
      auto places, PlanRestoreCgroups("0::/user.slice/user-1000.slice/session-3.scope\n", daemon,
                                      Mounts(kV2Mountinfo)));
  EXPECT_EQ(
      Parents(places),
      (std::vector<std::string>{"/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope (v2)"}));
  // A restorer in the root: a child of the root, as before.
  ASSERT_OK_AND_ASSIGN(places, PlanRestoreCgroups("0::/\n", daemon, Mounts(kV2Mountinfo)));
  EXPECT_EQ(Parents(places), (std::vector<std::string>{"/sys/fs/cgroup (v2)"}));
}

TEST(PlanRestoreCgroupsTest, SubtreeMountShowsOnlyWhatLiesBelowItsRoot) {
  const std::vector<MountEntry> mounts = Mounts(
      "34 30 0:31 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n");
  ASSERT_OK_AND_ASSIGN(auto places, PlanRestoreCgroups("4:memory:/docker/abc/job\n",
                                                       "4:memory:/docker/abc\n", mounts));
  EXPECT_EQ(Parents(places), (std::vector<std::string>{"/sys/fs/cgroup/memory/job"}));
  ASSERT_OK_AND_ASSIGN(
      places, PlanRestoreCgroups("4:memory:/docker/abc\n", "4:memory:/docker/abc\n", mounts));
  EXPECT_EQ(Parents(places), (std::vector<std::string>{"/sys/fs/cgroup/memory"}));
  // Outside the mount's subtree, and the daemon's cgroup not within the
  // restorer's: the tree would escape its memory limit.
  auto outside = PlanRestoreCgroups("4:memory:/docker/other\n", "4:memory:/docker/abc\n", mounts);
  ASSERT_CODE(outside, StatusCode::kUnavailable);
  EXPECT_NE(outside.status().message().find("memory"), std::string::npos)
      << outside.status().ToString();
  EXPECT_NE(outside.status().message().find("/docker/other"), std::string::npos)
      << outside.status().ToString();
}

TEST(PlanRestoreCgroupsTest, ReadOnlyOrUnmountedHierarchyOnlyWhereNothingEscapes) {
  const std::vector<MountEntry> mounts = Mounts(
      "34 30 0:31 / /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory\n"
      "39 30 0:36 / /sys/fs/cgroup/systemd ro,relatime - cgroup cgroup rw,name=systemd\n");
  // The daemon's own memory cgroup is below the restorer's: the tree stays
  // in it, within the restorer's limits. Named hierarchies have none.
  ASSERT_OK_AND_ASSIGN(auto places,
                       PlanRestoreCgroups("9:name=systemd:/user\n4:memory:/job\n",
                                          "9:name=systemd:/sys\n4:memory:/job/d\n", mounts));
  EXPECT_TRUE(places.empty()) << Parents(places)[0];
  // Beside it: refused, naming the hierarchy.
  auto beside = PlanRestoreCgroups("4:memory:/job\n", "4:memory:/\n", mounts);
  ASSERT_CODE(beside, StatusCode::kUnavailable);
  EXPECT_NE(beside.status().message().find("the v1 hierarchy memory"), std::string::npos)
      << beside.status().ToString();
  // A hierarchy mounted nowhere (pids here) is judged the same way.
  EXPECT_OK(PlanRestoreCgroups("8:pids:/\n", "8:pids:/\n", mounts));
  EXPECT_CODE(PlanRestoreCgroups("8:pids:/job\n", "8:pids:/other\n", mounts),
              StatusCode::kUnavailable);
  EXPECT_CODE(PlanRestoreCgroups("0::/job\n", "", mounts), StatusCode::kUnavailable);
}

TEST(PlanRestoreCgroupsTest, CgroupOutsideTheDaemonsViewOrNoneIsRefused) {
  const std::vector<MountEntry> mounts = Mounts(kV2Mountinfo);
  // Another cgroup namespace's process: its path climbs out of ours.
  EXPECT_CODE(PlanRestoreCgroups("0::/../../user.slice\n", "0::/\n", mounts),
              StatusCode::kPermissionDenied);
  EXPECT_CODE(PlanRestoreCgroups("0::/a/./b\n", "0::/\n", mounts), StatusCode::kPermissionDenied);
  EXPECT_CODE(PlanRestoreCgroups("", "0::/\n", mounts), StatusCode::kNoSuchProcess);
  // A line made up by a cgroup name with a newline (older kernels took
  // one): the v2 hierarchy named twice, the second time at its root.
  EXPECT_CODE(PlanRestoreCgroups("0::/user.slice/x\n0::/\n", "0::/\n", mounts),
              StatusCode::kPermissionDenied);
}

TEST(MakeRestoreCgroupTest, UnknownOrGoneRestorerIsRefused) {
  TempDir proc("gpuckpt-cgroup-proc");
  ASSERT_EQ(mkdir(proc.Sub("self").c_str(), 0755), 0);
  WriteFile(proc.Sub("self/cgroup"), "0::/\n");
  WriteFile(proc.Sub("mountinfo"), kV2Mountinfo);
  const CgroupSources sources{proc.path(), proc.Sub("mountinfo")};
  // pid 0: the writer is in a pid namespace the daemon does not see.
  auto unknown = MakeRestoreCgroup(0, 42, sources);
  ASSERT_CODE(unknown, StatusCode::kPermissionDenied);
  EXPECT_NE(unknown.status().message().find("pid namespace"), std::string::npos)
      << unknown.status().ToString();
  // No /proc/4242: gone.
  auto gone = MakeRestoreCgroup(4242, 42, sources);
  ASSERT_CODE(gone, StatusCode::kNoSuchProcess);
  EXPECT_NE(gone.status().message().find("4242"), std::string::npos) << gone.status().ToString();
  // Its cgroup outside what the daemon sees.
  ASSERT_EQ(mkdir(proc.Sub("4243").c_str(), 0755), 0);
  WriteFile(proc.Sub("4243/cgroup"), "0::/../elsewhere\n");
  EXPECT_CODE(MakeRestoreCgroup(4243, 42, sources), StatusCode::kPermissionDenied);
}

// --- On this machine's cgroups, as root ---------------------------------------------

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// {hierarchy id: path} of /proc/PID/cgroup.
std::map<std::string, std::string> CgroupsOf(pid_t pid) {
  std::map<std::string, std::string> out;
  std::istringstream lines(ReadText("/proc/" + std::to_string(pid) + "/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    out[line.substr(0, first)] = line.substr(second + 1);
  }
  return out;
}

bool IsDir(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A child that joins the cgroups whose cgroup.procs are `fds` (as CRIU's
// does: "0" to each), then waits until Release().
class Joiner {
 public:
  explicit Joiner(const std::vector<int>& fds) {
    if (pipe(go_) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      for (int fd : fds)
        if (write(fd, "0", 1) != 1) _exit(1);
      char c;
      _exit(read(go_[0], &c, 1) == 1 ? 0 : 2);
    }
    close(go_[0]);
  }
  ~Joiner() { Release(); }
  pid_t pid() const { return pid_; }
  // Until it has joined, its cgroups are its parent's; it joins them one
  // after the other: waits (up to 5 s) until `count` of them end in `name`.
  size_t WaitJoined(const std::string& name, size_t count) const {
    size_t in_it = 0;
    for (int i = 0; i < 500; ++i) {
      in_it = 0;
      for (const auto& [id, path] : CgroupsOf(pid_))
        if (path.size() > name.size() && path.ends_with("/" + name)) ++in_it;
      if (in_it >= count) break;
      usleep(10000);
    }
    return in_it;
  }
  // Lets it exit; its exit status (0: it joined every one).
  int Release() {
    if (pid_ <= 0) return -1;
    if (write(go_[1], "x", 1) != 1) kill(pid_, SIGKILL);
    close(go_[1]);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }

 private:
  int go_[2] = {-1, -1};
  pid_t pid_ = -1;
};

class RealCgroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make cgroups";
    auto mounts = ReadMountTable();
    ASSERT_TRUE(mounts.ok()) << mounts.status().ToString();
    const std::string self = ReadText("/proc/self/cgroup");
    auto places = PlanRestoreCgroups(self, self, *mounts);
    ASSERT_TRUE(places.ok()) << places.status().ToString();
    if (places->empty()) GTEST_SKIP() << "no cgroup hierarchy is mounted read-write here";
    own_ = *places;
  }

  // Where this process's trees go: its own cgroups' directories.
  std::vector<RestoreCgroupPlace> own_;
};

TEST_F(RealCgroupsTest, ChildJoinsEveryHierarchyAndEmptiedCgroupsGo) {
  auto cgroup = MakeRestoreCgroup(getpid(), getpid());
  ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
  const std::vector<std::string> dirs = (*cgroup)->dirs();
  ASSERT_EQ(dirs.size(), own_.size());
  ASSERT_EQ(dirs.size(), (*cgroup)->procs_fds().size());
  const std::string name = dirs[0].substr(dirs[0].rfind('/') + 1);
  EXPECT_TRUE(name.starts_with(kRestoreCgroupPrefix + std::to_string(getpid()) + "-")) << name;
  for (size_t i = 0; i < dirs.size(); ++i) {
    EXPECT_TRUE(IsDir(dirs[i])) << dirs[i];
    EXPECT_EQ(dirs[i], own_[i].parent + "/" + name) << "right below this process's own cgroup";
  }

  // Another placement meanwhile neither takes the name nor removes the
  // first one's cgroups, empty as they are until CRIU joins them.
  auto other = MakeRestoreCgroup(getpid(), getpid());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE((*other)->dirs()[0], dirs[0]);
  for (const std::string& dir : dirs) EXPECT_TRUE(IsDir(dir)) << dir;
  const std::vector<std::string> other_dirs = (*other)->dirs();
  other->reset();
  for (const std::string& dir : other_dirs) EXPECT_FALSE(IsDir(dir)) << "empty: removed";

  Joiner child((*cgroup)->procs_fds());
  ASSERT_GT(child.pid(), 0);
  EXPECT_EQ(child.WaitJoined(name, dirs.size()), dirs.size())
      << ReadText("/proc/" + std::to_string(child.pid()) + "/cgroup");

  // In use: the RestoreCgroup going leaves them.
  cgroup->reset();
  for (const std::string& dir : dirs) EXPECT_TRUE(IsDir(dir)) << dir;
  ASSERT_EQ(child.Release(), 0);

  // Emptied: the next placement removes them (unless one elsewhere holds
  // a lock on them then: tried again).
  bool removed = false;
  for (int i = 0; i < 100 && !removed; ++i) {
    auto next = MakeRestoreCgroup(getpid(), getpid());
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    removed = true;
    for (const std::string& dir : dirs) removed = removed && !IsDir(dir);
    if (!removed) usleep(100000);
  }
  EXPECT_TRUE(removed) << dirs[0];
}

// A cgroup below this process's own in every place, removed afterwards.
class ConfinedCgroup {
 public:
  ConfinedCgroup(const std::vector<RestoreCgroupPlace>& places, const std::string& name) {
    for (const RestoreCgroupPlace& place : places) {
      const std::string dir = place.parent + "/" + name;
      if (mkdir(dir.c_str(), 0755) != 0) continue;
      dirs_.push_back(dir);
      for (const char* file : {"cpuset.cpus", "cpuset.mems"})
        if (IsDir(dir) && access((dir + "/" + file).c_str(), F_OK) == 0)
          WriteFile(dir + "/" + file, ReadText(place.parent + "/" + file));
    }
  }
  ~ConfinedCgroup() {
    for (const std::string& dir : dirs_) rmdir(dir.c_str());
  }
  const std::vector<std::string>& dirs() const { return dirs_; }
  std::vector<int> ProcsFds() const {
    std::vector<int> fds;
    for (const std::string& dir : dirs_)
      fds.push_back(open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    return fds;
  }

 private:
  std::vector<std::string> dirs_;
};

TEST_F(RealCgroupsTest, TreeGoesBelowAnotherRestorersCgroupNotTheDaemons) {
  const std::string tag = std::to_string(getpid());
  ConfinedCgroup job(own_, "gpuckpt-unit-job-" + tag);
  ASSERT_EQ(job.dirs().size(), own_.size());
  const std::vector<int> fds = job.ProcsFds();
  Joiner restorer(fds);
  for (int fd : fds) close(fd);
  ASSERT_EQ(restorer.WaitJoined("gpuckpt-unit-job-" + tag, own_.size()), own_.size());

  {
    auto cgroup = MakeRestoreCgroup(restorer.pid(), 7);
    ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
    ASSERT_EQ((*cgroup)->dirs().size(), own_.size());
    for (size_t i = 0; i < own_.size(); ++i) {
      const std::string& dir = (*cgroup)->dirs()[i];
      EXPECT_EQ(dir.substr(0, dir.rfind('/')), job.dirs()[i]) << dir;
      EXPECT_TRUE(
          dir.substr(dir.rfind('/') + 1).starts_with(std::string(kRestoreCgroupPrefix) + "7-"))
          << dir;
    }
  }
  ASSERT_EQ(restorer.Release(), 0);
}

}  // namespace
}  // namespace gpuckpt
