// core/base: the work queue's background priority and shared byte budget,
// the block pool behind a writer's staging memory, and reading small files
// that someone else may have planted.
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "core/base/block_pool.h"
#include "core/base/small_file.h"
#include "core/base/work_queue.h"
#include "gpuckpt/byte_budget.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;

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

}  // namespace
}  // namespace gpuckpt
