// Snapshots written on a base (SnapshotSpec::base): unchanged chunks are
// taken from the base by fingerprint, at the same place or moved, changed
// ones are hashed and stored,
// what comes back is always the new data, and the base's chunks survive its
// removal and a gc while the new snapshot is written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "core/catalog/records.h"
#include "core/store/chunk_fingerprint.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::TempDir;

class BaseSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Store::Open(tmp_.Sub("store"), testing::TestOptions());
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }
  Result<SnapshotInfo> ImportOnBase(const std::string& src, const std::string& name,
                                    const std::string& base) {
    SnapshotSpec spec;
    spec.name = name;
    spec.base = base;
    return store_->ImportDirectory(src, spec);
  }
  void ExpectFsckClean() {
    auto r = store_->Fsck();
    ASSERT_OK(r);
    EXPECT_TRUE(r->clean()) << "first problem: " << (r->problems.empty() ? "" : r->problems[0]);
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
};

TEST_F(BaseSnapshotTest, AnUnchangedTreeIsTakenWholeFromTheBase) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 7, 12u << 20);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, testing::Import(*store_, src, "first"));
  EXPECT_TRUE(first.base.empty());
  EXPECT_EQ(first.base_chunks, 0u);

  ASSERT_OK_AND_ASSIGN(SnapshotInfo second, ImportOnBase(src, "second", "first"));
  EXPECT_EQ(second.base, "first");
  EXPECT_EQ(second.chunk_count, first.chunk_count);
  EXPECT_EQ(second.base_chunks, second.chunk_count);
  EXPECT_EQ(second.new_chunks, 0u);
  EXPECT_TRUE(ExportMatches(*store_, "second", src, tmp_.path()));

  // And in the manifest users read.
  ASSERT_OK_AND_ASSIGN(SnapshotInfo listed, store_->Get("second"));
  EXPECT_EQ(listed.base, "first");
  EXPECT_EQ(listed.base_chunks, second.chunk_count);
  EXPECT_NE(SnapshotManifestJson(listed).find("\"base_chunks\""), std::string::npos);
  ExpectFsckClean();
}

TEST_F(BaseSnapshotTest, ChangedPagesAreHashedAndStoredAndReadBackNew) {
  const std::string v1 = tmp_.Sub("v1"), v2 = tmp_.Sub("v2");
  testing::MakeDirs(v1);
  testing::MakeDirs(v2);
  const std::string before = testing::RandomBytes(16u << 20, 31);
  std::string after = before;
  // Same length, so every chunk lies where the base's did; two pages far
  // apart change, in place.
  after.replace(1000 * 4096, 4096, testing::RandomBytes(4096, 32));
  after.replace(3000 * 4096 + 100, 10, "0123456789");
  testing::WriteFile(v1 + "/pages-1.img", before);
  testing::WriteFile(v2 + "/pages-1.img", after);
  testing::WriteFile(v1 + "/core-1.img", "core one");
  testing::WriteFile(v2 + "/core-1.img", "core two");  // too small to share a chunk

  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, testing::Import(*store_, v1, "v1"));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo second, ImportOnBase(v2, "v2", "v1"));
  EXPECT_EQ(second.base, "v1");
  // The two chunks around the changed pages and core-1.img are new (a
  // changed page can move one boundary, so up to two chunks each).
  EXPECT_GE(second.new_chunks, 3u);
  EXPECT_LE(second.new_chunks, 5u);
  EXPECT_EQ(second.base_chunks + second.new_chunks, second.chunk_count);
  EXPECT_TRUE(ExportMatches(*store_, "v2", v2, tmp_.path()));
  EXPECT_TRUE(ExportMatches(*store_, "v1", v1, tmp_.path()));

  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("v2", "pages-1.img"));
  std::string page(4096, '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, reader->Pread(1000 * 4096, page.size(), page.data()));
  ASSERT_EQ(n, page.size());
  EXPECT_EQ(page, after.substr(1000 * 4096, 4096));
  ExpectFsckClean();
}

TEST_F(BaseSnapshotTest, DataThatMovedIsFoundInTheBaseByItsFingerprint) {
  const std::string v1 = tmp_.Sub("v1"), v2 = tmp_.Sub("v2");
  testing::MakeDirs(v1);
  testing::MakeDirs(v2);
  const std::string before = testing::RandomBytes(8u << 20, 33);
  // One page in front: no chunk sits at its old offset any more.
  const std::string after = testing::RandomBytes(4096, 34) + before;
  testing::WriteFile(v1 + "/pages-1.img", before);
  testing::WriteFile(v2 + "/pages-1.img", after);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, testing::Import(*store_, v1, "v1"));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo second, ImportOnBase(v2, "v2", "v1"));
  // Every chunk but the new page's (and the one after, whose boundary may
  // move) is the base's, one page further on.
  EXPECT_LE(second.new_chunks, 2u);
  EXPECT_GE(second.base_chunks + 2, second.chunk_count);
  EXPECT_EQ(second.base_chunks + second.new_chunks, second.chunk_count);
  EXPECT_TRUE(ExportMatches(*store_, "v2", v2, tmp_.path()));
  ExpectFsckClean();
}

TEST_F(BaseSnapshotTest, AMissingBaseMeansEveryChunkIsHashed) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 8, 4u << 20);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, ImportOnBase(src, "one", "no-such-snapshot"));
  EXPECT_TRUE(info.base.empty());
  EXPECT_EQ(info.base_chunks, 0u);
  EXPECT_TRUE(ExportMatches(*store_, "one", src, tmp_.path()));
}

TEST_F(BaseSnapshotTest, BaseRemovedAndCollectedMeanwhileKeepsTheChunksTheNewSnapshotNames) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 9, 8u << 20);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, testing::Import(*store_, src, "first"));

  SnapshotSpec spec;
  spec.name = "second";
  spec.base = "first";
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec));
  // The base goes, and a gc is asked for, while the writer runs: the gc
  // must wait, and then keep every chunk the new snapshot names.
  ASSERT_OK(store_->Remove("first"));
  Result<GcReport> gc = Status::Internal("gc did not run");
  std::thread collector([&] { gc = store_->Gc(); });
  const int dir_fd = open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  Status added = AddDirectoryToSnapshot(writer.get(), dir_fd, src, {});
  close(dir_fd);
  ASSERT_OK(added);
  auto info = writer->Commit();
  writer.reset();
  collector.join();
  ASSERT_OK(info);
  ASSERT_OK(gc);
  EXPECT_EQ(info->base_chunks, info->chunk_count);
  EXPECT_EQ(gc->chunks_deleted, 0u);
  EXPECT_TRUE(ExportMatches(*store_, "second", src, tmp_.path()));
  ExpectFsckClean();
}

TEST(ChunkFingerprintTest, DependsOnTheStoresSeed) {
  ASSERT_OK_AND_ASSIGN(std::string seed_a, FingerprintKey::NewSeed());
  ASSERT_OK_AND_ASSIGN(std::string seed_b, FingerprintKey::NewSeed());
  ASSERT_NE(seed_a, seed_b);
  ASSERT_OK_AND_ASSIGN(FingerprintKey a, FingerprintKey::FromSeed(seed_a));
  ASSERT_OK_AND_ASSIGN(FingerprintKey a_again, FingerprintKey::FromSeed(seed_a));
  ASSERT_OK_AND_ASSIGN(FingerprintKey b, FingerprintKey::FromSeed(seed_b));
  const std::string data = testing::RandomBytes(16384, 40);
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  EXPECT_EQ(a.Of(bytes, data.size()), a_again.Of(bytes, data.size()));
  EXPECT_NE(a.Of(bytes, data.size()), b.Of(bytes, data.size()));
  EXPECT_NE(a.Of(bytes, data.size()), a.Of(bytes, data.size() - 1));
  EXPECT_CODE(FingerprintKey::FromSeed("short"), StatusCode::kCorruption);
}

TEST(ExtentRecordTest, ExtentsWithoutAFingerprintStillDecode) {
  ChunkHash hash;
  hash.bytes.fill(7);
  ChunkFingerprint fingerprint;
  fingerprint.bytes.fill(9);
  std::string record = EncodeExtentRecord(hash, 42, 16384, fingerprint);
  ASSERT_OK_AND_ASSIGN(Extent with, DecodeExtentRecord(0, record));
  ASSERT_TRUE(with.fingerprint.has_value());
  EXPECT_EQ(*with.fingerprint, fingerprint);
  EXPECT_EQ(with.seq, 42u);
  EXPECT_EQ(with.length, 16384u);

  // As written before fingerprints: no trailing field.
  record.resize(record.size() - format::kFingerprintSize);
  ASSERT_OK_AND_ASSIGN(Extent without, DecodeExtentRecord(0, record));
  EXPECT_FALSE(without.fingerprint.has_value());
  EXPECT_EQ(without.hash, hash);
  EXPECT_EQ(without.length, 16384u);
}

}  // namespace
}  // namespace gpuckpt
