// fs/command_runner: control-file commands on threads of their own, the
// limit per uid (another uid unaffected, room again once one ends),
// CancelAll() setting every running command's flag, and WaitForAll() and
// the destructor waiting for every command started.
#include "fs/command_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {
namespace {

// A command that runs until released (or until its flag is set, when
// `until_cancelled`), then counts itself done.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened{open.get_future().share()};
  std::atomic<int> started{0};
  std::atomic<int> done{0};

  std::function<void()> Command() {
    return [this] {
      started.fetch_add(1);
      opened.wait();
      done.fetch_add(1);
    };
  }
};

void WaitUntil(const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "timed out";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(CommandRunnerTest, CommandsRunAtOnceUpToTheLimitOfTheirUid) {
  Gate gate;
  CommandRunner runner(3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(runner.Start(1000, nullptr, gate.Command()).ok());
  // All three run at once: none waits for another.
  WaitUntil([&] { return gate.started.load() == 3; });
  EXPECT_EQ(runner.running(), 3u);

  // A fourth of the same uid is refused, and not run.
  Status refused = runner.Start(1000, nullptr, [] { ADD_FAILURE() << "ran a refused command"; });
  EXPECT_EQ(refused.code(), StatusCode::kBusy) << refused.ToString();
  EXPECT_NE(refused.message().find("uid 1000"), std::string::npos) << refused.message();
  // Another uid's is not.
  ASSERT_TRUE(runner.Start(1001, nullptr, gate.Command()).ok());
  WaitUntil([&] { return gate.started.load() == 4; });

  gate.open.set_value();
  runner.WaitForAll();
  EXPECT_EQ(gate.done.load(), 4);
  EXPECT_EQ(runner.running(), 0u);
  // Room again.
  std::atomic<bool> ran{false};
  ASSERT_TRUE(runner.Start(1000, nullptr, [&] { ran = true; }).ok());
  runner.WaitForAll();
  EXPECT_TRUE(ran.load());
}

TEST(CommandRunnerTest, CancelAllSetsTheFlagOfEveryRunningCommand) {
  CommandRunner runner(8);
  std::vector<std::shared_ptr<std::atomic<bool>>> flags;
  std::atomic<int> gave_up{0};
  for (int i = 0; i < 5; ++i) {
    auto flag = std::make_shared<std::atomic<bool>>(false);
    flags.push_back(flag);
    ASSERT_TRUE(runner
                    .Start(static_cast<uint32_t>(i % 2), flag,
                           [flag, &gave_up] {
                             while (!flag->load()) std::this_thread::yield();
                             gave_up.fetch_add(1);
                           })
                    .ok());
  }
  EXPECT_EQ(gave_up.load(), 0);
  runner.CancelAll();
  runner.WaitForAll();
  EXPECT_EQ(gave_up.load(), 5);
  for (const auto& flag : flags) EXPECT_TRUE(flag->load());
}

TEST(CommandRunnerTest, TheDestructorWaitsForEveryCommand) {
  std::atomic<int> done{0};
  {
    CommandRunner runner(64);
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(runner
                      .Start(0, nullptr,
                             [&done] {
                               std::this_thread::sleep_for(std::chrono::milliseconds(20));
                               done.fetch_add(1);
                             })
                      .ok());
    }
  }
  EXPECT_EQ(done.load(), 20);
}

TEST(CommandRunnerTest, ManyShortCommandsFromManyThreadsAllRunOnce) {
  CommandRunner runner(1000);
  std::atomic<int> ran{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&runner, &ran, w] {
      for (int i = 0; i < 200; ++i)
        EXPECT_TRUE(
            runner.Start(static_cast<uint32_t>(w), nullptr, [&ran] { ran.fetch_add(1); }).ok());
    });
  }
  for (auto& t : writers) t.join();
  runner.WaitForAll();
  EXPECT_EQ(ran.load(), 800);
  EXPECT_EQ(runner.running(), 0u);
}

}  // namespace
}  // namespace gpuckpt
