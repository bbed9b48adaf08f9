// core/base/task_pool: every index runs once; the helpers share one call's
// work (several threads at once); the caller runs a call alone when every
// helper is held by another call; the lowest failed index's error is
// returned and indices not begun after a failure are skipped; many callers
// at once.
#include "core/base/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace gpuckpt {
namespace {

TEST(TaskPoolTest, EveryIndexRunsOnce) {
  for (unsigned helpers : {0u, 1u, 3u}) {
    TaskPool pool(helpers);
    EXPECT_EQ(pool.helpers(), helpers);
    std::vector<std::atomic<int>> runs(1000);
    ASSERT_TRUE(pool.RunAll(runs.size(),
                            [&](size_t i) {
                              runs[i].fetch_add(1);
                              return Status::Ok();
                            })
                    .ok());
    for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << "index " << i;
    EXPECT_TRUE(pool.RunAll(0, [](size_t) { return Status::Internal("never run"); }).ok());
  }
}

TEST(TaskPoolTest, HelpersWorkBesideTheCaller) {
  TaskPool pool(3);
  // Each index waits until four run at once (or gives up after 10 s): only
  // the caller and all three helpers together get there.
  std::atomic<int> running{0};
  std::atomic<int> peak{0};
  std::mutex threads_mu;
  std::set<std::thread::id> threads;
  ASSERT_TRUE(pool.RunAll(4,
                          [&](size_t) {
                            const int now = running.fetch_add(1) + 1;
                            int p = peak.load();
                            while (now > p && !peak.compare_exchange_weak(p, now)) {
                            }
                            {
                              std::lock_guard<std::mutex> lock(threads_mu);
                              threads.insert(std::this_thread::get_id());
                            }
                            const auto deadline =
                                std::chrono::steady_clock::now() + std::chrono::seconds(10);
                            while (peak.load() < 4 && std::chrono::steady_clock::now() < deadline)
                              std::this_thread::sleep_for(std::chrono::milliseconds(1));
                            running.fetch_sub(1);
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_EQ(peak.load(), 4);
  EXPECT_EQ(threads.size(), 4u);
  EXPECT_TRUE(threads.count(std::this_thread::get_id()));
}

TEST(TaskPoolTest, TheCallerRunsItsCallAloneWhileTheHelpersAreHeld) {
  TaskPool pool(1);
  std::atomic<bool> release{false};
  std::atomic<int> held{0};
  // Another caller's call holds the one helper and that caller until
  // released.
  std::thread other([&] {
    EXPECT_TRUE(pool.RunAll(2,
                            [&](size_t) {
                              held.fetch_add(1);
                              while (!release.load())
                                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                              return Status::Ok();
                            })
                    .ok());
  });
  while (held.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::set<std::thread::id> threads;
  ASSERT_TRUE(pool.RunAll(50,
                          [&](size_t) {
                            threads.insert(
                                std::this_thread::get_id());  // only this thread runs them
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_EQ(threads, std::set<std::thread::id>{std::this_thread::get_id()});
  release.store(true);
  other.join();
}

TEST(TaskPoolTest, TheLowestFailedIndexIsReportedAndTheRestSkipped) {
  TaskPool pool(3);
  std::atomic<int> runs{0};
  Status s = pool.RunAll(10000, [&](size_t i) {
    runs.fetch_add(1);
    if (i == 7 || i == 9) return Status::IOError("index " + std::to_string(i));
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_EQ(s.message(), "index 7");
  EXPECT_LT(runs.load(), 10000);  // skipped once one failed

  // Without helpers too.
  TaskPool alone(0);
  runs = 0;
  s = alone.RunAll(100, [&](size_t i) {
    runs.fetch_add(1);
    return i == 3 ? Status::IOError("three") : Status::Ok();
  });
  EXPECT_EQ(s.message(), "three");
  EXPECT_EQ(runs.load(), 4);
}

TEST(TaskPoolTest, ManyCallersAtOnce) {
  TaskPool pool(2);
  constexpr int kCallers = 6;
  std::vector<std::thread> callers;
  std::vector<uint64_t> sums(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      std::vector<uint64_t> values(500, 0);
      for (int round = 0; round < 20; ++round) {
        ASSERT_TRUE(pool.RunAll(values.size(),
                                [&](size_t i) {
                                  values[i] += i;
                                  return Status::Ok();
                                })
                        .ok());
      }
      for (uint64_t v : values) sums[c] += v;
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(sums[c], 20u * (499u * 500u / 2)) << "caller " << c;
}

}  // namespace
}  // namespace gpuckpt
