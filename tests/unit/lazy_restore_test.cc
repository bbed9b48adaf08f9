// Lazy restores (core/engine/lazy_restore.h): which trees may be restored
// lazily and why not, the journal a later daemon reads, and the servers'
// lifecycle (a real child process stands in for `criu lazy-pages`: what
// LazyServers does with it is wait, read its /proc/<pid>/io, and report).
#include "core/engine/lazy_restore.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/base/mutex.h"

namespace gpuckpt {
namespace {

LazyTreeFacts Lazily() { return {true, false, true}; }

TEST(WhyNotLazyTest, RootsPlainTreeThroughTheMountIsLazy) { EXPECT_EQ(WhyNotLazy(Lazily()), ""); }

TEST(WhyNotLazyTest, EachReasonIsSaid) {
  LazyTreeFacts f = Lazily();
  f.mount_serves_images = false;
  EXPECT_NE(WhyNotLazy(f).find("daemon's mount"), std::string::npos);
  f = Lazily();
  f.own_namespaces = true;
  EXPECT_NE(WhyNotLazy(f).find("namespace of its own"), std::string::npos);
  f = Lazily();
  f.as_root = false;
  EXPECT_NE(WhyNotLazy(f).find("CAP_SYS_PTRACE"), std::string::npos);
}

class LazyJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/lazy_journal_test.XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
  }
  void TearDown() override { ASSERT_EQ(std::system(("rm -rf " + dir_).c_str()), 0); }
  std::string dir_;
};

TEST_F(LazyJournalTest, EntriesComeBackOnceAndRemovedOnesDoNot) {
  LazyJournal journal(dir_ + "/lazy");
  ASSERT_TRUE(journal.Add({4242, 77, "4242-1", "/run/gpuckpt/restore-4242-1-abc"}).ok());
  ASSERT_TRUE(journal.Add({4343, 88, "4343-2", "/run/gpuckpt/restore-4343-2-def"}).ok());
  journal.Remove(4343);
  std::vector<LazyJournal::Entry> entries = journal.TakeAll();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].tree_pid, 4242);
  EXPECT_EQ(entries[0].start_time, 77u);
  EXPECT_EQ(entries[0].id, "4242-1");
  EXPECT_EQ(entries[0].work_dir, "/run/gpuckpt/restore-4242-1-abc");
  EXPECT_TRUE(journal.TakeAll().empty()) << "the journal is cleared once read";
}

TEST_F(LazyJournalTest, AnUnreadableOrTornEntryIsDropped) {
  LazyJournal journal(dir_ + "/lazy");
  ASSERT_TRUE(journal.Add({4242, 77, "4242-1", "/w"}).ok());
  // A daemon that died while writing leaves the aside copy, cut short.
  ASSERT_EQ(std::system(("printf '4343-1\\n' > " + dir_ + "/lazy/4343.new").c_str()), 0);
  std::vector<LazyJournal::Entry> entries = journal.TakeAll();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].id, "4242-1");
}

// A child that reads `bytes` from /dev/zero, then waits for SIGTERM (exit
// 0) or exits with `code` at once when `code` is not 0.
CriuProcess StartChild(size_t bytes, int code) {
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* zero = fopen("/dev/zero", "r");
    std::vector<char> buf(bytes);
    if (bytes > 0 && fread(buf.data(), 1, bytes, zero) != bytes) _exit(3);
    if (code != 0) _exit(code);
    signal(SIGTERM, [](int) { _exit(0); });
    for (;;) pause();
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  return CriuProcess(pid, pidfd);
}

struct Recorder {
  Mutex mu;
  std::vector<LazyServers::Ended> ended GUARDED_BY(mu);
  void Add(const LazyServers::Ended& e) {
    MutexLock lock(&mu);
    ended.push_back(e);
  }
  size_t size() {
    MutexLock lock(&mu);
    return ended.size();
  }
  LazyServers::Ended At(size_t i) {
    MutexLock lock(&mu);
    return ended[i];
  }
};

bool WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(LazyServersTest, AServerIsListedWithItsProgressUntilItEndsAndThenReported) {
  Recorder recorder;
  LazyServers servers([&](const LazyServers::Ended& e) { recorder.Add(e); });
  CriuProcess child = StartChild(1 << 20, 0);
  const pid_t child_pid = child.pid();
  // Started for a restore still running: it opens the page images then.
  EXPECT_FALSE(servers.IsServer(child_pid));
  servers.NoteStarting(child_pid);
  EXPECT_TRUE(servers.IsServer(child_pid));
  bool finished_resident = false;
  servers.Adopt("4242-1", 4242, 1000, 4 << 20, std::chrono::steady_clock::now(), std::move(child),
                [&](bool resident) {
                  finished_resident = resident;
                  return std::string();
                });
  EXPECT_TRUE(servers.Serving("4242-1"));
  EXPECT_FALSE(servers.Serving("4242-2"));
  EXPECT_TRUE(servers.IsServer(child_pid));
  EXPECT_FALSE(servers.IsServer(getpid()));
  ASSERT_TRUE(WaitUntil([&] {
    auto p = servers.ProgressOf(4242);
    return p && p->bytes >= (1u << 20);
  })) << "its reads (rchar) are not seen";
  auto progress = servers.ProgressOf(4242);
  EXPECT_EQ(progress->id, "4242-1");
  EXPECT_EQ(progress->expected_bytes, 4u << 20);
  EXPECT_FALSE(servers.ProgressOf(4343).has_value());
  EXPECT_EQ(servers.AllProgress().size(), 1u);

  kill(child_pid, SIGTERM);
  ASSERT_TRUE(WaitUntil([&] { return recorder.size() == 1; }));
  const LazyServers::Ended ended = recorder.At(0);
  EXPECT_EQ(ended.id, "4242-1");
  EXPECT_EQ(ended.tree_pid, 4242);
  EXPECT_EQ(ended.caller_uid, 1000u);
  EXPECT_EQ(ended.exit_code, 0);
  EXPECT_EQ(ended.why, "");
  EXPECT_TRUE(finished_resident);
  EXPECT_FALSE(servers.Serving("4242-1"));
  EXPECT_FALSE(servers.IsServer(child_pid));
  EXPECT_FALSE(servers.ProgressOf(4242).has_value());
}

TEST(LazyServersTest, AServerOfAFailedRestoreIsForgotten) {
  LazyServers servers([](const LazyServers::Ended&) {});
  servers.NoteStarting(4343);
  EXPECT_TRUE(servers.IsServer(4343));
  servers.ForgetStarting(4343);
  EXPECT_FALSE(servers.IsServer(4343));
  EXPECT_FALSE(servers.IsServer(0));
}

// A CPU tree's server bypasses the page cache, a GPU tree's reads through
// it, before and after Adopt(); nobody else is a server at all.
TEST(LazyServersTest, OnlyACpuTreesServerBypassesThePageCache) {
  LazyServers servers([](const LazyServers::Ended&) {});
  CriuProcess cpu = StartChild(0, 0);
  CriuProcess gpu = StartChild(0, 0);
  const pid_t cpu_pid = cpu.pid();
  const pid_t gpu_pid = gpu.pid();
  servers.NoteStarting(cpu_pid);
  servers.NoteStarting(gpu_pid, /*through_page_cache=*/true);
  EXPECT_TRUE(servers.BypassesPageCache(cpu_pid));
  EXPECT_FALSE(servers.BypassesPageCache(gpu_pid));
  EXPECT_TRUE(servers.IsServer(gpu_pid));
  EXPECT_FALSE(servers.BypassesPageCache(getpid()));
  auto no_finish = [](bool) { return std::string(); };
  const auto now = std::chrono::steady_clock::now();
  servers.Adopt("4242-1", 4242, 0, 1 << 20, now, std::move(cpu), no_finish);
  servers.Adopt("4343-1", 4343, 0, 1 << 20, now, std::move(gpu), no_finish);
  EXPECT_TRUE(servers.BypassesPageCache(cpu_pid));
  EXPECT_FALSE(servers.BypassesPageCache(gpu_pid));
  EXPECT_TRUE(servers.IsServer(gpu_pid));
  kill(cpu_pid, SIGTERM);
  kill(gpu_pid, SIGTERM);
  ASSERT_TRUE(WaitUntil([&] { return servers.size() == 0; }));
  EXPECT_FALSE(servers.BypassesPageCache(cpu_pid));
  EXPECT_FALSE(servers.IsServer(gpu_pid));
}

TEST(LazyServersTest, AFailedServerIsReportedWithWhy) {
  Recorder recorder;
  {
    LazyServers servers([&](const LazyServers::Ended& e) { recorder.Add(e); });
    servers.Adopt("4242-1", 4242, 0, 0, std::chrono::steady_clock::now(), StartChild(0, 1),
                  [](bool resident) { return resident ? "" : "Failed to open pagemap"; });
    // A second one, adopted after the first ended, joins its thread.
    ASSERT_TRUE(WaitUntil([&] { return recorder.size() == 1; }));
    servers.Adopt("4343-1", 4343, 0, 0, std::chrono::steady_clock::now(), StartChild(0, 2),
                  [](bool) { return std::string(); });
  }  // waits for the second
  ASSERT_EQ(recorder.size(), 2u);
  EXPECT_EQ(recorder.At(0).exit_code, 1);
  EXPECT_EQ(recorder.At(0).why, "Failed to open pagemap");
  EXPECT_EQ(recorder.At(1).exit_code, 2);
  EXPECT_EQ(recorder.At(1).why, "the lazy-pages server exited with 2");
}

}  // namespace
}  // namespace gpuckpt
