// CheckpointSchedule (core/engine/checkpoint_schedule.h) with a recording
// run function in place of checkpoints: runs come when due, each of the
// process scheduled; a schedule ends when its run says the process ended,
// on Stop(), and is replaced by Set(); the destructor waits for a run.
#include "core/engine/checkpoint_schedule.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/base/mono_clock.h"
#include "core/base/mutex.h"

namespace gpuckpt {
namespace {

using std::chrono::seconds;

CheckpointRequest Every(int pid, int s) {
  CheckpointRequest r;
  r.pid = pid;
  r.every = seconds(s);
  r.retention.keep_last = 2;
  return r;
}

// Waits up to `limit` for `done`.
template <typename Pred>
bool WaitUntil(Pred done, std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

struct Recorder {
  Mutex mu;
  std::vector<std::pair<int, uint64_t>> runs GUARDED_BY(mu);  // (pid, start time)
  std::atomic<bool> process_ended{false};
  std::atomic<bool> fail{false};

  CheckpointSchedule::RunFn Fn() {
    return [this](const CheckpointRequest& r, uint64_t start_time, bool* ok) {
      {
        MutexLock lock(&mu);
        runs.emplace_back(r.pid, start_time);
      }
      *ok = !fail.load();
      return !process_ended.load();
    };
  }
  size_t count() {
    MutexLock lock(&mu);
    return runs.size();
  }
};

TEST(CheckpointScheduleTest, RunsComeWhenDueAndAreCounted) {
  Recorder rec;
  CheckpointSchedule schedule(rec.Fn());
  const int64_t before = MonotonicNowNs();
  schedule.Set(Every(4242, 1), 77);
  auto view = schedule.Of(4242);
  ASSERT_TRUE(view);
  EXPECT_EQ(view->every, seconds(1));
  EXPECT_EQ(view->retention.keep_last, 2u);
  // The first run is an interval from now, not at once.
  EXPECT_GE(view->next_due_mono_ns, before + 1000000000);
  EXPECT_EQ(rec.count(), 0u);
  ASSERT_TRUE(WaitUntil([&] { return rec.count() >= 2; }));
  {
    MutexLock lock(&rec.mu);
    EXPECT_EQ(rec.runs[0], std::make_pair(4242, uint64_t{77}));
  }
  rec.fail = true;
  const size_t seen = rec.count();
  ASSERT_TRUE(WaitUntil([&] {
    auto v = schedule.Of(4242);
    return v && v->failures >= 1;
  }));
  EXPECT_GE(schedule.Of(4242)->runs, seen + 1);
  EXPECT_FALSE(schedule.Of(4243));
}

TEST(CheckpointScheduleTest, EndsWhenItsProcessEndedOrOnStop) {
  Recorder rec;
  CheckpointSchedule schedule(rec.Fn());
  schedule.Set(Every(1, 1), 1);
  schedule.Set(Every(2, 3600), 2);
  EXPECT_TRUE(schedule.Stop(2));
  EXPECT_FALSE(schedule.Stop(2));
  EXPECT_FALSE(schedule.Of(2));
  rec.process_ended = true;
  ASSERT_TRUE(WaitUntil([&] { return !schedule.Of(1); }));
  const size_t runs = rec.count();
  EXPECT_EQ(runs, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(rec.count(), runs) << "ran again after its process ended";
}

TEST(CheckpointScheduleTest, SetReplacesTheScheduleOfAProcess) {
  Recorder rec;
  CheckpointSchedule schedule(rec.Fn());
  schedule.Set(Every(5, 1), 10);
  schedule.Set(Every(5, 3600), 11);  // a later process with the same pid
  EXPECT_EQ(schedule.Of(5)->every, seconds(3600));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(rec.count(), 0u) << "the replaced schedule ran";
}

TEST(CheckpointScheduleTest, TheDestructorWaitsForTheRunInProgress) {
  std::atomic<bool> in_run{false}, finished{false};
  {
    CheckpointSchedule schedule([&](const CheckpointRequest&, uint64_t, bool* ok) {
      in_run = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      finished = true;
      *ok = true;
      return true;
    });
    schedule.Set(Every(9, 1), 9);
    ASSERT_TRUE(WaitUntil([&] { return in_run.load(); }));
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace gpuckpt
