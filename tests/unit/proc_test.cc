// Tests of core/proc against the real /proc (forked children in known
// states) and against fabricated /proc trees (malformed files, thousands of
// processes).
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/base/unique_fd.h"
#include "core/proc/acting_as.h"
#include "core/proc/caller.h"
#include "core/proc/mount_table.h"
#include "core/proc/process_info.h"
#include "core/proc/process_table.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::MakeDirs;
using ::gpuckpt::testing::TempDir;
using ::gpuckpt::testing::WriteFile;

// A forked child running `body`, killed (with its process group) and reaped
// when the object goes. `body` gets a pipe to report on: writing to it, or
// exec (the descriptor is close-on-exec), tells WaitReady() the child is set.
class Child {
 public:
  explicit Child(const std::function<void(int report_fd)>& body) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      body(fds[1]);
      for (;;) pause();
    }
    close(fds[1]);
    report_fd_ = fds[0];
  }
  ~Child() {
    close(report_fd_);
    KillAndReap();
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // Reads `n` bytes the child reported (or fewer at exec / exit).
  std::string Read(size_t n) {
    std::string out;
    char buf[256];
    while (out.size() < n) {
      ssize_t r = read(report_fd_, buf, std::min(sizeof(buf), n - out.size()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
    return out;
  }
  void WaitReady() { Read(1); }

  void KillAndReap() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int report_fd_ = -1;
};

void Report(int fd) {
  char c = 'r';
  if (write(fd, &c, 1) != 1) _exit(3);
}

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool Listed(const std::vector<ProcessInfo>& list, int pid) {
  return std::any_of(list.begin(), list.end(), [&](const ProcessInfo& p) { return p.pid == pid; });
}

// Waits (up to 5 s) until `pid` has exec'd `comm`.
::testing::AssertionResult WaitForComm(int pid, const std::string& comm) {
  for (int i = 0; i < 500; ++i) {
    auto info = ReadProcess(pid);
    if (info.ok() && info->comm == comm) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ::testing::AssertionFailure() << "process " << pid << " never became " << comm;
}

// --- ReadProcess on the real /proc ----------------------------------------------

TEST(ReadProcessTest, Self) {
  ASSERT_OK_AND_ASSIGN(ProcessInfo a, ReadProcess(getpid()));
  EXPECT_EQ(a.pid, getpid());
  EXPECT_EQ(a.ppid, getppid());
  EXPECT_EQ(a.pgid, getpgrp());
  EXPECT_EQ(a.sid, getsid(0));
  EXPECT_EQ(a.creds.ruid, getuid());
  EXPECT_EQ(a.creds.euid, geteuid());
  EXPECT_EQ(a.creds.rgid, getgid());
  EXPECT_GT(a.start_time, 0u);
  EXPECT_GE(a.threads, 1u);
  EXPECT_FALSE(a.kernel_thread);
  EXPECT_TRUE(a.dumpable);
  EXPECT_EQ(a.state, 'R');
  EXPECT_GT(a.rss_bytes, 0u);
  EXPECT_GE(a.vm_bytes, a.rss_bytes);
  ASSERT_FALSE(a.cmdline.empty());
  EXPECT_NE(a.cmdline[0].find("proc_test"), std::string::npos);
  EXPECT_NE(a.exe.find("proc_test"), std::string::npos);
  EXPECT_TRUE(a.gpu_devices.empty());
  ASSERT_OK_AND_ASSIGN(ProcessInfo b, ReadProcess(getpid()));
  EXPECT_EQ(a.start_time, b.start_time);
}

TEST(ReadProcessTest, ForkedChild) {
  Child child([](int) { execl("/bin/sleep", "sleep", "1000", static_cast<char*>(nullptr)); });
  child.WaitReady();
  ASSERT_TRUE(WaitForComm(child.pid(), "sleep"));
  ASSERT_OK_AND_ASSIGN(ProcessInfo a, ReadProcess(child.pid()));
  EXPECT_EQ(a.pid, child.pid());
  EXPECT_EQ(a.ppid, getpid());
  EXPECT_EQ(a.pgid, child.pid());
  EXPECT_EQ(a.creds.ruid, getuid());
  EXPECT_EQ(a.creds.suid, getuid());
  EXPECT_EQ(a.cmdline, (std::vector<std::string>{"sleep", "1000"}));
  EXPECT_EQ(DisplayCommand(a), "sleep 1000");
  EXPECT_NE(a.exe.find("sleep"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(ProcessInfo self, ReadProcess(getpid()));
  EXPECT_GE(a.start_time, self.start_time);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_OK_AND_ASSIGN(ProcessInfo b, ReadProcess(child.pid()));
  EXPECT_EQ(a.start_time, b.start_time);
}

TEST(ReadProcessTest, VanishedPidIsNoSuchProcess) {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  ASSERT_GT(pid, 0);
  // A zombie is still readable, and says so.
  for (int i = 0; i < 500; ++i) {
    auto z = ReadProcess(pid);
    if (z.ok() && z->zombie()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_OK_AND_ASSIGN(ProcessInfo zombie, ReadProcess(pid));
  EXPECT_TRUE(zombie.zombie());
  EXPECT_TRUE(zombie.cmdline.empty());
  EXPECT_EQ(DisplayCommand(zombie), "[" + zombie.comm + "]");

  ASSERT_OK_AND_ASSIGN(ProcessHandle handle, ProcessHandle::Open(pid));
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_CODE(ReadProcess(pid), StatusCode::kNoSuchProcess);
  EXPECT_CODE(ProcessTree(pid), StatusCode::kNoSuchProcess);
  // A handle opened before the process went sees it gone, whoever gets the
  // pid next.
  ProcessInfo info;
  EXPECT_CODE(handle.ReadStat(&info), StatusCode::kNoSuchProcess);
  EXPECT_CODE(handle.ReadStatus(&info), StatusCode::kNoSuchProcess);
  EXPECT_CODE(handle.ReadGpuDevices({"/dev/nvidia"}), StatusCode::kNoSuchProcess);
  EXPECT_CODE(ReadProcess(0), StatusCode::kNoSuchProcess);
  EXPECT_CODE(ReadProcess(-5), StatusCode::kNoSuchProcess);
  EXPECT_CODE(ReadProcess(INT_MAX), StatusCode::kNoSuchProcess);
}

// Regression: an fd closed between readdir and readlink of /proc/PID/fd
// (exec closes many) left ENOENT in errno, and the process read as gone.
TEST(ReadProcessTest, FdsClosingDuringReadAreNotAnError) {
  Child child([](int fd) {
    Report(fd);
    for (;;) {
      int fds[64];
      for (int& f : fds) f = open("/dev/null", O_RDONLY);
      for (int f : fds) close(f);
    }
  });
  child.WaitReady();
  for (int i = 0; i < 300; ++i) {
    auto r = ReadProcess(child.pid());
    ASSERT_TRUE(r.ok()) << "read " << i << ": " << r.status().ToString();
  }
}

TEST(ReadProcessTest, ThreadIdIsNotAProcess) {
  std::promise<pid_t> tid;
  std::promise<void> done;
  std::thread t([&] {
    tid.set_value(static_cast<pid_t>(syscall(SYS_gettid)));
    done.get_future().wait();
  });
  const pid_t id = tid.get_future().get();
  auto r = ReadProcess(id);
  done.set_value();
  t.join();
  EXPECT_CODE(r, StatusCode::kNoSuchProcess);
  EXPECT_NE(r.status().message().find("thread of"), std::string::npos) << r.status().ToString();
}

TEST(ReadProcessTest, KernelThread) {
  // kthreadd is pid 2 where the kernel has one in this pid namespace.
  auto r = ReadProcess(2);
  if (!r.ok() || r->comm != "kthreadd") GTEST_SKIP() << "no kthreadd at pid 2 here";
  EXPECT_TRUE(r->kernel_thread);
  EXPECT_TRUE(r->cmdline.empty());
}

// --- ProcessTree ------------------------------------------------------------------

TEST(ProcessTreeTest, ChildAndGrandchildren) {
  // child -> {g1 -> {gg}, g2}; each grandchild reports its pid.
  Child child([](int fd) {
    auto spawn = [&](const std::function<void()>& more) {
      if (fork() == 0) {
        pid_t me = getpid();
        if (write(fd, &me, sizeof(me)) != sizeof(me)) _exit(3);
        more();
        for (;;) pause();
      }
    };
    spawn([&] { spawn([] {}); });
    spawn([] {});
  });
  std::string pids = child.Read(3 * sizeof(pid_t));
  ASSERT_EQ(pids.size(), 3 * sizeof(pid_t));
  std::vector<pid_t> descendants(3);
  memcpy(descendants.data(), pids.data(), pids.size());

  ASSERT_OK_AND_ASSIGN(std::vector<int> tree, ProcessTree(child.pid()));
  ASSERT_EQ(tree.size(), 4u) << ::testing::PrintToString(tree);
  EXPECT_EQ(tree[0], child.pid());
  for (pid_t d : descendants) EXPECT_TRUE(Contains(tree, d)) << d;
  // Parent first: every process comes after its parent.
  for (size_t i = 1; i < tree.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(ProcessInfo info, ReadProcess(tree[i]));
    auto parent = std::find(tree.begin(), tree.end(), info.ppid);
    ASSERT_NE(parent, tree.end());
    EXPECT_LT(parent - tree.begin(), static_cast<long>(i));
  }
  // A leaf is a tree of one.
  ASSERT_OK_AND_ASSIGN(std::vector<int> leaf, ProcessTree(tree.back()));
  EXPECT_EQ(leaf, std::vector<int>{tree.back()});
}

// --- GPU device detection ----------------------------------------------------------

TEST(GpuDevicesTest, OpenAndMappedFoundOthersNot) {
  TempDir tmp("gpuckpt-proc");
  char real[PATH_MAX];
  ASSERT_NE(realpath(tmp.path().c_str(), real), nullptr);
  const std::string dir = real;
  const std::string dev_open = dir + "/fakegpu0";
  const std::string dev_mapped = dir + "/fakegpu1";
  WriteFile(dev_open, std::string(4096, 'a'));
  WriteFile(dev_mapped, std::string(4096, 'b'));
  WriteFile(dir + "/other", std::string(4096, 'c'));

  Child opener([&](int fd) {
    if (open(dev_open.c_str(), O_RDONLY) < 0) _exit(3);
    Report(fd);
  });
  Child mapper([&](int fd) {
    int f = open(dev_mapped.c_str(), O_RDONLY);
    if (f < 0 || mmap(nullptr, 4096, PROT_READ, MAP_SHARED, f, 0) == MAP_FAILED) _exit(3);
    close(f);  // mapped only, no descriptor left
    Report(fd);
  });
  Child bystander([&](int fd) {
    if (open((dir + "/other").c_str(), O_RDONLY) < 0) _exit(3);
    Report(fd);
  });
  opener.WaitReady();
  mapper.WaitReady();
  bystander.WaitReady();

  ProcReadOptions options;
  options.gpu_device_prefixes = {dir + "/fakegpu"};
  ASSERT_OK_AND_ASSIGN(ProcessInfo o, ReadProcess(opener.pid(), options));
  EXPECT_EQ(o.gpu_devices, std::vector<std::string>{dev_open});
  ASSERT_OK_AND_ASSIGN(ProcessInfo m, ReadProcess(mapper.pid(), options));
  EXPECT_EQ(m.gpu_devices, std::vector<std::string>{dev_mapped});
  ASSERT_OK_AND_ASSIGN(ProcessInfo b, ReadProcess(bystander.pid(), options));
  EXPECT_TRUE(b.gpu_devices.empty());
  options.read_gpu_devices = false;
  ASSERT_OK_AND_ASSIGN(ProcessInfo o2, ReadProcess(opener.pid(), options));
  EXPECT_TRUE(o2.gpu_devices.empty());

  ProcessTableOptions table_options;
  table_options.read.gpu_device_prefixes = {dir + "/fakegpu"};
  ProcessTable table(table_options);
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> list, table.List());
  EXPECT_TRUE(Listed(list, opener.pid()));
  EXPECT_TRUE(Listed(list, mapper.pid()));
  EXPECT_FALSE(Listed(list, bystander.pid()));
  EXPECT_FALSE(Listed(list, getpid()));
  for (const auto& p : list) {
    if (p.pid == opener.pid()) {
      EXPECT_EQ(p.gpu_devices, std::vector<std::string>{dev_open});
    }
  }
  ASSERT_OK_AND_ASSIGN(ProcessInfo got, table.Get(mapper.pid()));
  EXPECT_EQ(got.gpu_devices, std::vector<std::string>{dev_mapped});
  auto not_shown = table.Get(bystander.pid());
  EXPECT_CODE(not_shown, StatusCode::kNoSuchProcess);
  EXPECT_NE(not_shown.status().message().find("track"), std::string::npos);
  EXPECT_CODE(table.Get(getpid()), StatusCode::kNoSuchProcess);
}

// --- Job launchers ------------------------------------------------------------------

// A child that forks `gpu_children` processes holding the fake GPU device
// `device` open (each reports its pid) and one that holds nothing.
std::unique_ptr<Child> LauncherChild(const std::string& device, int gpu_children,
                                     std::vector<pid_t>* pids) {
  auto child = std::make_unique<Child>([device, gpu_children](int fd) {
    for (int i = 0; i <= gpu_children; ++i) {
      if (fork() != 0) continue;
      if (i < gpu_children && open(device.c_str(), O_RDONLY) < 0) _exit(3);
      pid_t me = getpid();
      if (write(fd, &me, sizeof(me)) != sizeof(me)) _exit(3);
      for (;;) pause();
    }
  });
  std::string bytes = child->Read((gpu_children + 1) * sizeof(pid_t));
  if (bytes.size() != (gpu_children + 1) * sizeof(pid_t)) return nullptr;
  // In order of reporting, which need not be the order of forking: which
  // ones hold the device is read from /proc.
  pids->resize(gpu_children + 1);
  memcpy(pids->data(), bytes.data(), bytes.size());
  return child;
}

TEST(ProcessTableTest, JobLauncherOfForkedGpuChildren) {
  TempDir tmp("gpuckpt-proc");
  char real[PATH_MAX];
  ASSERT_NE(realpath(tmp.path().c_str(), real), nullptr);
  const std::string device = std::string(real) + "/fakegpu0";
  WriteFile(device, "x");
  ProcReadOptions read;
  read.gpu_device_prefixes = {std::string(real) + "/fakegpu"};

  std::vector<pid_t> job_kids, single_kids;
  std::unique_ptr<Child> job = LauncherChild(device, 2, &job_kids);
  std::unique_ptr<Child> single = LauncherChild(device, 1, &single_kids);
  ASSERT_NE(job, nullptr);
  ASSERT_NE(single, nullptr);
  std::vector<int> job_gpu;
  for (pid_t k : job_kids) {
    ASSERT_OK_AND_ASSIGN(ProcessInfo info, ReadProcess(k, read));
    if (!info.gpu_devices.empty()) job_gpu.push_back(k);
  }
  std::sort(job_gpu.begin(), job_gpu.end());
  ASSERT_EQ(job_gpu.size(), 2u);

  ProcessTableOptions options;
  options.read = read;
  ProcessTable table(options);
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> list, table.List());
  EXPECT_TRUE(std::is_sorted(list.begin(), list.end(),
                             [](const auto& a, const auto& b) { return a.pid < b.pid; }));
  EXPECT_TRUE(Listed(list, job->pid()));
  EXPECT_FALSE(Listed(list, single->pid()));
  EXPECT_FALSE(Listed(list, getpid()));
  for (const auto& p : list) {
    if (p.pid == job->pid()) {
      EXPECT_EQ(p.gpu_children, job_gpu);
      EXPECT_TRUE(p.gpu_devices.empty());
    } else {
      EXPECT_TRUE(p.gpu_children.empty()) << p.pid;
    }
  }
  ASSERT_OK_AND_ASSIGN(ProcessInfo got, table.Get(job->pid()));
  EXPECT_EQ(got.gpu_children, job_gpu);
  EXPECT_FALSE(got.cmdline.empty());
  auto not_shown = table.Get(single->pid());
  EXPECT_CODE(not_shown, StatusCode::kNoSuchProcess);
  EXPECT_NE(not_shown.status().message().find("track"), std::string::npos);
}

// --- ProcessTable::Track ---------------------------------------------------------

TEST(ProcessTableTest, TrackedChildListedUntilItExits) {
  ProcessTableOptions options;
  options.ttl = std::chrono::milliseconds(0);
  ProcessTable table(options);
  Child child([](int fd) { Report(fd); });
  child.WaitReady();
  const pid_t pid = child.pid();

  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> before, table.List());
  EXPECT_FALSE(Listed(before, pid));
  EXPECT_CODE(table.Get(pid), StatusCode::kNoSuchProcess);

  ASSERT_OK(table.Track(pid));
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> tracked, table.List());
  EXPECT_TRUE(Listed(tracked, pid));
  ASSERT_OK_AND_ASSIGN(ProcessInfo got, table.Get(pid));
  EXPECT_EQ(got.pid, pid);
  EXPECT_TRUE(got.gpu_devices.empty());

  child.KillAndReap();
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> after, table.List());
  EXPECT_FALSE(Listed(after, pid));
  EXPECT_CODE(table.Get(pid), StatusCode::kNoSuchProcess);
  EXPECT_CODE(table.Track(pid), StatusCode::kNoSuchProcess);
  EXPECT_CODE(table.Track(getpid()), StatusCode::kInvalidArgument);
}

TEST(ProcessTableTest, TrackWithinTtlShowsAtOnce) {
  ProcessTable table(ProcessTableOptions{});  // ttl 1 s
  Child child([](int fd) { Report(fd); });
  child.WaitReady();
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> before, table.List());
  EXPECT_FALSE(Listed(before, child.pid()));
  ASSERT_OK(table.Track(child.pid()));
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> after, table.List());
  EXPECT_TRUE(Listed(after, child.pid()));
  EXPECT_EQ(table.counters().scans, 2u);
}

TEST(ProcessTableTest, AllProcessesHasNoKernelThreadsNorSelf) {
  ProcessTableOptions options;
  options.all_processes = true;
  ProcessTable table(options);
  Child child([](int fd) { Report(fd); });
  child.WaitReady();
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> list, table.List());
  EXPECT_TRUE(Listed(list, child.pid()));
  EXPECT_FALSE(Listed(list, getpid()));
  for (const auto& p : list) {
    EXPECT_FALSE(p.kernel_thread) << p.pid;
    EXPECT_FALSE(p.zombie()) << p.pid;
  }
  EXPECT_TRUE(std::is_sorted(list.begin(), list.end(),
                             [](const auto& a, const auto& b) { return a.pid < b.pid; }));
}

// --- MayCheckpoint, CallerGroups ------------------------------------------------

// A child running as uid/gid 65534 (nobody/nogroup). With `exec` it runs
// sleep, as a user's process would be; without, it only changed its ids,
// which leaves it non-dumpable.
std::unique_ptr<Child> NobodyChild(bool exec) {
  auto child = std::make_unique<Child>([exec](int fd) {
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      _exit(3);
    }
    if (exec) execl("/bin/sleep", "sleep", "1000", static_cast<char*>(nullptr));
    Report(fd);
  });
  child->WaitReady();
  return child;
}

TEST(MayCheckpointTest, RootMayCheckpointAnything) {
  ASSERT_OK_AND_ASSIGN(ProcessInfo self, ReadProcess(getpid()));
  Caller root;
  EXPECT_TRUE(root.is_root());
  EXPECT_OK(MayCheckpoint(root, self));
}

TEST(MayCheckpointTest, NobodyRefusedOnRootProcess) {
  if (getuid() != 0) GTEST_SKIP() << "needs root";
  ASSERT_OK_AND_ASSIGN(ProcessInfo self, ReadProcess(getpid()));
  Caller nobody{.uid = 65534, .gid = 65534};
  Status s = MayCheckpoint(nobody, self);
  EXPECT_CODE(s, StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find(std::to_string(getpid())), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("owner uid 0"), std::string::npos) << s.ToString();
}

TEST(MayCheckpointTest, OwnProcessOnly) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to change ids";
  auto child = NobodyChild(/*exec=*/true);
  ASSERT_TRUE(WaitForComm(child->pid(), "sleep"));
  ASSERT_OK_AND_ASSIGN(ProcessInfo target, ReadProcess(child->pid()));
  EXPECT_EQ(target.creds.ruid, 65534u);
  EXPECT_EQ(target.creds.sgid, 65534u);
  EXPECT_TRUE(target.dumpable);
  EXPECT_EQ(OwnerOf(target).uid, 65534u);
  EXPECT_EQ(OwnerOf(target).gid, 65534u);

  EXPECT_OK(MayCheckpoint(Caller{.uid = 65534, .gid = 65534}, target));
  // The gid may come from the caller's supplementary groups.
  EXPECT_OK(MayCheckpoint(Caller{.uid = 65534, .gid = 100, .groups = {65534}}, target));
  Status other = MayCheckpoint(Caller{.uid = 65535, .gid = 65535}, target);
  EXPECT_CODE(other, StatusCode::kPermissionDenied);
  EXPECT_NE(other.message().find("owner uid 65534"), std::string::npos) << other.ToString();
  EXPECT_CODE(MayCheckpoint(Caller{.uid = 65534, .gid = 100}, target),
              StatusCode::kPermissionDenied);

  // Same uid but a saved uid of someone else: a setuid program.
  ProcessInfo setuid_like = target;
  setuid_like.creds.suid = 0;
  EXPECT_CODE(MayCheckpoint(Caller{.uid = 65534, .gid = 65534}, setuid_like),
              StatusCode::kPermissionDenied);
  ProcessInfo with_caps = target;
  with_caps.creds.cap_permitted = 1ull << 13;
  EXPECT_CODE(MayCheckpoint(Caller{.uid = 65534, .gid = 65534}, with_caps),
              StatusCode::kPermissionDenied);
}

TEST(MayCheckpointTest, NonDumpableRefused) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to change ids";
  auto child = NobodyChild(/*exec=*/false);
  ASSERT_OK_AND_ASSIGN(ProcessInfo target, ReadProcess(child->pid()));
  EXPECT_EQ(target.creds.euid, 65534u);
  EXPECT_FALSE(target.dumpable);
  Status s = MayCheckpoint(Caller{.uid = 65534, .gid = 65534}, target);
  EXPECT_CODE(s, StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("dumpable"), std::string::npos) << s.ToString();
  EXPECT_OK(MayCheckpoint(Caller{}, target));
}

TEST(CallerTest, CallerGroups) {
  std::vector<gid_t> mine(static_cast<size_t>(getgroups(0, nullptr)));
  ASSERT_EQ(getgroups(static_cast<int>(mine.size()), mine.data()), static_cast<int>(mine.size()));
  std::vector<uint32_t> expected(mine.begin(), mine.end());
  EXPECT_EQ(CallerGroups(getpid()), expected);

  if (getuid() != 0) return;
  Child child([](int fd) {
    const gid_t groups[] = {10, 20, 4000000000u};
    if (setgroups(3, groups) != 0) _exit(3);
    Report(fd);
  });
  child.WaitReady();
  EXPECT_EQ(CallerGroups(child.pid()), (std::vector<uint32_t>{10, 20, 4000000000u}));
  Caller c = MakeCaller(getuid(), getgid(), child.pid());
  EXPECT_EQ(c.groups, (std::vector<uint32_t>{10, 20, 4000000000u}));
  EXPECT_TRUE(c.InGroup(20));
  EXPECT_TRUE(c.InGroup(getgid()));
  EXPECT_FALSE(c.InGroup(30));
  // The pid no longer shows the caller's ids: it lends no groups.
  EXPECT_TRUE(MakeCaller(1000, 1000, child.pid()).groups.empty());
  const pid_t gone = child.pid();
  child.KillAndReap();
  EXPECT_TRUE(CallerGroups(gone).empty());
}

TEST(CallerTest, CallerGroupsOfAThread) {
  // FUSE gives the calling thread's id.
  std::promise<pid_t> tid;
  std::promise<void> done;
  std::thread t([&] {
    tid.set_value(static_cast<pid_t>(syscall(SYS_gettid)));
    done.get_future().wait();
  });
  const pid_t id = tid.get_future().get();
  auto groups = CallerGroups(id);
  Caller c = MakeCaller(getuid(), getgid(), id);
  done.set_value();
  t.join();
  EXPECT_EQ(groups, CallerGroups(getpid()));
  EXPECT_EQ(c.groups, groups);
}

// --- DisplayCommand ----------------------------------------------------------------

// A thread acting as a user opens what that user may open, and nothing
// more; the daemon's other threads, and this one afterwards, keep root's
// access.
TEST(ActingAsTest, OpensWithTheCallersRightsOnThisThreadOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (changes the thread's file access ids)";
  TempDir dir;
  const std::string secret = dir.path() + "/root-only";
  ASSERT_EQ(mkdir(secret.c_str(), 0700), 0);
  const std::string inside = secret + "/file";
  { std::ofstream(inside) << "x"; }
  const std::string mine = dir.path() + "/users";
  ASSERT_EQ(mkdir(mine.c_str(), 0700), 0);
  ASSERT_EQ(chown(mine.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);

  Caller nobody;
  nobody.uid = 65534;
  nobody.gid = 65534;
  // Made before: a thread made while acting would start with the same ids.
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::thread other([&] {
    started.wait();
    const int fd = open(inside.c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << "another thread lost root's access";
    if (fd >= 0) close(fd);
  });
  {
    ASSERT_OK_AND_ASSIGN(auto as, ActingAs::Begin(nobody));
    // Not even whether the file exists: the same error as for a missing one
    // would be EACCES too, from the directory.
    EXPECT_EQ(open(inside.c_str(), O_RDONLY), -1);
    EXPECT_EQ(errno, EACCES);
    EXPECT_EQ(open((secret + "/missing").c_str(), O_RDONLY), -1);
    EXPECT_EQ(errno, EACCES);
    const int fd = open(mine.c_str(), O_RDONLY | O_DIRECTORY);
    EXPECT_GE(fd, 0);
    if (fd >= 0) close(fd);
    // Another thread of the process still has root's access meanwhile.
    go.set_value();
    other.join();
  }
  const int fd = open(inside.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << "root's access did not come back";
  if (fd >= 0) close(fd);
}

TEST(DisplayCommandTest, BoundedAndClean) {
  ProcessInfo info;
  info.comm = "kworker/0:1";
  EXPECT_EQ(DisplayCommand(info), "[kworker/0:1]");
  info.cmdline = {"python3", "train.py", "--x"};
  EXPECT_EQ(DisplayCommand(info), "python3 train.py --x");
  info.cmdline = {"a\nb", "c\x1b[31m", std::string("d\0e", 3), "\x7f"};
  EXPECT_EQ(DisplayCommand(info), "a?b c?[31m d?e ?");
  info.cmdline = {std::string(500, 'x')};
  std::string s = DisplayCommand(info);
  EXPECT_EQ(s.size(), kMaxDisplayCommand);
  EXPECT_EQ(s.substr(s.size() - 3), "...");
  // Never cut inside a UTF-8 character: "é" is two bytes.
  std::string accents;
  for (int i = 0; i < 150; ++i) accents += "\xc3\xa9";
  info.cmdline = {"x" + accents};
  s = DisplayCommand(info);
  EXPECT_LE(s.size(), kMaxDisplayCommand);
  EXPECT_EQ(s.substr(s.size() - 3), "...");
  EXPECT_EQ(s.substr(s.size() - 5, 2), "\xc3\xa9");
}

// --- Fabricated /proc trees ----------------------------------------------------------

std::string FakeStat(int pid, const std::string& comm, uint64_t start, uint64_t flags = 0,
                     char state = 'S', int ppid = 1) {
  return std::to_string(pid) + " (" + comm + ") " + state + " " + std::to_string(ppid) + " " +
         std::to_string(pid) + " " + std::to_string(pid) + " 0 -1 " + std::to_string(flags) +
         " 10 0 0 0 5 6 0 0 20 0 1 0 " + std::to_string(start) +
         " 1048576 64 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
}

std::string FakeStatus(int pid, uint32_t uid = 1000, uint32_t gid = 1000, int tgid = 0) {
  std::string u = std::to_string(uid), g = std::to_string(gid);
  return "Name:\tfake\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t" +
         std::to_string(tgid ? tgid : pid) + "\nPid:\t" + std::to_string(pid) +
         "\nPPid:\t1\nUid:\t" + u + "\t" + u + "\t" + u + "\t" + u + "\nGid:\t" + g + "\t" + g +
         "\t" + g + "\t" + g + "\nGroups:\t4 24 \nCapPrm:\t0000000000000000\n" +
         "CapEff:\t0000000000000000\n";
}

// proc_root/pid with the given files; fd/ is created empty.
void FakeProcess(const std::string& root, int pid, const std::string& stat,
                 const std::string& status, const std::string& cmdline,
                 const std::string& maps = "") {
  const std::string dir = root + "/" + std::to_string(pid);
  MakeDirs(dir + "/fd");
  if (!stat.empty()) WriteFile(dir + "/stat", stat);
  if (!status.empty()) WriteFile(dir + "/status", status);
  WriteFile(dir + "/cmdline", cmdline);
  WriteFile(dir + "/maps", maps);
}

// A fabricated /proc: on /dev/shm where there is one (thousands of small
// files; a disk under other builds' load makes that seconds), removed with
// everything in it when the object goes.
class FakeProcRoot {
 public:
  FakeProcRoot() {
    std::string templ = (access("/dev/shm", W_OK) == 0 ? std::string("/dev/shm") : "/var/tmp") +
                        "/gpuckpt-fakeproc-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) std::abort();
    path_ = templ;
  }
  ~FakeProcRoot() { testing::RemoveTree(path_); }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Pids beyond PID_MAX_LIMIT, so they never collide with a real one
// (ProcessTable leaves out its own).
constexpr int kFakePid = 4200000;

TEST(FabricatedProcTest, GoodProcessParses) {
  FakeProcRoot root;
  const int pid = kFakePid;
  FakeProcess(root.path(), pid, FakeStat(pid, "we) (ird name", 12345, 0, 'R', 77),
              FakeStatus(pid, 1000, 1001), std::string("python3\0train.py\0--x\0", 21),
              "7f0000000000-7f0000001000 rw-s 00000000 00:05 12   /dev/nvidia0\n"
              "7f0000002000-7f0000003000 r--p 00000000 08:01 99   /usr/lib/with space.so\n"
              "7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0    [stack]\n");
  ASSERT_EQ(symlink("/dev/nvidiactl", (root.Sub(std::to_string(pid)) + "/fd/3").c_str()), 0);
  ASSERT_EQ(symlink("/dev/null", (root.Sub(std::to_string(pid)) + "/fd/0").c_str()), 0);

  ProcReadOptions options;
  options.proc_root = root.path();
  ASSERT_OK_AND_ASSIGN(ProcessInfo info, ReadProcess(pid, options));
  EXPECT_EQ(info.pid, pid);
  EXPECT_EQ(info.comm, "we) (ird name");
  EXPECT_EQ(info.state, 'R');
  EXPECT_EQ(info.ppid, 77);
  EXPECT_EQ(info.start_time, 12345u);
  EXPECT_EQ(info.vm_bytes, 1048576u);
  EXPECT_EQ(info.rss_bytes, 64u * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(info.creds.ruid, 1000u);
  EXPECT_EQ(info.creds.fsgid, 1001u);
  EXPECT_EQ(info.creds.groups, (std::vector<uint32_t>{4, 24}));
  EXPECT_EQ(info.cmdline, (std::vector<std::string>{"python3", "train.py", "--x"}));
  EXPECT_EQ(info.gpu_devices, (std::vector<std::string>{"/dev/nvidia0", "/dev/nvidiactl"}));
  EXPECT_EQ(info.exe, "");
  EXPECT_FALSE(info.kernel_thread);

  // PF_KTHREAD in the flags.
  FakeProcess(root.path(), pid + 1, FakeStat(pid + 1, "kworker/0:1", 5, 0x00208040),
              FakeStatus(pid + 1, 0, 0), "");
  ASSERT_OK_AND_ASSIGN(ProcessInfo kthread, ReadProcess(pid + 1, options));
  EXPECT_TRUE(kthread.kernel_thread);

  // No children files here: the tree comes from every process's ppid.
  FakeProcess(root.path(), pid + 2, FakeStat(pid + 2, "child", 6, 0, 'S', pid), FakeStatus(pid + 2),
              "");
  FakeProcess(root.path(), pid + 3, FakeStat(pid + 3, "grandchild", 7, 0, 'S', pid + 2),
              FakeStatus(pid + 3), "");
  ASSERT_OK_AND_ASSIGN(std::vector<int> tree, ProcessTree(pid, root.path()));
  EXPECT_EQ(tree, (std::vector<int>{pid, pid + 2, pid + 3}));
}

TEST(FabricatedProcTest, MalformedFilesAreClearErrors) {
  FakeProcRoot root;
  struct Case {
    std::string name, stat, status, expect_in_message;
    StatusCode code;
  };
  const int p = kFakePid;
  const std::string good_status = FakeStatus(p);
  const std::vector<Case> cases = {
      {"empty stat", "", good_status, "no '(comm)'", StatusCode::kIOError},
      {"no stat file", "", good_status, "is gone", StatusCode::kNoSuchProcess},
      {"stat with nothing", "\n", good_status, "no '(comm)'", StatusCode::kIOError},
      {"truncated stat, comm with ) (", std::to_string(p) + " (a) (b c) S 1 2 3", good_status,
       "fields, need 24", StatusCode::kIOError},
      {"stat cut inside comm", std::to_string(p) + " (a) (b", good_status, "need 24",
       StatusCode::kIOError},
      {"no closing paren", std::to_string(p) + " (abc S 1 2 3", good_status, "no '(comm)'",
       StatusCode::kIOError},
      {"garbage start time",
       FakeStat(p, "x", 1).replace(FakeStat(p, "x", 1).find(" 1 1048576"), 2, " zz"), good_status,
       "field 22 (starttime)", StatusCode::kIOError},
      {"overflowing ppid",
       FakeStat(p, "x", 1).replace(FakeStat(p, "x", 1).find(") S 1 ") + 4, 1,
                                   "99999999999999999999"),
       good_status, "field 4 (ppid)", StatusCode::kIOError},
      {"garbage pid", "12x (x) S", good_status, "field 1 (pid)", StatusCode::kIOError},
      {"another pid's stat", FakeStat(p + 1, "x", 1), good_status, "names pid",
       StatusCode::kIOError},
      {"long state",
       FakeStat(p, "x", 1, 0, 'S').replace(FakeStat(p, "x", 1).find(") S") + 2, 1, "SS"),
       good_status, "field 3 (state)", StatusCode::kIOError},
      {"no Uid", FakeStat(p, "x", 1), "Name:\tx\nGid:\t1\t1\t1\t1\n", "no Uid",
       StatusCode::kIOError},
      {"no Gid", FakeStat(p, "x", 1), "Uid:\t1\t1\t1\t1\n", "no Gid", StatusCode::kIOError},
      {"short Uid", FakeStat(p, "x", 1), "Uid:\t1\t1\t1\nGid:\t1\t1\t1\t1\n", "needs 4 ids",
       StatusCode::kIOError},
      {"garbage Uid", FakeStat(p, "x", 1), "Uid:\t1\t-1\t1\t1\nGid:\t1\t1\t1\t1\n", "bad id",
       StatusCode::kIOError},
      {"garbage Groups", FakeStat(p, "x", 1), "Uid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\nGroups:\t4 x5\n",
       "bad gid", StatusCode::kIOError},
      {"garbage CapPrm", FakeStat(p, "x", 1), "Uid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\nCapPrm:\tzz\n",
       "CapPrm", StatusCode::kIOError},
      {"a thread", FakeStat(p, "x", 1), FakeStatus(p, 1, 1, p - 1), "thread of",
       StatusCode::kNoSuchProcess},
      {"no status file", FakeStat(p, "x", 1), "", "is gone", StatusCode::kNoSuchProcess},
  };
  ProcReadOptions options;
  options.proc_root = root.path();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    testing::RemoveTree(root.Sub(std::to_string(p)));
    FakeProcess(root.path(), p, c.stat, c.status, "x");
    if (c.name == "empty stat") {  // present, but empty
      WriteFile(root.Sub(std::to_string(p)) + "/stat", "");
    }
    auto r = ReadProcess(p, options);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.expect_in_message), std::string::npos)
        << r.status().ToString();
    EXPECT_NE(r.status().message().find(std::to_string(p)), std::string::npos)
        << r.status().ToString();
  }
}

TEST(FabricatedProcTest, EveryTruncationOfStatParsesOrFails) {
  const std::string stat = FakeStat(kFakePid, "a) (b c", 99);
  for (size_t len = 0; len <= stat.size(); ++len) {
    ProcessInfo info;
    Status s = ParseStat(std::string_view(stat).substr(0, len), "stat", &info);
    if (s.ok()) {
      EXPECT_EQ(info.start_time, 99u);
    } else {
      EXPECT_EQ(s.code(), StatusCode::kIOError);
    }
  }
  // Random bytes: never a crash.
  testing::Rng rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string junk = testing::RandomBytes(rng.Uniform(0, 300), rng.Next());
    ProcessInfo info;
    ProcessCredentials creds;
    int tgid = 0;
    ParseStat(junk, "junk", &info).PermitUnchecked();
    ParseStatus(junk, "junk", &creds, &tgid).PermitUnchecked();
  }
}

TEST(FabricatedProcTest, ListingThousandsScansOncePerTtl) {
  FakeProcRoot root;
  constexpr int kProcesses = 2000;
  for (int i = 0; i < kProcesses; ++i) {
    const int pid = kFakePid + i;
    FakeProcess(root.path(), pid, FakeStat(pid, "worker " + std::to_string(i), 1000 + i),
                FakeStatus(pid), "worker\0", i == 7 ? "1000-2000 rw-s 0 00:05 1 /dev/kfd\n" : "");
  }
  // And things that are not processes to show.
  FakeProcess(root.path(), kFakePid + kProcesses,
              FakeStat(kFakePid + kProcesses, "kthread", 1, 0x00200000),
              FakeStatus(kFakePid + kProcesses), "");
  FakeProcess(root.path(), kFakePid + kProcesses + 1,
              FakeStat(kFakePid + kProcesses + 1, "zombie", 1, 0, 'Z'),
              FakeStatus(kFakePid + kProcesses + 1), "");
  FakeProcess(root.path(), kFakePid + kProcesses + 2, "garbage",
              FakeStatus(kFakePid + kProcesses + 2), "");
  MakeDirs(root.Sub("self"));
  MakeDirs(root.Sub("sys"));

  ProcessTableOptions options;
  options.read.proc_root = root.path();
  options.all_processes = true;
  options.ttl = std::chrono::seconds(60);
  ProcessTable table(options);

  auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> first, table.List());
  auto t1 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> second, table.List());
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(first.size(), static_cast<size_t>(kProcesses));
  EXPECT_EQ(second.size(), first.size());
  EXPECT_EQ(table.counters().scans, 1u);
  EXPECT_EQ(table.counters().device_scans, static_cast<uint64_t>(kProcesses));
  EXPECT_EQ(first[7].gpu_devices, std::vector<std::string>{"/dev/kfd"});
  EXPECT_EQ(first[7].comm, "worker 7");

  // A rescan reads stat again, but reuses every process's GPU result.
  table.Invalidate();
  auto t3 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> third, table.List());
  auto t4 = std::chrono::steady_clock::now();
  EXPECT_EQ(third.size(), first.size());
  EXPECT_EQ(table.counters().scans, 2u);
  EXPECT_EQ(table.counters().device_scans, static_cast<uint64_t>(kProcesses));
  using ms = std::chrono::duration<double, std::milli>;
  std::printf("2000 processes: first scan %.1f ms, cached %.3f ms, rescan %.1f ms\n",
              ms(t1 - t0).count(), ms(t2 - t1).count(), ms(t4 - t3).count());

  // A process replaced under the same pid (new start time) is read afresh.
  FakeProcess(root.path(), kFakePid + 3, FakeStat(kFakePid + 3, "reborn", 999999),
              FakeStatus(kFakePid + 3), "reborn\0");
  table.Invalidate();
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> fourth, table.List());
  EXPECT_EQ(fourth[3].comm, "reborn");
  EXPECT_EQ(table.counters().device_scans, static_cast<uint64_t>(kProcesses) + 1);

  // Without all_processes only the one with a GPU device is shown.
  options.all_processes = false;
  ProcessTable gpu_only(options);
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> gpu, gpu_only.List());
  ASSERT_EQ(gpu.size(), 1u);
  EXPECT_EQ(gpu[0].pid, kFakePid + 7);
  EXPECT_OK(gpu_only.Get(kFakePid + 7).status());
  EXPECT_CODE(gpu_only.Get(kFakePid + 8), StatusCode::kNoSuchProcess);
  EXPECT_CODE(gpu_only.Get(kFakePid + kProcesses), StatusCode::kNoSuchProcess);  // kernel thread
  EXPECT_CODE(gpu_only.Get(kFakePid + kProcesses + 1), StatusCode::kNoSuchProcess);  // zombie
  EXPECT_CODE(gpu_only.Track(kFakePid + kProcesses), StatusCode::kInvalidArgument);
}

// A fabricated process holding /dev/nvidia0, open (fd link) or mapped.
void FakeGpuProcess(const std::string& root, int pid, int ppid, bool mapped = true) {
  FakeProcess(root, pid, FakeStat(pid, "gpu worker", 100 + pid % 1000, 0, 'S', ppid),
              FakeStatus(pid), std::string("python3\0worker.py\0", 18),
              mapped ? "7f0000000000-7f0000001000 rw-s 00000000 00:05 12   /dev/nvidia0\n" : "");
  if (!mapped) {
    const std::string link = root + "/" + std::to_string(pid) + "/fd/5";
    if (symlink("/dev/nvidia0", link.c_str()) != 0) std::abort();
  }
}

void FakePlainProcess(const std::string& root, int pid, int ppid, const std::string& comm,
                      char state = 'S') {
  FakeProcess(root, pid, FakeStat(pid, comm, 100 + pid % 1000, 0, state, ppid), FakeStatus(pid),
              comm + std::string(1, '\0'));
}

TEST(FabricatedProcTest, JobLaunchersShown) {
  FakeProcRoot root;
  const std::string r = root.path();
  // A launcher: two GPU children (one with the device open, one mapped) and
  // a helper child with none.
  const int launcher = kFakePid;
  FakePlainProcess(r, launcher, 1, "torchrun");
  FakeGpuProcess(r, launcher + 1, launcher, /*mapped=*/false);
  FakeGpuProcess(r, launcher + 2, launcher);
  FakePlainProcess(r, launcher + 3, launcher, "helper");
  // A shell with one GPU child, one plain child and one GPU child that has
  // exited (a zombie counts for nothing).
  const int shell = kFakePid + 10;
  FakePlainProcess(r, shell, 1, "bash");
  FakeGpuProcess(r, shell + 1, shell);
  FakePlainProcess(r, shell + 2, shell, "less");
  FakePlainProcess(r, shell + 3, shell, "exited", 'Z');
  WriteFile(root.Sub(std::to_string(shell + 3)) + "/maps",
            "7f0000000000-7f0000001000 rw-s 00000000 00:05 12   /dev/nvidia0\n");
  // Init with two GPU children: never a launcher.
  FakePlainProcess(r, 1, 0, "init");
  FakeGpuProcess(r, kFakePid + 20, 1);
  FakeGpuProcess(r, kFakePid + 21, 1);
  // A process holding a GPU device itself with two GPU children: a GPU
  // process, shown once, and not a launcher.
  const int gpu_parent = kFakePid + 30;
  FakeGpuProcess(r, gpu_parent, 1);
  FakeGpuProcess(r, gpu_parent + 1, gpu_parent);
  FakeGpuProcess(r, gpu_parent + 2, gpu_parent, /*mapped=*/false);

  ProcessTableOptions options;
  options.read.proc_root = r;
  options.ttl = std::chrono::seconds(60);
  ProcessTable table(options);
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> list, table.List());
  std::vector<int> pids;
  for (const auto& p : list) pids.push_back(p.pid);
  EXPECT_EQ(pids, (std::vector<int>{launcher, launcher + 1, launcher + 2, shell + 1, kFakePid + 20,
                                    kFakePid + 21, gpu_parent, gpu_parent + 1, gpu_parent + 2}));
  for (const auto& p : list) {
    if (p.pid == launcher) {
      EXPECT_EQ(p.comm, "torchrun");
      EXPECT_EQ(p.cmdline, std::vector<std::string>{"torchrun"});
      EXPECT_EQ(p.creds.ruid, 1000u);  // read in full, as any shown process
      EXPECT_TRUE(p.gpu_devices.empty());
      EXPECT_EQ(p.gpu_children, (std::vector<int>{launcher + 1, launcher + 2}));
    } else {
      EXPECT_TRUE(p.gpu_children.empty()) << p.pid;
      EXPECT_FALSE(p.gpu_devices.empty()) << p.pid;
    }
  }

  // Get() agrees, finding the children by every process's ppid (there are
  // no task/*/children files here).
  ASSERT_OK_AND_ASSIGN(ProcessInfo got, table.Get(launcher));
  EXPECT_EQ(got.gpu_children, (std::vector<int>{launcher + 1, launcher + 2}));
  EXPECT_TRUE(got.gpu_devices.empty());
  for (int pid : {shell, 1}) {
    SCOPED_TRACE(pid);
    auto not_shown = table.Get(pid);
    EXPECT_CODE(not_shown, StatusCode::kNoSuchProcess);
    EXPECT_NE(not_shown.status().message().find("is not shown: it holds no GPU device (`track " +
                                                std::to_string(pid) + "` shows it)"),
              std::string::npos)
        << not_shown.status().ToString();
  }
  ASSERT_OK_AND_ASSIGN(ProcessInfo gpu, table.Get(gpu_parent));
  EXPECT_EQ(gpu.gpu_devices, std::vector<std::string>{"/dev/nvidia0"});
  EXPECT_TRUE(gpu.gpu_children.empty());
  ASSERT_OK_AND_ASSIGN(ProcessInfo child, table.Get(launcher + 1));
  EXPECT_TRUE(child.gpu_children.empty());

  // And by the kernel's children files where there are some (these list a
  // thread's children; a process's are those of all its threads).
  const std::string task = root.Sub(std::to_string(launcher)) + "/task/";
  const std::string main_thread = task + std::to_string(launcher);
  const std::string other_thread = task + std::to_string(launcher + 99);
  MakeDirs(main_thread);
  MakeDirs(other_thread);
  WriteFile(main_thread + "/children",
            std::to_string(launcher + 2) + " " + std::to_string(launcher + 3) + " ");
  WriteFile(other_thread + "/children", std::to_string(launcher + 1) + " ");
  ASSERT_OK_AND_ASSIGN(got, table.Get(launcher));
  EXPECT_EQ(got.gpu_children, (std::vector<int>{launcher + 1, launcher + 2}));

  // Shown anyway with all_processes: still named a launcher.
  options.all_processes = true;
  ProcessTable all(options);
  ASSERT_OK_AND_ASSIGN(std::vector<ProcessInfo> every, all.List());
  ASSERT_OK_AND_ASSIGN(got, all.Get(launcher));
  EXPECT_EQ(got.gpu_children, (std::vector<int>{launcher + 1, launcher + 2}));
  for (const auto& p : every) {
    if (p.pid == launcher) {
      EXPECT_EQ(p.gpu_children, (std::vector<int>{launcher + 1, launcher + 2}));
    } else {
      EXPECT_TRUE(p.gpu_children.empty()) << p.pid;
    }
  }
  EXPECT_TRUE(Listed(every, shell));
  EXPECT_EQ(std::count_if(every.begin(), every.end(),
                          [&](const ProcessInfo& p) { return p.pid == launcher; }),
            1);

  // Once one GPU child has exited, the launcher is no longer shown.
  testing::RemoveTree(root.Sub(std::to_string(launcher + 2)));
  table.Invalidate();
  ASSERT_OK_AND_ASSIGN(list, table.List());
  EXPECT_FALSE(Listed(list, launcher));
  EXPECT_CODE(table.Get(launcher), StatusCode::kNoSuchProcess);
}

TEST(FabricatedProcTest, ConcurrentListsShareOneScan) {
  FakeProcRoot root;
  for (int i = 0; i < 200; ++i) {
    FakeProcess(root.path(), kFakePid + i, FakeStat(kFakePid + i, "w", 1 + i),
                FakeStatus(kFakePid + i), "w\0");
  }
  ProcessTableOptions options;
  options.read.proc_root = root.path();
  options.all_processes = true;
  options.ttl = std::chrono::seconds(60);
  ProcessTable table(options);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        if (t == 0 && i % 10 == 0) table.Invalidate();
        auto r = table.List();
        if (!r.ok() || r->size() != 200) ++bad;
        if (!table.Get(kFakePid + i).ok()) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(table.counters().scans, 6u);
}

// --- TCP connections -------------------------------------------------------------

TEST(TcpConnectionsTest, ParsesTheStatesOfNetTcp) {
  const std::string table =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode\n"
      "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 "
      "0 1001 1 0000000000000000 100 0 0 10 0\n"  // LISTEN
      "   1: 0100007F:A0B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000 "
      "0 1002 1 0000000000000000 20 4 30 10 -1\n"  // ESTABLISHED
      "   2: 0100007F:A0B4 0100007F:1F90 08 00000000:00000000 00:00000000 00000000  1000 "
      "0 1003 1 0000000000000000 20 4 30 10 -1\n"  // CLOSE_WAIT
      "   3: 00000000:0000 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000 "
      "0 1004 1 0000000000000000 20 4 30 10 -1\n"  // CLOSE (bound only)
      "   4: 0100007F:A0B6 0100007F:1F90 06 00000000:00000000 03:00001000 00000000     0 "
      "0 0 3 0000000000000000\n"  // TIME_WAIT: no socket, inode 0
      "   5: garbage\n"
      "   6: 0100007F:A0B8 0100007F:1F90 zz 00000000:00000000 00:00000000 00000000  1000 "
      "0 1005 1\n";  // a state that does not parse
  EXPECT_EQ(ParseConnectedTcpInodes(table), (std::set<uint64_t>{1002, 1003}));
  EXPECT_TRUE(ParseConnectedTcpInodes("").empty());
  EXPECT_TRUE(ParseConnectedTcpInodes("heading only\n").empty());
}

// The maps of a CUDA process holding 1 GiB of managed memory, as driver
// 580.159.04 showed them (shortened), and lines that must not count.
TEST(ParseMappingSizesTest, SizesOfOneFilesMappings) {
  const std::string maps =
      "204a00000-204c00000 rw-s 204a00000 00:06 1010 /dev/nvidia-uvm\n"
      "7f3d5e000000-7f3d9e000000 rw-s 7f3d5e000000 00:06 1010 /dev/nvidia-uvm\n"
      "7f3da0000000-7f3da0200000 rw-s 00000000 00:06 1011 /dev/nvidiactl\n"
      "7f3da0200000-7f3da0400000 rw-s 00000000 00:06 1012 /dev/nvidia-uvm-tools\n"
      "7f3da0400000-7f3da0600000 rw-s 00000000 00:06 1012 /var/tmp/dev/nvidia-uvm\n"
      "zz-7f3da0800000 rw-s 00000000 00:06 1010 /dev/nvidia-uvm\n"
      "7f3da0a00000-7f3da0800000 rw-s 00000000 00:06 1010 /dev/nvidia-uvm\n"
      "garbage\n"
      "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]";
  EXPECT_EQ(ParseMappingSizes(maps, "/dev/nvidia-uvm"),
            (std::vector<uint64_t>{2u << 20, 1ull << 30}));
  EXPECT_EQ(ParseMappingSizes(maps, "[stack]"), (std::vector<uint64_t>{0x21000}));
  EXPECT_TRUE(ParseMappingSizes("", "/dev/nvidia-uvm").empty());
}

TEST(TcpConnectionsTest, SeesAConnectionOfThisProcessAndNotAListener) {
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_GE(listener.get(), 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener.get(), 1), 0);
  auto self = ProcessHandle::Open(getpid());
  ASSERT_TRUE(self.ok());
  auto holds = self->HoldsTcpConnection();
  ASSERT_TRUE(holds.ok()) << holds.status().message();
  EXPECT_FALSE(*holds) << "a listening socket is no connection";

  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length), 0);
  UniqueFd client(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(connect(client.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  UniqueFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_GE(server.get(), 0);
  holds = self->HoldsTcpConnection();
  ASSERT_TRUE(holds.ok()) << holds.status().message();
  EXPECT_TRUE(*holds);
}

}  // namespace
}  // namespace gpuckpt

namespace gpuckpt {
namespace {

// A fabricated /proc/<pid>/status, read through a ProcessHandle.
std::string FakeProcWithStatus(const TempDir& tmp, int pid, const std::string& status) {
  const std::string dir = tmp.Sub(std::to_string(pid));
  MakeDirs(dir);
  WriteFile(dir + "/status", status);
  return tmp.path();
}

TEST(NamespacePidsTest, InitOfANamespaceBelowOurs) {
  TempDir tmp("gpuckpt-proc");
  const std::string root =
      FakeProcWithStatus(tmp, 4321, "Name:\tsh\nNSpid:\t4321\t1\nUid:\t0 0 0 0\n");
  auto handle = ProcessHandle::Open(4321, root);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  auto pids = handle->ReadNamespacePids();
  ASSERT_TRUE(pids.ok()) << pids.status().ToString();
  EXPECT_EQ(*pids, (std::vector<int>{4321, 1}));
}

TEST(NamespacePidsTest, MissingOrMalformedLineIsAnError) {
  for (const std::string& status : {std::string("Name:\tsh\n"), std::string("NSpid:\t12\tx\n"),
                                    std::string("NSpid:\n"), std::string("NSpid:\t0\n")}) {
    TempDir tmp("gpuckpt-proc");
    auto handle = ProcessHandle::Open(77, FakeProcWithStatus(tmp, 77, status));
    ASSERT_TRUE(handle.ok());
    EXPECT_FALSE(handle->ReadNamespacePids().ok()) << status;
  }
}

TEST(NamespacePidsTest, OwnProcessEndsWithItsPidHere) {
  auto handle = ProcessHandle::Open(getpid());
  ASSERT_TRUE(handle.ok());
  auto pids = handle->ReadNamespacePids();
  ASSERT_TRUE(pids.ok()) << pids.status().ToString();
  ASSERT_FALSE(pids->empty());
  // /proc here is this pid namespace's: the first pid is ours in it.
  EXPECT_EQ(pids->front(), getpid());
}

TEST(MountTableTest, RootsMountpointsAndEscapes) {
  TempDir tmp("gpuckpt-proc");
  WriteFile(tmp.Sub("mountinfo"),
            "48 47 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
            "70 48 0:41 / /tmp/a\\040b rw,nosuid shared:5 - fuse.gpuckptfs /var/lib/gpuckpt rw\n"
            "90 48 254:0 /run/x/hosts /etc/hosts rw - ext4 /dev/vda rw\n"
            "garbage\n");
  auto mounts = ReadMountTable(tmp.Sub("mountinfo"));
  ASSERT_TRUE(mounts.ok()) << mounts.status().ToString();
  ASSERT_EQ(mounts->size(), 3u);
  EXPECT_EQ((*mounts)[0].root, "/");
  EXPECT_EQ((*mounts)[0].mountpoint, "/");
  EXPECT_EQ((*mounts)[1].mountpoint, "/tmp/a b");
  EXPECT_EQ((*mounts)[1].type, kGpuckptMountType);
  EXPECT_EQ((*mounts)[2].device, "254:0");
  EXPECT_EQ((*mounts)[2].root, "/run/x/hosts");
  EXPECT_EQ((*mounts)[2].mountpoint, "/etc/hosts");
  EXPECT_FALSE(ReadMountTable(tmp.Sub("missing")).ok());
}

}  // namespace
}  // namespace gpuckpt
