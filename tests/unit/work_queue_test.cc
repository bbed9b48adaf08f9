// core/base/work_queue: tasks run on the workers, each on a worker index of
// its own; the bound on bytes in flight; the first error kept, later tasks
// dropped; exceptions turned into a Status; Finish() and the destructor
// waiting for what is queued; many producers at once. (Background priority
// and shared budgets: base_test.cc.)
#include "core/base/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

// Raises *peak to `now` if it is higher.
void RaisePeak(std::atomic<int64_t>* peak, int64_t now) {
  int64_t p = peak->load();
  while (now > p && !peak->compare_exchange_weak(p, now)) {
  }
}

TEST(WorkQueueTest, ThreadCounts) {
  EXPECT_EQ(ResolveThreadCount(5), 5u);
  const unsigned cpus = std::thread::hardware_concurrency();
  EXPECT_EQ(ResolveThreadCount(0), cpus == 0 ? 1u : cpus);
  WorkQueue three(3, 1 << 20);
  EXPECT_EQ(three.threads(), 3u);
  WorkQueue per_cpu(0, 1 << 20);
  EXPECT_EQ(per_cpu.threads(), ResolveThreadCount(0));
}

TEST(WorkQueueTest, RunsEveryTaskOnceWithItsWorkersIndex) {
  constexpr unsigned kWorkers = 3;
  constexpr int kTasks = 300;
  WorkQueue queue(kWorkers, 1 << 20);
  std::vector<std::atomic<int>> runs(kTasks);
  std::atomic<int> bad_index{0};
  std::mutex seen_mu;
  std::set<unsigned> seen;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_OK(queue.Submit(1, [&, i](unsigned worker) {
      if (worker >= kWorkers) ++bad_index;
      {
        std::lock_guard lock(seen_mu);
        seen.insert(worker);
      }
      ++runs[i];
      return Status::Ok();
    }));
  }
  ASSERT_OK(queue.Finish());
  for (int i = 0; i < kTasks; ++i) EXPECT_EQ(runs[i].load(), 1) << "task " << i;
  EXPECT_EQ(bad_index.load(), 0);
  EXPECT_FALSE(seen.empty());
  EXPECT_LE(seen.size(), kWorkers);
}

TEST(WorkQueueTest, BytesInFlightStayWithinTheBoundAndAnOversizedTaskRunsAlone) {
  constexpr uint64_t kBound = 100;
  WorkQueue queue(4, kBound);
  std::atomic<int64_t> bytes_running{0}, peak_bytes{0};
  std::atomic<int64_t> tasks_running{0}, peak_beside_big{0};
  auto task = [&](int64_t bytes) {
    return [&, bytes](unsigned) {
      RaisePeak(&peak_bytes, bytes_running += bytes);
      ++tasks_running;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      --tasks_running;
      bytes_running -= bytes;
      return Status::Ok();
    };
  };
  for (int i = 0; i < 60; ++i) ASSERT_OK(queue.Submit(30, task(30)));
  // Larger than the whole bound: accepted, and run with nothing else in flight.
  ASSERT_OK(queue.Submit(250, [&](unsigned) {
    RaisePeak(&peak_beside_big, ++tasks_running);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    RaisePeak(&peak_beside_big, tasks_running.load());
    --tasks_running;
    return Status::Ok();
  }));
  for (int i = 0; i < 20; ++i) ASSERT_OK(queue.Submit(30, task(30)));
  ASSERT_OK(queue.Finish());
  EXPECT_LE(peak_bytes.load(), static_cast<int64_t>(kBound));
  EXPECT_GT(peak_bytes.load(), 0);
  EXPECT_EQ(peak_beside_big.load(), 1);
}

TEST(WorkQueueTest, KeepsTheFirstErrorAndDropsTheTasksAfterIt) {
  WorkQueue queue(1, 1 << 20);  // one worker: tasks run in order
  std::atomic<bool> release{false};
  std::atomic<int> ran_after{0};
  ASSERT_OK(queue.Submit(1, [&](unsigned) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return Status::Corruption("first");
  }));
  ASSERT_OK(queue.Submit(1, [&](unsigned) {
    ++ran_after;
    return Status::IOError("second");
  }));
  release = true;
  Status finished = queue.Finish();
  EXPECT_EQ(finished.code(), StatusCode::kCorruption);
  EXPECT_EQ(finished.message(), "first");
  EXPECT_EQ(ran_after.load(), 0);
  // Finishing again, or submitting afterwards, returns the same error.
  EXPECT_EQ(queue.Finish().message(), "first");
  EXPECT_EQ(queue.Submit(1, [](unsigned) { return Status::Ok(); }).message(), "first");
}

TEST(WorkQueueTest, SubmitReturnsAnErrorOnceATaskFailed) {
  WorkQueue queue(2, 1 << 20);
  ASSERT_OK(queue.Submit(1, [](unsigned) { return Status::IOError("disk"); }));
  // The failure is seen by a later Submit() (not necessarily the next one).
  Status submitted;
  for (int i = 0; i < 5000 && submitted.ok(); ++i) {
    submitted = queue.Submit(1, [](unsigned) { return Status::Ok(); });
    if (submitted.ok()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(submitted.code(), StatusCode::kIOError);
  EXPECT_EQ(queue.Finish().code(), StatusCode::kIOError);
}

TEST(WorkQueueTest, AnExceptionBecomesAnInternalError) {
  WorkQueue queue(1, 1 << 20);
  ASSERT_OK(queue.Submit(1, [](unsigned) -> Status { throw std::runtime_error("thrown"); }));
  Status finished = queue.Finish();
  EXPECT_EQ(finished.code(), StatusCode::kInternal);
  EXPECT_NE(finished.message().find("thrown"), std::string::npos) << finished.ToString();
}

TEST(WorkQueueTest, SubmitToAFinishedQueueFails) {
  WorkQueue queue(1, 1 << 20);
  ASSERT_OK(queue.Finish());
  EXPECT_EQ(queue.Submit(1, [](unsigned) { return Status::Ok(); }).code(), StatusCode::kInternal);
}

TEST(WorkQueueTest, FinishAndTheDestructorRunEveryQueuedTask) {
  std::atomic<int> ran{0};
  {
    WorkQueue queue(2, 1 << 20);
    for (int i = 0; i < 50; ++i) {
      ASSERT_OK(queue.Submit(1, [&](unsigned) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++ran;
        return Status::Ok();
      }));
    }
  }  // no Finish(): the destructor's
  EXPECT_EQ(ran.load(), 50);
}

TEST(WorkQueueTest, ManyProducersAtOnce) {
  constexpr int kProducers = 4;
  constexpr int kTasksEach = 500;
  // A small bound, so that producers wait for room while others submit.
  WorkQueue queue(3, 16);
  std::atomic<int64_t> sum{0};
  std::atomic<int> submit_failures{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kTasksEach; ++i) {
        const int64_t value = p * kTasksEach + i;
        Status s = queue.Submit(1 + i % 4, [&, value](unsigned) {
          sum += value;
          return Status::Ok();
        });
        if (!s.ok()) ++submit_failures;
      }
    });
  }
  // SetPriority() and priority() from yet another thread meanwhile.
  std::thread flipper([&] {
    for (int i = 0; i < 200; ++i) {
      queue.SetPriority(i % 2 ? WorkQueue::Priority::kBackground : WorkQueue::Priority::kNormal);
      (void)queue.priority();
    }
    queue.SetPriority(WorkQueue::Priority::kNormal);
  });
  for (auto& t : producers) t.join();
  flipper.join();
  ASSERT_OK(queue.Finish());
  EXPECT_EQ(submit_failures.load(), 0);
  const int64_t n = kProducers * kTasksEach;
  EXPECT_EQ(sum.load(), n * (n - 1) / 2);
}

}  // namespace
}  // namespace gpuckpt
