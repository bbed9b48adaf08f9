// Crash tests: the real CLI is killed with SIGKILL while it imports, then the
// store is reopened and checked. Invariants after every kill: the store
// opens; no partial snapshot is visible (every listed snapshot exports
// complete and byte-identical to its source); fsck is clean. After all
// trials, gc and fsck are clean again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using Clock = std::chrono::steady_clock;
using testing::TempDir;

// Starts the CLI with its output thrown away.
pid_t SpawnCli(const std::vector<std::string>& args) {
  const std::string cli = testing::CliPath();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(cli.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Async-signal-safe calls only: the test process has threads.
    const int null_fd = open("/dev/null", O_RDWR);
    dup2(null_fd, 0);
    dup2(null_fd, 1);
    dup2(null_fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

::testing::AssertionResult FsckClean(Store& store) {
  auto r = store.Fsck();
  if (!r.ok()) return ::testing::AssertionFailure() << r.status().ToString();
  if (!r->clean()) {
    auto f = ::testing::AssertionFailure() << r->problems.size() << " problems:";
    for (size_t i = 0; i < r->problems.size() && i < 5; ++i) f << "\n  " << r->problems[i];
    return f;
  }
  return ::testing::AssertionSuccess();
}

std::unique_ptr<Store> OpenStore(const std::string& dir) {
  auto s = Store::Open(dir, testing::TestOptions());
  EXPECT_TRUE(testing::IsOk(s)) << "the store must open after a crash";
  return s.ok() ? std::move(s).value() : nullptr;
}

constexpr uint64_t kTreeBytes = 32u << 20;

TEST(CrashTest, ImportKilledAtRandomPointsLeavesNoPartialSnapshot) {
  TempDir tmp("gpuckpt-crash");
  const std::string store_dir = tmp.Sub("store");
  const std::string calib_src = tmp.Sub("calib");
  const std::string work = tmp.Sub("work");
  testing::MakeCheckpointTree(calib_src, 1000, kTreeBytes);

  // Calibrate: how long one uncrashed import of such a tree takes, start to
  // exit. The first import also creates the store; time the next two, which
  // do what the trials do, and keep the shorter: other load on the machine
  // only ever makes a run longer.
  const pid_t first = SpawnCli({"--store", store_dir, "import", calib_src, "--name", "calib"});
  ASSERT_GT(first, 0);
  const int first_status = Wait(first);
  ASSERT_TRUE(WIFEXITED(first_status) && WEXITSTATUS(first_status) == 0)
      << "uncrashed import failed, status " << first_status;
  std::map<std::string, uint64_t> committed;  // snapshot id -> tree seed
  committed["calib"] = 1000;
  auto import_time = Clock::duration::max();
  for (uint64_t seed : {998, 999}) {
    testing::RemoveTree(work);
    ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpointTree(work, seed, kTreeBytes));
    const std::string id = "calib" + std::to_string(seed);
    const auto t0 = Clock::now();
    const pid_t pid = SpawnCli({"--store", store_dir, "import", work, "--name", id});
    ASSERT_GT(pid, 0);
    const int status = Wait(pid);
    import_time = std::min(import_time, Clock::now() - t0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "uncrashed import failed, status " << status;
    committed[id] = seed;
  }
  auto max_delay_us = [&] {
    return std::chrono::duration_cast<std::chrono::microseconds>(import_time).count() * 6 / 5;
  };
  std::printf("[          ] one import takes %lld ms; kills spread over 0..%lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(import_time).count()),
              static_cast<long long>(max_delay_us() / 1000));

  // Each trial imports and fscks anew under the sanitizers too, about eight
  // times slower there: half as many trials still spread kills over the
  // whole import, and the normal build runs all of them.
  constexpr int kTrials = testing::kUnderSanitizer ? 12 : 24;
  testing::Rng rng(20240611);
  int killed = 0, absent_after_kill = 0, present_after_kill = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    // Fresh data every time, so every import has chunks to write.
    testing::RemoveTree(work);
    const uint64_t seed = 2000 + static_cast<uint64_t>(trial);
    ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpointTree(work, seed, kTreeBytes));
    // Appended, not "t" + ...: GCC 12 at -O3 warns falsely (-Wrestrict)
    // about the prepend that operator+ makes of it.
    const std::string id = std::string("t").append(std::to_string(trial));
    const auto delay =
        std::chrono::microseconds(rng.Uniform(0, static_cast<uint64_t>(max_delay_us())));

    const auto start = Clock::now();
    const pid_t pid = SpawnCli({"--store", store_dir, "import", work, "--name", id});
    ASSERT_GT(pid, 0);
    // Kill at start + delay, unless it ends before; then it was a full run,
    // and a shorter one than the calibration means the machine was busy
    // then: use it, so that the kills stay spread over the real duration.
    int status = 0;
    bool ended = false;
    while (!ended && Clock::now() - start < delay) {
      ended = waitpid(pid, &status, WNOHANG) == pid;
      if (!ended) std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    if (ended) {
      import_time = std::min(import_time, Clock::now() - start);
    } else {
      kill(pid, SIGKILL);
      status = Wait(pid);
    }
    const bool was_killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (!was_killed) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "import ended by itself but failed, status " << status;
    }
    killed += was_killed;

    auto store = OpenStore(store_dir);
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(auto list, store->List());
    bool present = false;
    for (const auto& info : list) {
      if (info.id == id) {
        present = true;
        continue;
      }
      EXPECT_EQ(committed.count(info.id), 1u) << "unexpected snapshot '" << info.id << "'";
    }
    EXPECT_EQ(list.size(), committed.size() + (present ? 1 : 0)) << "a committed snapshot vanished";
    if (!was_killed) {
      EXPECT_TRUE(present) << "an import that exited 0 is not listed";
    }
    // The new snapshot is exported and compared here; the earlier ones are
    // covered by fsck (every chunk re-hashed, every extent checked against
    // its chunk) after each trial, and exported again at the end.
    if (present) {
      // Complete and byte-identical, or not there at all.
      EXPECT_TRUE(testing::ExportMatches(*store, id, work, tmp.path()));
      committed[id] = seed;
    }
    if (was_killed) (present ? present_after_kill : absent_after_kill)++;
    EXPECT_TRUE(FsckClean(*store));
  }
  std::printf(
      "[          ] %d of %d imports killed; %d left no snapshot, %d had committed just "
      "before the kill\n",
      killed, kTrials, absent_after_kill, present_after_kill);
  EXPECT_GE(killed, kTrials / 3) << "kills should mostly land during the import";
  EXPECT_GE(absent_after_kill, 1) << "no kill landed before a commit";

  // After all trials: gc removes what the dead imports left, fsck is clean,
  // and every listed snapshot still matches its source.
  auto store = OpenStore(store_dir);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_TRUE(FsckClean(*store));
  ASSERT_OK_AND_ASSIGN(StoreStats stats, store->Stats());
  EXPECT_EQ(stats.chunk_count, gc.chunks_kept);
  EXPECT_EQ(stats.snapshot_count, committed.size());
  ASSERT_OK_AND_ASSIGN(GcReport again, store->Gc());
  EXPECT_EQ(again.chunks_deleted, 0u);
  EXPECT_EQ(again.orphan_records_deleted, 0u);
  for (const auto& [id, seed] : committed) {
    std::string src = calib_src;
    if (id != "calib") {
      testing::RemoveTree(work);
      ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpointTree(work, seed, kTreeBytes));
      src = work;
    }
    EXPECT_TRUE(testing::ExportMatches(*store, id, src, tmp.path()));
  }
}

// The child's half of the test below, in a process of its own: this test
// binary run again with these set. A fork would not do: a child forked
// after the parent had run RocksDB lacks its background threads, and its
// flushes would wait for them forever.
constexpr char kChildDirEnv[] = "GPUCKPT_CRASH_CHILD_DIR";
constexpr char kChildReadyFdEnv[] = "GPUCKPT_CRASH_CHILD_READY_FD";

// Holds a writer halfway (one file added, no commit), commits a second
// snapshot through the same store, says so on `ready_fd` and waits to be
// killed. Its exit codes say which step failed.
[[noreturn]] void HoldAWriterAcrossAnotherCommit(const std::string& dir, int ready_fd) {
  auto store = Store::Open(dir + "/store", testing::TestOptions());
  if (!store.ok()) _exit(10);
  SnapshotSpec partial;
  partial.name = "partial";
  auto writer = (*store)->BeginSnapshot(partial);
  if (!writer.ok()) _exit(11);
  const int fd = open((dir + "/big.bin").c_str(), O_RDONLY | O_CLOEXEC);
  FileEntry entry;
  entry.path = "big.bin";
  if (fd < 0 || !(*writer)->AddFile(entry, fd).ok()) _exit(12);
  if (!testing::Import(**store, dir + "/other", "other").ok()) _exit(13);
  const char byte = 1;
  if (write(ready_fd, &byte, 1) != 1) _exit(14);
  for (;;) pause();
}

// Regression: bulk data is written without RocksDB's WAL, so a column family
// flushed without the others left, after a crash, chunk records without
// meta records: fsck reported them and gc never swept them (and a meta
// record flushed without its chunk would make later imports skip data that
// is not there). Chunk data now goes to packs and the tables' write buffers
// no longer fill on their own; what still flushes an unfinished writer's
// records is another writer's commit. So a child holds one writer halfway
// through a file, commits a second snapshot (whose flush takes the first
// writer's records along) and is killed. Each step is an event the child
// reports, not a moment the test guesses, so it holds on any machine.
TEST(CrashTest, KilledAfterAnotherWritersCommitFlushedItsChunksLeavesTablesConsistent) {
  if (const char* child_dir = getenv(kChildDirEnv)) {
    const char* fd = getenv(kChildReadyFdEnv);
    HoldAWriterAcrossAnotherCommit(child_dir, fd != nullptr ? atoi(fd) : -1);
  }
  TempDir tmp("gpuckpt-crash");
  const std::string big = tmp.Sub("big.bin");
  const std::string other = tmp.Sub("other");
  testing::WriteRandomFile(big, 24u << 20, 1);
  testing::MakeDirs(other);
  testing::WriteRandomFile(other + "/small.bin", 1u << 20, 2);

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const std::string self = "/proc/self/exe";
  const std::string filter =
      "--gtest_filter=CrashTest."
      "KilledAfterAnotherWritersCommitFlushedItsChunksLeavesTablesConsistent";
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kChildDirEnv) + "=" + tmp.path());
  env_strings.push_back(std::string(kChildReadyFdEnv) + "=" + std::to_string(ready[1]));
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>(self.c_str()), const_cast<char*>(filter.c_str()), nullptr};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Async-signal-safe calls only: the test process may have threads.
    close(ready[0]);
    const int null_fd = open("/dev/null", O_RDWR);
    dup2(null_fd, 0);
    dup2(null_fd, 1);
    execve(argv[0], argv, envp.data());
    _exit(127);
  }
  close(ready[1]);
  char byte = 0;
  const ssize_t got = read(ready[0], &byte, 1);
  close(ready[0]);
  kill(pid, SIGKILL);
  const int status = Wait(pid);
  ASSERT_EQ(got, 1) << "the child failed before the kill, exit code "
                    << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);

  auto store = OpenStore(tmp.Sub("store"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(auto list, store->List());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, "other");
  EXPECT_TRUE(FsckClean(*store));
  ASSERT_OK_AND_ASSIGN(StoreStats before, store->Stats());
  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_GT(gc.chunks_deleted, 0u) << "the flushed chunks of the dead writer were not reclaimed";
  EXPECT_TRUE(FsckClean(*store));
  ASSERT_OK_AND_ASSIGN(StoreStats after, store->Stats());
  EXPECT_EQ(after.chunk_count, gc.chunks_kept);
  EXPECT_LT(after.chunk_count, before.chunk_count);
  EXPECT_TRUE(testing::ExportMatches(*store, "other", other, tmp.path()));
  // And the data imports completely afterwards: no meta record of the dead
  // writer makes the import skip a chunk that is gone.
  const std::string src = tmp.Sub("src");
  testing::MakeDirs(src);
  ASSERT_EQ(rename(big.c_str(), (src + "/big.bin").c_str()), 0);
  ASSERT_OK(testing::Import(*store, src, "big"));
  EXPECT_TRUE(testing::ExportMatches(*store, "big", src, tmp.path()));
  EXPECT_TRUE(FsckClean(*store));
}

}  // namespace
}  // namespace gpuckpt
