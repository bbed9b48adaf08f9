// Tests of core/proc/memory_headroom against fabricated /proc and cgroup
// trees (cgroup v1 and v2, limits at a cgroup and at its ancestors, files
// missing or damaged, paths that try to leave the mount), and a smoke test
// against the real ones.
#include "core/proc/memory_headroom.h"

#include <unistd.h>

#include <cstdint>
#include <string>

#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::MakeDirs;
using ::gpuckpt::testing::TempDir;
using ::gpuckpt::testing::WriteFile;

constexpr uint64_t kMiB = 1 << 20;

// Writes `path`, making its directories first.
void Put(const std::string& path, const std::string& text) {
  MakeDirs(path.substr(0, path.rfind('/')));
  WriteFile(path, text);
}

// What /proc/meminfo starts with on a 24 GiB machine.
constexpr char kMeminfo[] =
    "MemTotal:       24683548 kB\n"
    "MemFree:        21183252 kB\n"
    "MemAvailable:   23848464 kB\n"
    "Buffers:          128812 kB\n"
    "Cached:          2692928 kB\n";

// The mountinfo of a hybrid machine (v1 controllers, v2 at unified/), as on
// the build machine, plus an unrelated mount with an escaped space.
constexpr char kHybridMountinfo[] =
    "22 1 0:21 / / rw,relatime - overlay overlay rw\n"
    "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory\n"
    "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "41 22 0:38 / /mnt/with\\040space rw - ext4 /dev/sda1 rw\n";

// A process's /proc/PID/cgroup on that machine.
constexpr char kHybridProcCgroup[] =
    "9:name=systemd:/\n"
    "4:memory:/process_api/01d942b3\n"
    "3:cpuset:/\n"
    "0::/\n";

TEST(MemAvailable, ParsesKilobytes) {
  ASSERT_OK_AND_ASSIGN(uint64_t available, ParseMemAvailable(kMeminfo));
  EXPECT_EQ(available, uint64_t{23848464} * 1024);
}

TEST(MemAvailable, MissingLineIsNotFound) {
  EXPECT_CODE(ParseMemAvailable("MemTotal: 1000 kB\nMemFree: 500 kB\n"), StatusCode::kNotFound);
  EXPECT_CODE(ParseMemAvailable(""), StatusCode::kNotFound);
  // A line that only starts like it is another field.
  EXPECT_CODE(ParseMemAvailable("XMemAvailable: 5 kB\n"), StatusCode::kNotFound);
}

TEST(MemAvailable, GarbageDoesNotParse) {
  for (const char* text :
       {"MemAvailable: lots kB\n", "MemAvailable:\n", "MemAvailable: -5 kB\n",
        "MemAvailable: 12 34 kB\n", "MemAvailable: 0x10 kB\n", "MemAvailable: 12 MB\n"}) {
    EXPECT_CODE(ParseMemAvailable(text), StatusCode::kIOError) << text;
  }
}

TEST(MemAvailable, HugeValuesDoNotWrapAround) {
  // Fits 64 bits as kB but not as bytes, and does not fit at all.
  EXPECT_CODE(ParseMemAvailable("MemAvailable: 18446744073709551615 kB\n"), StatusCode::kIOError);
  EXPECT_CODE(ParseMemAvailable("MemAvailable: 99999999999999999999999 kB\n"),
              StatusCode::kIOError);
  // The largest that fits.
  ASSERT_OK_AND_ASSIGN(uint64_t available,
                       ParseMemAvailable("MemAvailable: 18014398509481983 kB\n"));
  EXPECT_EQ(available, uint64_t{18014398509481983} * 1024);
}

TEST(MemAvailable, ReadsProcRoot) {
  TempDir dir;
  Put(dir.Sub("meminfo"), kMeminfo);
  ASSERT_OK_AND_ASSIGN(uint64_t available, ReadMemAvailable(dir.path()));
  EXPECT_EQ(available, uint64_t{23848464} * 1024);
  TempDir empty;
  EXPECT_CODE(ReadMemAvailable(empty.path()), StatusCode::kNotFound);
}

TEST(CgroupMounts, HybridHasBoth) {
  const CgroupMounts mounts = ParseCgroupMounts(kHybridMountinfo);
  EXPECT_EQ(mounts.v1_memory_dir, "/sys/fs/cgroup/memory");
  EXPECT_EQ(mounts.v1_memory_root, "/");
  EXPECT_EQ(mounts.v2_dir, "/sys/fs/cgroup/unified");
  EXPECT_EQ(mounts.v2_root, "/");
}

TEST(CgroupMounts, PureV2AndSubtreesAndEscapes) {
  const CgroupMounts mounts = ParseCgroupMounts(
      "25 1 0:22 / / rw - ext4 /dev/root rw\n"
      "26 25 0:23 /kubepods/pod\\0401 /sys/fs/cgroup\\040x rw,nosuid - cgroup2 cgroup2 rw\n");
  EXPECT_EQ(mounts.v1_memory_dir, "");
  EXPECT_EQ(mounts.v2_dir, "/sys/fs/cgroup x");
  EXPECT_EQ(mounts.v2_root, "/kubepods/pod 1");
}

TEST(CgroupMounts, SkipsWhatDoesNotParse) {
  const CgroupMounts mounts = ParseCgroupMounts(
      "garbage\n"
      "1 2 3 4 5 - cgroup2\n"                                        // too short
      "31 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"  // v1, no memory
      "31 30 0:28 / /sys/fs/cgroup/mem rw - cgroup cgroup rw,memoryx\n");
  EXPECT_EQ(mounts.v1_memory_dir, "");
  EXPECT_EQ(mounts.v2_dir, "");
}

TEST(MemoryCgroupLine, PrefersV1MemoryWhereMounted) {
  auto cgroup = ParseMemoryCgroup(kHybridProcCgroup, ParseCgroupMounts(kHybridMountinfo));
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->version, MemoryCgroup::Version::kV1);
  EXPECT_EQ(cgroup->path, "/process_api/01d942b3");
}

TEST(MemoryCgroupLine, V2WhereNoV1MemoryMount) {
  CgroupMounts mounts;
  mounts.v2_dir = "/sys/fs/cgroup";
  auto cgroup = ParseMemoryCgroup(kHybridProcCgroup, mounts);
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->version, MemoryCgroup::Version::kV2);
  EXPECT_EQ(cgroup->path, "/");
  // A path holding ':' is taken whole.
  cgroup = ParseMemoryCgroup("0::/user.slice/app:1.scope\n", mounts);
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->path, "/user.slice/app:1.scope");
  // Controllers listed together.
  mounts.v1_memory_dir = "/m";
  cgroup = ParseMemoryCgroup("5:cpu,memory,hugetlb:/job\n0::/other\n", mounts);
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->version, MemoryCgroup::Version::kV1);
  EXPECT_EQ(cgroup->path, "/job");
}

TEST(MemoryCgroupLine, NoneWithoutMountOrLine) {
  EXPECT_FALSE(ParseMemoryCgroup(kHybridProcCgroup, CgroupMounts{}).has_value());
  CgroupMounts mounts;
  mounts.v2_dir = "/sys/fs/cgroup";
  EXPECT_FALSE(ParseMemoryCgroup("4:memory:/x\n", mounts).has_value());
  EXPECT_FALSE(ParseMemoryCgroup("garbage\n", mounts).has_value());
}

TEST(MemoryCgroupLine, PathsThatLeaveTheHierarchyAreRefused) {
  CgroupMounts mounts;
  mounts.v2_dir = "/sys/fs/cgroup";
  // What a process outside the reader's cgroup namespace shows, and worse.
  for (const char* line : {"0::/../../sibling\n", "0::/a/../../etc\n", "0::relative\n",
                           "0::/a//b\n", "0::/a/./b\n", "0::\n"}) {
    EXPECT_FALSE(ParseMemoryCgroup(line, mounts).has_value()) << line;
  }
}

TEST(CgroupPath, Safety) {
  EXPECT_TRUE(IsSafeCgroupPath("/"));
  EXPECT_TRUE(IsSafeCgroupPath("/a/b.scope/..c"));
  EXPECT_FALSE(IsSafeCgroupPath(""));
  EXPECT_FALSE(IsSafeCgroupPath(".."));
  EXPECT_FALSE(IsSafeCgroupPath("/.."));
  EXPECT_FALSE(IsSafeCgroupPath("/a/.."));
  EXPECT_FALSE(IsSafeCgroupPath("/a/"));
  EXPECT_FALSE(IsSafeCgroupPath(std::string("/a\0b", 4)));
  EXPECT_FALSE(IsSafeCgroupPath("/" + std::string(5000, 'a')));
}

// A fabricated cgroup tree: `Set(level, file, text)` writes one file of
// cgroup `level` ("/" for the top).
class CgroupTree {
 public:
  CgroupTree() { MakeDirs(dir_.Sub("mnt")); }
  std::string mount() const { return dir_.Sub("mnt"); }
  void Set(const std::string& level, const std::string& file, const std::string& text) {
    Put((level == "/" ? mount() : mount() + level) + "/" + file, text);
  }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
};

TEST(CgroupLimitsV2, LimitAtTheCgroup) {
  CgroupTree tree;
  tree.Set("/job.slice/a.scope", "memory.max", "1000000000\n");
  tree.Set("/job.slice/a.scope", "memory.current", "400000000\n");
  // Inactive page cache is reclaimed before anything is killed.
  tree.Set("/job.slice/a.scope", "memory.stat",
           "anon 250000000\nfile 150000000\nactive_file 50000000\ninactive_file 100000000\n");
  tree.Set("/job.slice", "memory.max", "max\n");
  tree.Set("/job.slice", "memory.current", "900000000\n");
  CgroupMounts mounts;
  mounts.v2_dir = tree.mount();
  const CgroupLimits limits =
      ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/job.slice/a.scope"});
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(limits[0].cgroup, "/job.slice/a.scope");
  EXPECT_EQ(limits[0].limit_bytes, 1000000000u);
  EXPECT_EQ(limits[0].used_bytes, 300000000u);
  EXPECT_EQ(HeadroomOf(limits), 700000000u);
}

TEST(CgroupLimitsV2, TighterLimitAtAnAncestor) {
  CgroupTree tree;
  tree.Set("/job.slice/a.scope", "memory.max", "1000000000\n");
  tree.Set("/job.slice/a.scope", "memory.current", "100000000\n");
  tree.Set("/job.slice", "memory.max", "500000000\n");
  tree.Set("/job.slice", "memory.current", "450000000\n");
  tree.Set("/", "memory.max", "100\n");  // v2 has none at the top; ignored only if absent
  CgroupMounts mounts;
  mounts.v2_dir = tree.mount();
  const CgroupLimits limits =
      ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/job.slice/a.scope"});
  ASSERT_EQ(limits.size(), 3u);
  EXPECT_EQ(limits[0].cgroup, "/job.slice/a.scope");
  EXPECT_EQ(limits[1].cgroup, "/job.slice");
  EXPECT_EQ(limits[1].headroom_bytes(), 50000000u);
  EXPECT_EQ(limits[2].cgroup, "/");
  // The top's limit (100 bytes, no usage file: counted as 0) is least.
  EXPECT_EQ(HeadroomOf(limits), 100u);
}

TEST(CgroupLimitsV2, UsageAboveLimitLeavesNothing) {
  CgroupTree tree;
  tree.Set("/a", "memory.max", "1000\n");
  tree.Set("/a", "memory.current", "5000\n");
  CgroupMounts mounts;
  mounts.v2_dir = tree.mount();
  const CgroupLimits limits = ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/a"});
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(HeadroomOf(limits), 0u);
}

TEST(CgroupLimitsV2, MissingOrDamagedFilesMeanNoLimit) {
  CgroupTree tree;
  tree.Set("/a/b", "memory.current", "5000\n");  // no memory.max
  tree.Set("/a", "memory.max", "lots\n");
  tree.Set("/a", "memory.current", "5000\n");
  CgroupMounts mounts;
  mounts.v2_dir = tree.mount();
  EXPECT_TRUE(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/a/b"}).empty());
  // A cgroup that is not there at all (another mount namespace).
  EXPECT_TRUE(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/gone/x"}).empty());
  EXPECT_FALSE(HeadroomOf({}).has_value());
  // A limit whose usage cannot be read still bounds what fits.
  tree.Set("/c", "memory.max", "7000\n");
  const CgroupLimits limits = ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/c"});
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(HeadroomOf(limits), 7000u);
  // No v2 mount: nothing is read.
  EXPECT_TRUE(ReadCgroupLimits(CgroupMounts{}, {MemoryCgroup::Version::kV2, "/c"}).empty());
}

TEST(CgroupLimitsV2, PathsWithDotDotAreNotRead) {
  CgroupTree tree;
  // A limit outside the mount, where "/../outside" would lead.
  MakeDirs(tree.dir().Sub("outside"));
  Put(tree.dir().Sub("outside/memory.max"), "1\n");
  tree.Set("/a", "memory.max", "1000\n");
  CgroupMounts mounts;
  mounts.v2_dir = tree.mount();
  EXPECT_TRUE(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/../outside"}).empty());
  EXPECT_TRUE(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/a/../../outside"}).empty());
  // Through /proc too.
  Put(tree.dir().Sub("proc/77/cgroup"), "0::/../outside\n");
  MemoryReadOptions options;
  options.proc_root = tree.dir().Sub("proc");
  options.cgroup_mounts = mounts;
  EXPECT_TRUE(ReadProcessMemoryLimits("77", options).empty());
  // A "pid" that is a path is not read either.
  Put(tree.dir().Sub("proc/cgroup"), "0::/a\n");
  EXPECT_TRUE(ReadProcessMemoryLimits("../proc", options).empty());
  EXPECT_TRUE(ReadProcessMemoryLimits("", options).empty());
}

TEST(CgroupLimitsV2, MountOfASubtree) {
  // A container sees only its own subtree, mounted at the top.
  CgroupTree tree;
  tree.Set("/", "memory.max", "8000000\n");
  tree.Set("/", "memory.current", "1000000\n");
  tree.Set("/worker", "memory.max", "max\n");
  CgroupMounts mounts;
  mounts.v2_dir = tree.mount();
  mounts.v2_root = "/kubepods/pod1";
  CgroupLimits limits =
      ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/kubepods/pod1/worker"});
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(limits[0].cgroup, "/kubepods/pod1");
  EXPECT_EQ(HeadroomOf(limits), 7000000u);
  limits = ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/kubepods/pod1"});
  ASSERT_EQ(limits.size(), 1u);
  // A cgroup outside the mounted subtree cannot be seen (nor one that
  // merely starts with the same letters).
  EXPECT_TRUE(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/kubepods/pod2"}).empty());
  EXPECT_TRUE(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV2, "/kubepods/pod10"}).empty());
}

TEST(CgroupLimitsV1, LimitAtTheCgroupAndUnlimitedAbove) {
  CgroupTree tree;
  // v1's "no limit": the largest page counter, 2^63 less a page.
  tree.Set("/", "memory.limit_in_bytes", "9223372036854771712\n");
  tree.Set("/", "memory.usage_in_bytes", "5000000000\n");
  tree.Set("/process_api", "memory.limit_in_bytes", "9223372036854771712\n");
  tree.Set("/process_api/x", "memory.limit_in_bytes", std::to_string(200 * kMiB) + "\n");
  tree.Set("/process_api/x", "memory.usage_in_bytes", std::to_string(80 * kMiB) + "\n");
  // total_* counts the subtree, as usage_in_bytes does; the cgroup's own
  // inactive_file is not what to subtract.
  tree.Set(
      "/process_api/x", "memory.stat",
      "cache 0\ninactive_file 999999999\ntotal_inactive_file " + std::to_string(30 * kMiB) + "\n");
  CgroupMounts mounts;
  mounts.v1_memory_dir = tree.mount();
  const CgroupLimits limits =
      ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV1, "/process_api/x"});
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(limits[0].cgroup, "/process_api/x");
  EXPECT_EQ(limits[0].limit_bytes, 200 * kMiB);
  EXPECT_EQ(limits[0].used_bytes, 50 * kMiB);
  EXPECT_EQ(HeadroomOf(limits), 150 * kMiB);
}

TEST(CgroupLimitsV1, AncestorLimitAndUsageAboveIt) {
  CgroupTree tree;
  tree.Set("/a/b", "memory.limit_in_bytes", std::to_string(1000 * kMiB));
  tree.Set("/a/b", "memory.usage_in_bytes", std::to_string(10 * kMiB));
  tree.Set("/a", "memory.limit_in_bytes", std::to_string(100 * kMiB));
  tree.Set("/a", "memory.usage_in_bytes", std::to_string(120 * kMiB));
  CgroupMounts mounts;
  mounts.v1_memory_dir = tree.mount();
  const CgroupLimits limits = ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV1, "/a/b"});
  ASSERT_EQ(limits.size(), 2u);
  EXPECT_EQ(limits[0].headroom_bytes(), 990 * kMiB);
  EXPECT_EQ(limits[1].cgroup, "/a");
  EXPECT_EQ(HeadroomOf(limits), 0u);
  // v2's files mean nothing to a v1 hierarchy.
  tree.Set("/a/b", "memory.max", "1\n");
  EXPECT_EQ(HeadroomOf(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV1, "/a/b"})), 0u);
  EXPECT_EQ(ReadCgroupLimits(mounts, {MemoryCgroup::Version::kV1, "/a/b"}).size(), 2u);
}

TEST(ProcessMemoryLimits, ThroughAFabricatedProc) {
  // proc/self/mountinfo names the fabricated mounts; proc/123/cgroup the
  // process's cgroup in each hierarchy.
  CgroupTree v1;
  v1.Set("/jobs/123", "memory.limit_in_bytes", std::to_string(64 * kMiB));
  v1.Set("/jobs/123", "memory.usage_in_bytes", std::to_string(16 * kMiB));
  CgroupTree v2;
  v2.Set("/jobs/123", "memory.max", "1\n");  // not the memory hierarchy here
  TempDir proc;
  Put(proc.Sub("self/mountinfo"), "34 30 0:31 / " + v1.mount() + " rw - cgroup cgroup rw,memory\n" +
                                      "40 30 0:37 / " + v2.mount() + " rw - cgroup2 cgroup2 rw\n");
  Put(proc.Sub("123/cgroup"), "4:memory:/jobs/123\n0::/jobs/123\n");
  Put(proc.Sub("self/cgroup"), "4:memory:/\n0::/\n");
  MemoryReadOptions options;
  options.proc_root = proc.path();
  const CgroupLimits limits = ReadProcessMemoryLimits("123", options);
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(limits[0].cgroup, "/jobs/123");
  EXPECT_EQ(HeadroomOf(limits), 48 * kMiB);
  EXPECT_TRUE(ReadProcessMemoryLimits("self", options).empty());
  // A process whose cgroup file is gone (it exited).
  EXPECT_TRUE(ReadProcessMemoryLimits("124", options).empty());
}

TEST(ProcessMemoryLimits, RealProcDoesNotFail) {
  // Whatever this machine has: the reads must not fail or hang, and a
  // limit seen must be a sane one.
  for (const auto& limit : ReadProcessMemoryLimits("self")) {
    EXPECT_GT(limit.limit_bytes, 0u) << limit.cgroup;
    EXPECT_TRUE(IsSafeCgroupPath(limit.cgroup)) << limit.cgroup;
  }
  for (const auto& limit : ReadProcessMemoryLimits(std::to_string(getpid()))) {
    EXPECT_GT(limit.limit_bytes, 0u) << limit.cgroup;
  }
  ASSERT_OK_AND_ASSIGN(uint64_t available, ReadMemAvailable());
  EXPECT_GT(available, 0u);
}

}  // namespace
}  // namespace gpuckpt
