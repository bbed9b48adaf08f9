// CheckpointCatalog over a real Store: what it answers after one load, and
// how it follows what the engine publishes and removes.
#include "core/engine/checkpoint_catalog.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/manifest/checkpoint_manifest.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

constexpr uint32_t kAlice = 1000;
constexpr uint32_t kBob = 1001;

class CheckpointCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
    src_ = tmp_.Sub("src");
    testing::MakeDirs(src_);
    testing::WriteFile(src_ + "/pstree.img", "tree");
  }

  // Puts `id` in the store: a checkpoint of `pid` owned by `owner`, made by `maker`;
  // an import when `imported`.
  SnapshotInfo Put(const std::string& id, int pid, uint32_t owner, uint32_t maker,
                   bool imported = false) {
    CheckpointManifest manifest;
    manifest.pid = pid;
    manifest.owner = ManifestIds{owner, owner};
    manifest.made_by = ManifestMaker{maker, maker, {}};
    if (imported) manifest.imported_from = "/elsewhere";
    SnapshotSpec spec;
    spec.name = id;
    spec.extra_json = EncodeManifest(manifest);
    auto info = store_->ImportDirectory(src_, spec);
    EXPECT_OK(info.status());
    return info.ok() ? *info : SnapshotInfo{};
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
  std::string src_;
};

using Ids = std::vector<std::string>;

TEST_F(CheckpointCatalogTest, AnswersFromOneLoadAndFollowsChanges) {
  Put("7-1", 7, kAlice, kAlice);
  const SnapshotInfo second = Put("7-2", 7, kAlice, 0);  // root's checkpoint of her job
  Put("1000.copy", 7, kAlice, kBob, /*imported=*/true);  // somebody else made it
  Put("12-3", 12, 0, 0);
  Put("7-x", 7, kBob, kBob);  // not a number
  CheckpointCatalog catalog(store_.get());
  ASSERT_OK(catalog.Load());

  ASSERT_OK_AND_ASSIGN(auto latest, catalog.LatestOfProcess(7, kAlice));
  EXPECT_EQ(latest, std::optional<std::string>("7-2"));
  ASSERT_OK_AND_ASSIGN(Ids of_alice, catalog.CheckpointsOfProcess(7, kAlice));
  EXPECT_EQ(of_alice, (Ids{"7-1", "7-2"}));
  // No owner given: the owner of the newest own dump of the pid (Bob's).
  ASSERT_OK_AND_ASSIGN(Ids of_last, catalog.CheckpointsOfProcess(7, std::nullopt));
  EXPECT_EQ(of_last, (Ids{"7-x"}));
  ASSERT_OK_AND_ASSIGN(Ids none, catalog.CheckpointsOfProcess(99, std::nullopt));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(catalog.HighestNumber(7).value(), 2u);
  EXPECT_EQ(catalog.HighestNumber(12).value(), 3u);
  EXPECT_EQ(catalog.HighestNumber(1).value(), 0u);
  ASSERT_OK_AND_ASSIGN(Ids held, catalog.HeldBy(kAlice));
  EXPECT_EQ(held, (Ids{"1000.copy", "7-1", "7-2"}));
  ASSERT_OK_AND_ASSIGN(Ids dumps, catalog.OwnDumpsOf(7, kAlice));
  EXPECT_EQ(dumps, (Ids{"7-1"}));

  // A removal of another incarnation of the id leaves it.
  catalog.Remove("7-2", second.key + 1000);
  EXPECT_EQ(catalog.LatestOfProcess(7, kAlice).value(), std::optional<std::string>("7-2"));
  ASSERT_OK(store_->Remove("7-2"));
  catalog.Remove("7-2", second.key);
  EXPECT_EQ(catalog.LatestOfProcess(7, kAlice).value(), std::optional<std::string>("7-1"));
  EXPECT_EQ(catalog.HighestNumber(7).value(), 1u);

  catalog.Add(Put("7-5", 7, kAlice, kAlice));
  EXPECT_EQ(catalog.LatestOfProcess(7, kAlice).value(), std::optional<std::string>("7-5"));
  EXPECT_EQ(catalog.HighestNumber(7).value(), 5u);
  ASSERT_OK_AND_ASSIGN(held, catalog.HeldBy(kAlice));
  EXPECT_EQ(held, (Ids{"1000.copy", "7-1", "7-5"}));
  // What a fresh load finds is what was followed.
  CheckpointCatalog loaded(store_.get());
  ASSERT_OK(loaded.Load());
  EXPECT_EQ(loaded.CheckpointsOfProcess(7, kAlice).value(), (Ids{"7-1", "7-5"}));
}

// Checkpoints are in the order they began (the store's keys, as List()
// has them), not that of their commits: the same after a restart's load.
TEST_F(CheckpointCatalogTest, CheckpointsAreInTheOrderTheyBegan) {
  CheckpointCatalog catalog(store_.get());
  ASSERT_OK(catalog.Load());
  CheckpointManifest manifest;
  manifest.pid = 7;
  manifest.owner = ManifestIds{kAlice, kAlice};
  manifest.made_by = ManifestMaker{kAlice, kAlice, {}};
  SnapshotSpec spec;
  spec.extra_json = EncodeManifest(manifest);
  spec.name = "7-1";
  ASSERT_OK_AND_ASSIGN(auto first, store_->BeginSnapshot(spec));
  spec.name = "7-2";
  ASSERT_OK_AND_ASSIGN(auto second, store_->BeginSnapshot(spec));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo second_info, second->Commit());
  catalog.Add(second_info);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo first_info, first->Commit());
  catalog.Add(first_info);
  EXPECT_EQ(catalog.CheckpointsOfProcess(7, kAlice).value(), (Ids{"7-1", "7-2"}));
  CheckpointCatalog loaded(store_.get());
  ASSERT_OK(loaded.Load());
  EXPECT_EQ(loaded.CheckpointsOfProcess(7, kAlice).value(), (Ids{"7-1", "7-2"}));
}

}  // namespace
}  // namespace gpuckpt
