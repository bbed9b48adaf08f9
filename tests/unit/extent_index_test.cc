// ExtentIndex on a catalog whose extent records the tests write by hand,
// damaged ones included.
#include "core/catalog/extent_index.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/catalog/catalog_keys.h"
#include "core/catalog/records.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/store/format.h"
#include "core/store/store_db.h"
#include "core/store/store_db_rocks.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

class ExtentIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = StoreDb::Open(dir_.Sub("store"), /*create_if_missing=*/true, 8u << 20);
    ASSERT_OK(db);
    db_ = std::move(db).value();
    auto catalog = SnapshotCatalog::Open(db_.get());
    ASSERT_OK(catalog);
    catalog_ = std::move(catalog).value();
  }

  // An extent of `length` bytes at `offset` whose chunk is sequence number
  // `seq` (its hash and fingerprint derive from it).
  void PutExtent(uint64_t snapshot, uint32_t file, uint64_t offset, uint64_t length, uint64_t seq) {
    PutRaw(keys::ExtentKey(snapshot, file, offset), Record(seq, length));
  }
  void PutRaw(const std::string& key, const std::string& value) {
    ASSERT_TRUE(StoreDbRocks::db(*db_)
                    ->Put(rocksdb::WriteOptions(),
                          StoreDbRocks::family(*db_, format::kExtentsFamily), key, value)
                    .ok());
  }
  static std::string Record(uint64_t seq, uint64_t length) {
    auto hash = ChunkHash::FromBytes(std::string(32, static_cast<char>('a' + seq % 26)));
    auto fingerprint = ChunkFingerprint::FromBytes(std::string(16, static_cast<char>(seq)));
    EXPECT_TRUE(hash.ok() && fingerprint.ok());
    return EncodeExtentRecord(*hash, seq, length, *fingerprint);
  }

  // The steps of a walk in offset order to its end; a failed step ends it
  // and is returned as the last, as its status.
  struct Walk {
    std::vector<ExtentIndex::Step> steps;
    Status error;
  };
  static Walk WalkToEnd(ExtentIndex* index) {
    Walk walk;
    for (;;) {
      auto step = index->NextInOrder();
      if (!step.ok()) {
        walk.error = step.status();
        break;
      }
      if (!*step) break;
      walk.steps.push_back(**step);
    }
    return walk;
  }

  TempDir dir_;
  std::unique_ptr<StoreDb> db_;
  std::unique_ptr<SnapshotCatalog> catalog_;  // borrows db_
};

TEST_F(ExtentIndexTest, ContiguousExtentsWalkInOffsetOrder) {
  // Written out of order: the walk is in offset order regardless.
  PutExtent(7, 1, 150, 10, 3);
  PutExtent(7, 1, 0, 100, 1);
  PutExtent(7, 1, 100, 50, 2);
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekToFirst();
  const Walk walk = WalkToEnd(&index);
  ASSERT_OK(walk.error);
  ASSERT_EQ(walk.steps.size(), 3u);
  const uint64_t offsets[] = {0, 100, 150};
  const uint64_t seqs[] = {1, 2, 3};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(walk.steps[i].extent.offset, offsets[i]);
    EXPECT_EQ(walk.steps[i].extent.seq, seqs[i]);
    EXPECT_EQ(walk.steps[i].expected, offsets[i]);
    EXPECT_EQ(walk.steps[i].join, ExtentJoin::kContiguous) << "extent at " << offsets[i];
  }
  EXPECT_EQ(index.walked_to(), 160u);
  EXPECT_TRUE(index.status("reading").ok());
}

TEST_F(ExtentIndexTest, GapIsReportedWithTheOffsetExpected) {
  PutExtent(7, 1, 0, 100, 1);
  PutExtent(7, 1, 150, 10, 2);
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekToFirst();
  const Walk walk = WalkToEnd(&index);
  ASSERT_OK(walk.error);
  ASSERT_EQ(walk.steps.size(), 2u);
  EXPECT_EQ(walk.steps[0].join, ExtentJoin::kContiguous);
  EXPECT_EQ(walk.steps[1].join, ExtentJoin::kGap);
  EXPECT_EQ(walk.steps[1].expected, 100u);
  EXPECT_EQ(walk.steps[1].extent.offset, 150u);
}

TEST_F(ExtentIndexTest, FirstExtentPastZeroIsAGap) {
  PutExtent(7, 1, 10, 100, 1);
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekToFirst();
  const Walk walk = WalkToEnd(&index);
  ASSERT_OK(walk.error);
  ASSERT_EQ(walk.steps.size(), 1u);
  EXPECT_EQ(walk.steps[0].join, ExtentJoin::kGap);
  EXPECT_EQ(walk.steps[0].expected, 0u);
}

TEST_F(ExtentIndexTest, OverlapIsReportedWithTheOffsetExpected) {
  PutExtent(7, 1, 0, 100, 1);
  PutExtent(7, 1, 50, 100, 2);
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekToFirst();
  const Walk walk = WalkToEnd(&index);
  ASSERT_OK(walk.error);
  ASSERT_EQ(walk.steps.size(), 2u);
  EXPECT_EQ(walk.steps[1].join, ExtentJoin::kOverlap);
  EXPECT_EQ(walk.steps[1].expected, 100u);
  EXPECT_EQ(walk.steps[1].extent.offset, 50u);
}

TEST_F(ExtentIndexTest, SeekInsideAnExtentStartsOnIt) {
  PutExtent(7, 1, 0, 100, 1);
  PutExtent(7, 1, 100, 50, 2);
  PutExtent(7, 1, 150, 10, 3);
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekTo(120);
  EXPECT_EQ(index.walked_to(), 120u);
  const Walk walk = WalkToEnd(&index);
  ASSERT_OK(walk.error);
  ASSERT_EQ(walk.steps.size(), 2u);
  EXPECT_EQ(walk.steps[0].extent.offset, 100u);
  EXPECT_EQ(walk.steps[0].expected, 120u);
  EXPECT_EQ(walk.steps[0].join, ExtentJoin::kContiguous);
  EXPECT_EQ(walk.steps[1].extent.offset, 150u);
  EXPECT_EQ(walk.steps[1].join, ExtentJoin::kContiguous);
  EXPECT_EQ(index.walked_to(), 160u);

  // Exactly at an extent's start, and again after walking (a seek resets
  // the walk).
  index.SeekTo(100);
  auto step = index.NextInOrder();
  ASSERT_OK(step);
  ASSERT_TRUE(step->has_value());
  EXPECT_EQ((*step)->extent.offset, 100u);
  EXPECT_EQ((*step)->join, ExtentJoin::kContiguous);
}

TEST_F(ExtentIndexTest, SeekToBytesNoExtentHoldsIsAGap) {
  PutExtent(7, 1, 0, 100, 1);
  PutExtent(7, 1, 150, 10, 2);
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  // Between the two: the extent before ends short of the offset.
  index.SeekTo(120);
  auto step = index.NextInOrder();
  ASSERT_OK(step);
  ASSERT_TRUE(step->has_value());
  EXPECT_EQ((*step)->extent.offset, 0u);
  EXPECT_EQ((*step)->join, ExtentJoin::kGap);
  EXPECT_EQ((*step)->expected, 120u);
  // Past the last extent.
  index.SeekTo(500);
  step = index.NextInOrder();
  ASSERT_OK(step);
  ASSERT_TRUE(step->has_value());
  EXPECT_EQ((*step)->extent.offset, 150u);
  EXPECT_EQ((*step)->join, ExtentJoin::kGap);
}

TEST_F(ExtentIndexTest, SeekBeforeAnyExtentFindsNone) {
  PutExtent(7, 1, 100, 10, 1);
  PutExtent(7, 0, 0, 500, 2);  // the file before: out of scope
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekTo(50);
  auto step = index.NextInOrder();
  ASSERT_OK(step);
  EXPECT_FALSE(step->has_value());
  EXPECT_TRUE(index.status("reading").ok());
}

TEST_F(ExtentIndexTest, ScopesSeeTheirOwnRecordsOnly) {
  PutExtent(6, 1, 0, 10, 1);
  PutExtent(7, 0, 0, 10, 2);
  PutExtent(7, 1, 0, 10, 3);
  PutExtent(7, 1, 10, 10, 4);
  PutExtent(7, 2, 0, 10, 5);
  PutExtent(8, 1, 0, 10, 6);
  const auto seqs_of = [&](ExtentIndex::Scope scope) {
    std::vector<uint64_t> seqs;
    ExtentIndex index(*catalog_, std::move(scope));
    for (index.SeekToFirst(); index.Valid(); index.Next()) {
      auto e = index.Decode();
      EXPECT_OK(e);
      if (e.ok()) seqs.push_back(e->seq);
    }
    EXPECT_TRUE(index.status("reading").ok());
    return seqs;
  };
  EXPECT_EQ(seqs_of(ExtentIndex::Scope::File(7, 1)), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(seqs_of(ExtentIndex::Scope::Snapshot(7)), (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(seqs_of(ExtentIndex::Scope::Store()), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
}

TEST_F(ExtentIndexTest, KeyPartsAndSeekPastSnapshot) {
  PutExtent(6, 1, 0, 10, 1);
  PutExtent(6, 2, 0, 10, 2);
  PutExtent(9, 4, 4096, 10, 3);
  ExtentIndex index(*catalog_, ExtentIndex::Scope::Store());
  index.SeekToFirst();
  ASSERT_TRUE(index.Valid());
  auto key = index.Key();
  ASSERT_OK(key);
  EXPECT_EQ(key->snapshot_key, 6u);
  EXPECT_EQ(key->file_index, 1u);
  EXPECT_EQ(key->offset, 0u);
  index.SeekPastSnapshot(6);
  ASSERT_TRUE(index.Valid());
  key = index.Key();
  ASSERT_OK(key);
  EXPECT_EQ(key->snapshot_key, 9u);
  EXPECT_EQ(key->file_index, 4u);
  EXPECT_EQ(key->offset, 4096u);
  index.SeekPastSnapshot(9);
  EXPECT_FALSE(index.Valid());
  EXPECT_TRUE(index.status("reading").ok());
}

TEST_F(ExtentIndexTest, MalformedKeyIsCorruption) {
  PutExtent(7, 1, 0, 100, 1);
  // Of the file, but too short to hold an offset.
  PutRaw(keys::FileKey(7, 1) + std::string(3, '\xff'), Record(2, 10));
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekToFirst();
  const Walk walk = WalkToEnd(&index);
  ASSERT_EQ(walk.steps.size(), 1u);
  EXPECT_CODE(walk.error, StatusCode::kCorruption);
  EXPECT_NE(walk.error.message().find("malformed extent key"), std::string::npos)
      << walk.error.ToString();
  ASSERT_TRUE(index.Valid());
  EXPECT_CODE(index.Key(), StatusCode::kCorruption);
  EXPECT_CODE(index.Decode(), StatusCode::kCorruption);
}

TEST_F(ExtentIndexTest, MalformedValueIsCorruption) {
  PutExtent(7, 1, 0, 100, 1);
  PutRaw(keys::ExtentKey(7, 1, 100), "not an extent record");
  ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1));
  index.SeekToFirst();
  const Walk walk = WalkToEnd(&index);
  ASSERT_EQ(walk.steps.size(), 1u);
  EXPECT_CODE(walk.error, StatusCode::kCorruption);
  EXPECT_NE(walk.error.message().find("at offset 100"), std::string::npos) << walk.error.ToString();
  // The key itself is fine.
  auto key = index.Key();
  ASSERT_OK(key);
  EXPECT_EQ(key->offset, 100u);
}

TEST_F(ExtentIndexTest, ReadsAsOfAView) {
  PutExtent(7, 1, 0, 100, 1);
  const DbView view(*db_);
  PutExtent(7, 1, 100, 100, 2);
  {
    ExtentIndex index(*catalog_, ExtentIndex::Scope::File(7, 1),
                      ExtentIndex::ReadOptions{.view = &view, .fill_cache = false});
    index.SeekToFirst();
    const Walk walk = WalkToEnd(&index);
    ASSERT_OK(walk.error);
    EXPECT_EQ(walk.steps.size(), 1u);
    EXPECT_EQ(index.walked_to(), 100u);
  }
}

}  // namespace
}  // namespace gpuckpt
