// Snapshot names under concurrency: names are reserved by BeginSnapshot()
// and published by Commit() without a lock held across the store's I/O, so
// many writers at once must still get distinct automatic names, exactly
// one of the writers racing for a name must get it, and no commit may
// overwrite another's snapshot.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;

class SnapshotNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
  }

  // A snapshot named `name` ("" = the next free number) holding one
  // directory that names `writer`; its id, or the status it failed with.
  Result<std::string> Make(const std::string& name, const std::string& writer) {
    SnapshotSpec spec;
    spec.name = name;
    GPUCKPT_ASSIGN_OR_RETURN(auto w, store_->BeginSnapshot(spec));
    FileEntry dir;
    dir.path = writer;
    dir.type = FileType::kDirectory;
    dir.mode = 0755;
    GPUCKPT_RETURN_IF_ERROR(w->AddEntry(dir));
    GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, w->Commit());
    return info.id;
  }

  // Which writer's directory snapshot `id` holds.
  std::string WriterOf(const std::string& id) {
    auto files = store_->ListFiles(id);
    if (!files.ok() || files->size() != 1) return "?";
    return (*files)[0].path;
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
};

TEST_F(SnapshotNamesTest, WritersAtOnceGetDistinctAutomaticNames) {
  constexpr int kThreads = 6;
  constexpr int kEach = 5;
  std::mutex mu;
  std::map<std::string, std::string> made;  // id -> writer
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string writer = "w" + std::to_string(t) + "-" + std::to_string(i);
        auto id = Make("", writer);
        if (!id.ok()) {
          ++failures;
          continue;
        }
        std::lock_guard lock(mu);
        if (!made.emplace(*id, writer).second) ++failures;  // a name given twice
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_EQ(made.size(), static_cast<size_t>(kThreads * kEach));
  ASSERT_OK_AND_ASSIGN(auto list, store_->List());
  EXPECT_EQ(list.size(), made.size());
  for (const auto& [id, writer] : made) EXPECT_EQ(WriterOf(id), writer) << id;
}

TEST_F(SnapshotNamesTest, OfWritersRacingForOneNameExactlyOneGetsIt) {
  constexpr int kThreads = 8;
  std::atomic<int> won{0}, refused{0}, other{0};
  std::mutex mu;
  std::string winner;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        const std::string writer = "w" + std::to_string(t) + "-" + std::to_string(i);
        auto id = Make("contested", writer);
        if (id.ok()) {
          ++won;
          std::lock_guard lock(mu);
          winner = writer;
        } else if (id.status().code() == StatusCode::kAlreadyExists) {
          ++refused;
        } else {
          ++other;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(refused.load(), kThreads * 5 - 1);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(WriterOf("contested"), winner);
}

TEST_F(SnapshotNamesTest, ExplicitAndAutomaticNamesNeverOverwriteEachOther) {
  // Explicit names "1".."30" race with automatic ones, which are numbers
  // too: every commit that succeeded is a snapshot of its own.
  constexpr int kNames = 30;
  std::mutex mu;
  std::map<std::string, std::string> made;
  std::atomic<int> unexpected{0};
  auto record = [&](const Result<std::string>& id, const std::string& writer) {
    if (!id.ok()) {
      if (id.status().code() != StatusCode::kAlreadyExists) ++unexpected;
      return;
    }
    std::lock_guard lock(mu);
    if (!made.emplace(id.value(), writer).second) ++unexpected;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 1; n <= kNames; ++n) {
        const std::string writer = "explicit" + std::to_string(t) + "-" + std::to_string(n);
        record(Make(std::to_string(n), writer), writer);
      }
    });
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const std::string writer = "auto" + std::to_string(t) + "-" + std::to_string(i);
        record(Make("", writer), writer);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(unexpected.load(), 0);
  ASSERT_OK_AND_ASSIGN(auto list, store_->List());
  EXPECT_EQ(list.size(), made.size());
  for (int n = 1; n <= kNames; ++n) EXPECT_EQ(made.count(std::to_string(n)), 1u) << n;
  for (const auto& [id, writer] : made) EXPECT_EQ(WriterOf(id), writer) << id;
}

}  // namespace
}  // namespace gpuckpt
