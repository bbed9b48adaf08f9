// core/base: the work queue's background priority and shared byte budget,
// threads for jobs nobody waits for, the block pool behind a writer's
// staging memory, and reading small files
// that someone else may have planted, bytes shown as text, and whether the
// socket bound to a file listens.
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "core/base/block_pool.h"
#include "core/base/display_text.h"
#include "core/base/hex.h"
#include "core/base/job_threads.h"
#include "core/base/log.h"
#include "core/base/scope_exit.h"
#include "core/base/small_file.h"
#include "core/base/time_text.h"
#include "core/base/unique_fd.h"
#include "core/base/unix_socket_state.h"
#include "core/base/user_name.h"
#include "core/base/work_queue.h"
#include "gpuckpt/byte_budget.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;

TEST(UserNameTest, IsTheDatabasesNameOrTheUidInDecimal) {
  EXPECT_EQ(UserNameOrUid(0), "root");
  // A uid no user database names (the highest, which is no valid uid).
  EXPECT_EQ(UserNameOrUid(4294967294u), "4294967294");
}

TEST(WorkQueueTest, BackgroundWorkersRunUnderSchedIdleAndComeBack) {
  WorkQueue queue(1, 1 << 20);
  queue.SetPriority(WorkQueue::Priority::kBackground);
  if (queue.priority() != WorkQueue::Priority::kBackground) {
    GTEST_SKIP() << "this process may not return a thread from SCHED_IDLE "
                    "(no CAP_SYS_NICE, RLIMIT_NICE below 20): background is ignored";
  }
  std::atomic<int> policy{-1};
  ASSERT_OK(queue.Submit(1, [&](unsigned) {
    policy = sched_getscheduler(0);
    return Status::Ok();
  }));
  ASSERT_OK(queue.Finish());
  EXPECT_EQ(policy.load(), SCHED_IDLE);

  WorkQueue again(1, 1 << 20);
  again.SetPriority(WorkQueue::Priority::kBackground);
  again.SetPriority(WorkQueue::Priority::kNormal);
  ASSERT_OK(again.Submit(1, [&](unsigned) {
    policy = sched_getscheduler(0);
    return Status::Ok();
  }));
  ASSERT_OK(again.Finish());
  EXPECT_EQ(policy.load(), SCHED_OTHER);
}

TEST(WorkQueueTest, LeavesTheBackgroundWhenTheProducerMustWait) {
  WorkQueue queue(1, 100);
  queue.SetPriority(WorkQueue::Priority::kBackground);
  if (queue.priority() != WorkQueue::Priority::kBackground) {
    GTEST_SKIP() << "background is ignored where SCHED_IDLE cannot be left";
  }
  std::atomic<bool> release{false};
  ASSERT_OK(queue.Submit(100, [&](unsigned) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return Status::Ok();
  }));
  EXPECT_EQ(queue.priority(), WorkQueue::Priority::kBackground);  // there was room
  std::thread producer([&] { ASSERT_OK(queue.Submit(50, [](unsigned) { return Status::Ok(); })); });
  // The second Submit waits for room: the workers are what it waits for.
  for (int i = 0; i < 2000 && queue.priority() != WorkQueue::Priority::kNormal; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(queue.priority(), WorkQueue::Priority::kNormal);
  release = true;
  producer.join();
  ASSERT_OK(queue.Finish());
}

TEST(WorkQueueTest, QueuesSharingABudgetStayWithinIt) {
  auto budget = std::make_shared<ByteBudget>(10);
  std::atomic<int64_t> held{0}, peak{0};
  auto task = [&](unsigned) {
    const int64_t now = held += 5;
    int64_t p = peak;
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    held -= 5;
    return Status::Ok();
  };
  WorkQueue a(2, 10, budget), b(2, 10, budget);
  std::thread ta([&] {
    for (int i = 0; i < 50; ++i) ASSERT_OK(a.Submit(5, task));
  });
  std::thread tb([&] {
    for (int i = 0; i < 50; ++i) ASSERT_OK(b.Submit(5, task));
  });
  ta.join();
  tb.join();
  ASSERT_OK(a.Finish());
  ASSERT_OK(b.Finish());
  EXPECT_LE(peak.load(), 10);
  EXPECT_EQ(budget->used(), 0u);
}

TEST(JobThreadsTest, RunsJobsInOrderAndDropsThoseBeyondItsBound) {
  static JobThreads threads(1, /*max_pending=*/2);  // lives on, as a JobThreads should
  auto started = std::make_shared<std::atomic<bool>>(false);
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto ran = std::make_shared<std::vector<int>>();
  auto done = std::make_shared<std::atomic<int>>(0);
  ASSERT_TRUE(threads.Post([started, release] {
    started->store(true);
    while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }));
  while (!started->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The one thread is busy: two jobs may wait, a third is dropped.
  for (int i = 0; i < 3; ++i) {
    const bool queued = threads.Post([ran, done, i] {
      ran->push_back(i);  // one thread: no other job touches it meanwhile
      done->fetch_add(1);
    });
    EXPECT_EQ(queued, i < 2) << i;
  }
  release->store(true);
  while (done->load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(*ran, (std::vector<int>{0, 1}));
}

TEST(ByteBudgetTest, GrantsAnOversizedRequestOnlyWhenNothingIsTaken) {
  ByteBudget budget(8);
  EXPECT_TRUE(budget.TryAcquire(20));  // alone: it must not wait forever
  EXPECT_FALSE(budget.TryAcquire(1));
  budget.Release(20);
  EXPECT_TRUE(budget.TryAcquire(5));
  EXPECT_FALSE(budget.TryAcquire(4));
  EXPECT_TRUE(budget.TryAcquire(3));
  std::atomic<bool> acquired{false};
  std::thread waiter([&] {
    budget.Acquire(5);
    acquired = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(acquired);  // 8 of 8 taken
  budget.Release(5);
  waiter.join();
  EXPECT_EQ(budget.used(), 8u);
}

TEST(BlockPoolTest, PrefaultedBlocksAreReusedAndSurplusIsUnmapped) {
  BlockPool pool(3 << 20, 2);
  EXPECT_EQ(pool.block_size(), size_t{4} << 20);  // whole huge pages
  pool.Prefault(5);
  EXPECT_EQ(pool.mapped_blocks(), 2u);  // no more than it keeps
  {
    std::vector<std::shared_ptr<uint8_t[]>> held;
    for (int i = 0; i < 4; ++i) {
      held.push_back(pool.Get());
      ASSERT_NE(held.back(), nullptr);
      held.back()[0] = 1;
      held.back()[pool.block_size() - 1] = 2;  // the whole block is ours
      EXPECT_EQ(reinterpret_cast<uintptr_t>(held.back().get()) % (2 << 20), 0u);
    }
    EXPECT_EQ(pool.mapped_blocks(), 4u);
  }
  EXPECT_EQ(pool.mapped_blocks(), 2u);  // two kept, two unmapped
}

TEST(BlockPoolTest, ABlockMayOutliveItsPool) {
  std::shared_ptr<uint8_t[]> block;
  {
    BlockPool pool(1 << 20, 4);
    block = pool.Get();
  }
  block[0] = 42;  // still mapped
  EXPECT_EQ(block[0], 42);
}

TEST(SmallFileTest, ReadsARegularFileAndRefusesLinksFifosAndSize) {
  TempDir dir;
  const std::string file = dir.path() + "/f";
  std::ofstream(file) << "12345\n";
  ASSERT_OK_AND_ASSIGN(std::string text, ReadSmallFileNoFollow(file, 64));
  EXPECT_EQ(text, "12345\n");
  EXPECT_CODE(ReadSmallFileNoFollow(file, 3), StatusCode::kCorruption);
  EXPECT_CODE(ReadSmallFileNoFollow(dir.path() + "/missing", 64), StatusCode::kNotFound);
  ASSERT_EQ(symlink(file.c_str(), (dir.path() + "/link").c_str()), 0);
  EXPECT_CODE(ReadSmallFileNoFollow(dir.path() + "/link", 64), StatusCode::kInvalidArgument);
  // A FIFO with no writer would block an open without O_NONBLOCK forever.
  ASSERT_EQ(mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);
  EXPECT_CODE(ReadSmallFileNoFollow(dir.path() + "/fifo", 64), StatusCode::kInvalidArgument);
  EXPECT_CODE(ReadSmallFileNoFollow(dir.path(), 64), StatusCode::kInvalidArgument);
}

TEST(SmallFileTest, ReadsRelativeToADirectoryCheckingOwnerAndSizeAsAsked) {
  TempDir dir;
  std::ofstream(dir.path() + "/f") << "12345\n";
  UniqueFd dir_fd(open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_GE(dir_fd.get(), 0);
  ASSERT_OK_AND_ASSIGN(std::string text,
                       ReadSmallFileNoFollowAt(dir_fd.get(), "f", SmallFileRead("copy/f", 64)));
  EXPECT_EQ(text, "12345\n");
  // A file someone handed in: too large is their mistake, and it must be theirs.
  SmallFileRead handed_in("copy/f", 3);
  handed_in.too_large = StatusCode::kInvalidArgument;
  const Status large = ReadSmallFileNoFollowAt(dir_fd.get(), "f", handed_in).status();
  EXPECT_CODE(large, StatusCode::kInvalidArgument);
  EXPECT_NE(large.message().find("copy/f is too large (6 bytes; at most 3 are read)"),
            std::string::npos)
      << large.message();
  SmallFileRead someone_elses("copy/f", 64);
  someone_elses.owner = getuid() + 1;
  EXPECT_CODE(ReadSmallFileNoFollowAt(dir_fd.get(), "f", someone_elses),
              StatusCode::kPermissionDenied);
  someone_elses.owner = getuid();
  EXPECT_OK(ReadSmallFileNoFollowAt(dir_fd.get(), "f", someone_elses).status());
}

// A socket bound to `path` in the test's directory, not listening yet.
UniqueFd BoundSocket(const std::string& path) {
  UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (sock.get() < 0 || path.size() >= sizeof(addr.sun_path)) return UniqueFd();
  strcpy(addr.sun_path, path.c_str());
  if (bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return UniqueFd();
  return sock;
}

TEST(UnixSocketStateTest, ASocketCountsOnceItListensNotWhenBound) {
  TempDir dir;
  const std::string path = dir.path() + "/server.socket";
  ASSERT_OK_AND_ASSIGN(bool listens, UnixSocketListens(path));
  EXPECT_FALSE(listens);  // no file yet
  UniqueFd server = BoundSocket(path);
  ASSERT_GE(server.get(), 0);
  // Its file is there, and a client would still be refused.
  ASSERT_OK_AND_ASSIGN(listens, UnixSocketListens(path));
  EXPECT_FALSE(listens);
  // Another socket that listens, under a name of its own, is not this one.
  UniqueFd other = BoundSocket(dir.path() + "/other.socket");
  ASSERT_GE(other.get(), 0);
  ASSERT_EQ(listen(other.get(), 1), 0);
  ASSERT_OK_AND_ASSIGN(listens, UnixSocketListens(path));
  EXPECT_FALSE(listens);
  ASSERT_EQ(listen(server.get(), 1), 0);
  ASSERT_OK_AND_ASSIGN(listens, UnixSocketListens(path));
  EXPECT_TRUE(listens);
  // Closed, its file stays behind and listens no more.
  server = UniqueFd();
  ASSERT_OK_AND_ASSIGN(listens, UnixSocketListens(path));
  EXPECT_FALSE(listens);
}

TEST(UnixSocketStateTest, AFileThatIsNotASocketIsRefused) {
  TempDir dir;
  std::ofstream(dir.path() + "/plain") << "x";
  EXPECT_CODE(UnixSocketListens(dir.path() + "/plain").status(), StatusCode::kInvalidArgument);
}

TEST(DisplayTextTest, KeepsUtf8AndEscapesEveryOtherByte) {
  EXPECT_EQ(DisplayText("python3 train.py --lr 0.1"), "python3 train.py --lr 0.1");
  EXPECT_EQ(DisplayText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  // Latin-1 "café", a lone continuation byte, a truncated sequence at the end.
  EXPECT_EQ(DisplayText("caf\xe9"), "caf\\xE9");
  EXPECT_EQ(DisplayText("a\x80"
                        "b"),
            "a\\x80b");
  EXPECT_EQ(DisplayText("x\xe2\x82"), "x\\xE2\\x82");
  // Overlong forms, surrogates and code points above U+10FFFF are not UTF-8.
  EXPECT_EQ(DisplayText("\xc0\xaf"), "\\xC0\\xAF");
  EXPECT_EQ(DisplayText("\xed\xa0\x80"), "\\xED\\xA0\\x80");
  EXPECT_EQ(DisplayText("\xf4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9"));
  EXPECT_FALSE(IsValidUtf8("caf\xe9"));
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));
  // Every byte value alone: the output is always valid UTF-8.
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    EXPECT_TRUE(IsValidUtf8(DisplayText(one))) << b;
  }
}

TEST(DisplayTextTest, QuotedExcerptEscapesWhatIsNotPrintableAndCutsLongText) {
  EXPECT_EQ(QuotedExcerpt("GPU-12"), "\"GPU-12\"");
  // Terminal escapes, quotes, backslashes and bytes above ASCII.
  EXPECT_EQ(QuotedExcerpt("a\x1b[2J\"\\\xe9"), "\"a\\x1B[2J\\x22\\x5C\\xE9\"");
  EXPECT_EQ(QuotedExcerpt(std::string(100, 'x'), 8), "\"xxxxxxxx...\"");
  EXPECT_EQ(QuotedExcerpt(std::string(8, 'x'), 8), "\"xxxxxxxx\"");
}

TEST(ScopeExitTest, RunsOnEveryExitUnlessDismissed) {
  int runs = 0;
  {
    ScopeExit undo([&] { ++runs; });
  }
  EXPECT_EQ(runs, 1);
  auto early_return = [&](bool fail) {
    ScopeExit undo([&] { ++runs; });
    if (fail) return;
    undo.Dismiss();
  };
  early_return(true);
  EXPECT_EQ(runs, 2);
  early_return(false);
  EXPECT_EQ(runs, 2);
}

TEST(TimeTextTest, Rfc3339RoundTripsEveryNanosecond) {
  // 2026-12-01T20:41:24Z, and a time whose nanoseconds a double loses.
  EXPECT_EQ(Rfc3339Utc(1796157684'000000000), "2026-12-01T20:41:24Z");
  EXPECT_EQ(Rfc3339Utc(1796157684'123456789, true), "2026-12-01T20:41:24.123456789Z");
  EXPECT_EQ(Rfc3339Utc(0, true), "1970-01-01T00:00:00.000000000Z");
  EXPECT_EQ(Rfc3339Utc(-1, true), "1969-12-31T23:59:59.999999999Z");
  for (int64_t ns : {int64_t{0}, int64_t{1796157684'123456789}, int64_t{1796157684'000000001},
                     int64_t{4102444800'999999999}}) {
    EXPECT_EQ(ParseRfc3339Utc(Rfc3339Utc(ns, true)), ns) << ns;
  }
  EXPECT_EQ(ParseRfc3339Utc("2026-12-01T20:41:24Z"), int64_t{1796157684'000000000});
  EXPECT_EQ(ParseRfc3339Utc("2026-12-01T20:41:24.5Z"), int64_t{1796157684'500000000});
  for (const char* bad : {"", "2026-12-01", "2026-12-01T20:41:24", "2026-12-01T20:41:24+01:00",
                          "2026-13-01T20:41:24Z", "2026-12-01T20:41:24.Z",
                          "2026-12-01T20:41:24.1234567890Z", "2026-12-01T20:41:24Zx"}) {
    EXPECT_FALSE(ParseRfc3339Utc(bad).has_value()) << bad;
  }
}

TEST(LogTest, ValuesStayOneFieldOnOneLine) {
  EXPECT_EQ(LogValue("4242-2"), "4242-2");
  EXPECT_EQ(LogValue("/var/lib/gpuckptfs/x.log"), "/var/lib/gpuckptfs/x.log");
  EXPECT_EQ(LogValue(""), "\"\"");
  EXPECT_EQ(LogValue("criu failed: a b"), "\"criu failed: a b\"");
  EXPECT_EQ(LogValue("say \"no\"\\\nnext"), "\"say \\\"no\\\"\\\\\\nnext\"");
  EXPECT_EQ(LogValue("k=v"), "\"k=v\"");
  EXPECT_EQ(LogValue(std::string("a\tb\x01", 4)), "\"a\\x09b\\x01\"");
}

TEST(LogTest, LevelsByNameAndByOutcome) {
  EXPECT_EQ(ParseLogLevel("debug").value(), spdlog::level::debug);
  EXPECT_EQ(ParseLogLevel("info").value(), spdlog::level::info);
  EXPECT_EQ(ParseLogLevel("warning").value(), spdlog::level::warn);
  EXPECT_EQ(ParseLogLevel("error").value(), spdlog::level::err);
  EXPECT_EQ(ParseLogLevel("loud").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OperationLogLevel(Status::Ok()), spdlog::level::info);
  EXPECT_EQ(OperationLogLevel(Status::Busy("x")), spdlog::level::warn);
  EXPECT_EQ(OperationLogLevel(Status::IOError("x")), spdlog::level::err);
}

// The file the daemon logs to in the background: lines with a UTC time and
// their level, those below the level dropped, the file readable at once.
TEST(LogTest, FileSinkWritesTimedLevelledLines) {
  TempDir dir;
  const std::string path = dir.Sub("gpuckptfs.log");
  auto saved = spdlog::default_logger();
  ASSERT_OK(SetUpLogging(LogOptions{LogSink::kFile, path, spdlog::level::warn}));
  spdlog::info("not shown");
  spdlog::warn("checkpoint uid={} result={}", 1000, "busy");
  spdlog::set_default_logger(saved);
  const std::string text = ::gpuckpt::testing::ReadFile(path);
  EXPECT_EQ(text.find("not shown"), std::string::npos) << text;
  // "2026-12-01T21:02:56.693Z warning ...": the time's shape, digit by digit.
  const std::string shape = "dddd-dd-ddTdd:dd:dd.dddZ";
  ASSERT_GT(text.size(), shape.size()) << text;
  for (size_t i = 0; i < shape.size(); ++i)
    EXPECT_TRUE(shape[i] == 'd' ? std::isdigit(static_cast<unsigned char>(text[i])) != 0
                                : text[i] == shape[i])
        << i << ": " << text;
  EXPECT_EQ(text.substr(shape.size()), " warning checkpoint uid=1000 result=busy\n") << text;
  // Outside systemd (no JOURNAL_STREAM naming our stderr) nothing goes to
  // the journal.
  unsetenv("JOURNAL_STREAM");
  EXPECT_EQ(ChooseLogSink(true), LogSink::kStderr);
  EXPECT_EQ(ChooseLogSink(false), LogSink::kFile);
  struct stat st {};
  ASSERT_EQ(fstat(STDERR_FILENO, &st), 0);
  const std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  setenv("JOURNAL_STREAM", stream.c_str(), 1);
  EXPECT_EQ(ChooseLogSink(false), LogSink::kJournal);
  setenv("JOURNAL_STREAM", "1:2", 1);
  EXPECT_EQ(ChooseLogSink(true), LogSink::kStderr);
  unsetenv("JOURNAL_STREAM");
}

TEST(HexTest, BytesRoundTripAndOnlyLowerCaseEvenHexIsRead) {
  const std::string bytes("\x00\x7f\x80\xff ab", 7);
  EXPECT_EQ(LowerHex(bytes), "007f80ff206162");
  EXPECT_EQ(ParseLowerHex(LowerHex(bytes)), std::optional<std::string>(bytes));
  EXPECT_EQ(ParseLowerHex(""), std::optional<std::string>(""));
  EXPECT_FALSE(ParseLowerHex("abc").has_value());  // odd length
  EXPECT_FALSE(ParseLowerHex("AB").has_value());   // upper case
  EXPECT_FALSE(ParseLowerHex("0g").has_value());   // not a digit
}

}  // namespace
}  // namespace gpuckpt
