// Tests of core/proc/cgroup_placement: which mounts are hierarchies to
// place a tree in (fabricated mount tables), and, as root on this
// machine's real cgroup filesystems, cgroups made, joined by a child
// through the descriptors CRIU gets, kept while in use and removed once
// empty.
#include "core/proc/cgroup_placement.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

MountEntry Mount(std::string device, std::string root, std::string mountpoint, std::string options,
                 std::string type) {
  return MountEntry{std::move(device),  std::move(root), std::move(mountpoint),
                    std::move(options), std::move(type), "cgroup"};
}

TEST(PlaceableCgroupHierarchiesTest, HierarchyRootsMountedReadWriteOnceEach) {
  const std::vector<MountEntry> mounts = {
      Mount("0:27", "/", "/sys/fs/cgroup", "rw,nosuid", "tmpfs"),
      Mount("0:28", "/", "/sys/fs/cgroup/cpu", "rw,nosuid,nodev", "cgroup"),
      Mount("0:29", "/", "/sys/fs/cgroup/memory", "ro,nosuid", "cgroup"),
      Mount("0:30", "/docker/abc", "/sys/fs/cgroup/pids", "rw", "cgroup"),
      Mount("0:28", "/", "/mnt/cpu-again", "rw", "cgroup"),
      Mount("0:31", "/", "/sys/fs/cgroup/unified", "rw,relatime", "cgroup2"),
      Mount("0:32", "/", "/mnt/rwx", "rwx", "cgroup"),
  };
  const std::vector<CgroupHierarchy> got = PlaceableCgroupHierarchies(mounts);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].mountpoint, "/sys/fs/cgroup/cpu");
  EXPECT_FALSE(got[0].v2);
  EXPECT_EQ(got[1].mountpoint, "/sys/fs/cgroup/unified");
  EXPECT_TRUE(got[1].v2);
}

std::string CgroupsOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool IsDir(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

class RealCgroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make cgroups";
    auto mounts = ReadMountTable();
    ASSERT_TRUE(mounts.ok()) << mounts.status().ToString();
    if (PlaceableCgroupHierarchies(*mounts).empty())
      GTEST_SKIP() << "no cgroup hierarchy is mounted read-write here";
  }
};

TEST_F(RealCgroupsTest, ChildJoinsEveryHierarchyAndEmptiedCgroupsGo) {
  auto cgroup = MakeRestoreCgroup("restore-test-" + std::to_string(getpid()));
  ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
  const std::vector<std::string> dirs = (*cgroup)->dirs();
  ASSERT_FALSE(dirs.empty());
  ASSERT_EQ(dirs.size(), (*cgroup)->procs_fds().size());
  const std::string name = dirs[0].substr(dirs[0].rfind('/') + 1);
  for (const std::string& dir : dirs) {
    EXPECT_TRUE(IsDir(dir)) << dir;
    EXPECT_EQ(dir.substr(dir.rfind('/') + 1), name) << "one name in every hierarchy";
    EXPECT_NE(dir.find(std::string("/") + kRestoredCgroupsDir + "/"), std::string::npos);
  }

  // Another placement meanwhile neither takes the name nor removes the
  // first one's cgroups, empty as they are until CRIU joins them.
  auto other = MakeRestoreCgroup("restore-test-" + std::to_string(getpid()));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE((*other)->dirs()[0], dirs[0]);
  for (const std::string& dir : dirs) EXPECT_TRUE(IsDir(dir)) << dir;
  const std::vector<std::string> other_dirs = (*other)->dirs();
  other->reset();
  for (const std::string& dir : other_dirs) EXPECT_FALSE(IsDir(dir)) << "empty: removed";

  // A child joins them as CRIU's does: "0" to each cgroup.procs.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (int fd : (*cgroup)->procs_fds())
      if (write(fd, "0", 1) != 1) _exit(1);
    char c;
    _exit(read(go[0], &c, 1) == 1 ? 0 : 2);
  }
  close(go[0]);
  // Until it has joined, its cgroups are its parent's; it joins them one
  // after the other, so wait until it is in all of them (or 5 s).
  auto joined_count = [&](const std::string& theirs) {
    std::istringstream lines(theirs);
    size_t in_it = 0;
    for (std::string line; std::getline(lines, line);)
      if (line.size() > name.size() &&
          line.compare(line.size() - name.size(), name.size(), name) == 0)
        ++in_it;
    return in_it;
  };
  std::string theirs = CgroupsOf(child);
  for (int i = 0; i < 500 && joined_count(theirs) < dirs.size(); ++i) {
    usleep(10000);
    theirs = CgroupsOf(child);
  }
  EXPECT_EQ(joined_count(theirs), dirs.size()) << theirs;

  // In use: the RestoreCgroup going leaves them.
  cgroup->reset();
  for (const std::string& dir : dirs) EXPECT_TRUE(IsDir(dir)) << dir;
  ASSERT_EQ(write(go[1], "x", 1), 1);
  close(go[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  // Emptied: the next placement removes them (unless a restore elsewhere
  // holds the lock then: tried again).
  bool removed = false;
  for (int i = 0; i < 100 && !removed; ++i) {
    auto next = MakeRestoreCgroup("restore-test-" + std::to_string(getpid()));
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    removed = true;
    for (const std::string& dir : dirs) removed = removed && !IsDir(dir);
    if (!removed) usleep(100000);
  }
  EXPECT_TRUE(removed) << dirs[0];
}

}  // namespace
}  // namespace gpuckpt
