// Damaged stored data is detected, never returned: a flipped byte in a raw
// or zstd chunk fails Pread (also of a whole file, whose chunks are decoded
// on several threads) and Export with kCorruption and makes Fsck name
// the chunk; a chunk record that went missing likewise. Data the damage does
// not touch stays readable.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "core/catalog/catalog_keys.h"
#include "core/catalog/records.h"
#include "core/store/chunk_hash.h"
#include "core/store/chunker.h"
#include "core/store/format.h"
#include "core/store/store_db.h"
#include "core/store/store_db_rocks.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

struct ChunkSpan {
  uint64_t offset;
  uint64_t length;
  std::string hex;
};

// The chunks the store cuts `data` (a generic file) into.
std::vector<ChunkSpan> ChunksOf(const std::string& data) {
  auto chunker = Chunker::Create(ChunkingOptions().generic, 1);
  EXPECT_TRUE(chunker.ok());
  std::vector<ChunkSpan> out;
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  for (uint64_t pos = 0; pos < data.size();) {
    const size_t n = chunker->NextChunkLength(p + pos, data.size() - pos, pos, true);
    out.push_back({pos, n, HashChunk(p + pos, n).Hex()});
    pos += n;
  }
  return out;
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeDirs(src_);
    victim_ = testing::RandomBytes(1u << 20, 1);
    // Compressible: text with some noise, so its chunks are stored with zstd.
    std::string text;
    testing::Rng rng(2);
    while (text.size() < (1u << 20))
      text += "line " + std::to_string(rng.Uniform(0, 99)) + " of text\n";
    text_ = text;
    bystander_ = testing::RandomBytes(1u << 20, 3);
    testing::WriteFile(src_ + "/victim.bin", victim_);
    testing::WriteFile(src_ + "/text.txt", text_);
    testing::WriteFile(src_ + "/bystander.bin", bystander_);
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(testing::Import(*store, src_, "snap"));
  }
  std::unique_ptr<Store> Open() {
    auto s = Store::Open(store_dir_, testing::TestOptions());
    EXPECT_TRUE(testing::IsOk(s));
    return s.ok() ? std::move(s).value() : nullptr;
  }
  testing::StoredChunk Stored(const std::string& hex) {
    auto chunks = testing::ListStoredChunks(store_dir_);
    EXPECT_TRUE(testing::IsOk(chunks));
    for (const auto& c : *chunks) {
      if (c.hash_hex == hex) return c;
    }
    ADD_FAILURE() << "chunk " << hex << " is not stored";
    return {};
  }
  uint8_t CodecOf(const std::string& hex) { return Stored(hex).codec; }
  // Reads of the damaged file's chunk fail; what the damage does not touch
  // reads back right; export fails without leaving anything; fsck names the
  // chunk.
  void ExpectDetected(const std::string& path, const std::string& data, const ChunkSpan& bad,
                      const ChunkSpan& good) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("snap", path));
    std::string buf(std::max(bad.length, good.length) + 200, '\0');
    // Inside the chunk, and a range starting in a good chunk that runs into it.
    EXPECT_CODE(reader->Pread(bad.offset + 10, 100, buf.data()), StatusCode::kCorruption);
    if (bad.offset > 0) {
      EXPECT_CODE(reader->Pread(bad.offset - 50, 100, buf.data()), StatusCode::kCorruption);
    }
    // The whole file in one read: a run of chunks that ChunkStore decodes on
    // several threads at once; the damaged one fails the read.
    std::string whole(data.size(), '\0');
    EXPECT_CODE(reader->Pread(0, whole.size(), whole.data()), StatusCode::kCorruption);
    // Again: a failed read must not have cached anything.
    EXPECT_CODE(reader->Pread(bad.offset, bad.length, buf.data()), StatusCode::kCorruption);
    auto n = reader->Pread(good.offset, good.length, buf.data());
    ASSERT_OK(n);
    ASSERT_EQ(*n, good.length);
    EXPECT_EQ(std::memcmp(buf.data(), data.data() + good.offset, good.length), 0);

    // Read whole, its chunks decoded on several threads.
    ASSERT_OK_AND_ASSIGN(auto other, store->OpenFile("snap", "bystander.bin"));
    std::string all(bystander_.size(), '\0');
    ASSERT_OK(other->Pread(0, all.size(), all.data()));
    EXPECT_EQ(all, bystander_);

    const std::string parent = tmp_.Sub("exports");
    testing::MakeDirs(parent);
    Status s = store->Export("snap", parent + "/out");
    EXPECT_CODE(s, StatusCode::kCorruption);
    EXPECT_NE(s.message().find(bad.hex), std::string::npos) << s.ToString();
    EXPECT_TRUE(testing::ListDir(parent).empty()) << "a failed export left files behind";

    ASSERT_OK_AND_ASSIGN(FsckReport report, store->Fsck());
    ASSERT_FALSE(report.clean());
    const bool named =
        std::any_of(report.problems.begin(), report.problems.end(),
                    [&](const std::string& p) { return p.find(bad.hex) != std::string::npos; });
    EXPECT_TRUE(named) << "fsck does not name chunk " << bad.hex
                       << "; first problem: " << report.problems[0];
    store.reset();

    std::string out, err;
    EXPECT_EQ(testing::RunCli({"--store", store_dir_, "fsck"}, &out, &err), 3) << err;
    EXPECT_NE(out.find(bad.hex), std::string::npos) << out;
  }

  // Replaces (or with nullopt deletes) the extent record of `path` at
  // `offset` in the closed store: a damaged extent index.
  void DamageExtent(const std::string& path, uint64_t offset, std::optional<std::string> value) {
    uint64_t snapshot_key = 0;
    {
      auto store = Open();
      ASSERT_NE(store, nullptr);
      ASSERT_OK_AND_ASSIGN(SnapshotInfo info, store->Get("snap"));
      snapshot_key = info.key;
    }
    ASSERT_OK_AND_ASSIGN(auto db, StoreDb::Open(store_dir_, false, 8u << 20));
    std::optional<uint32_t> file_index;
    std::unique_ptr<rocksdb::Iterator> it(StoreDbRocks::db(*db)->NewIterator(
        rocksdb::ReadOptions(), StoreDbRocks::family(*db, format::kFilesFamily)));
    for (it->Seek(keys::SnapshotPrefix(snapshot_key));
         it->Valid() && keys::SnapshotKeyOf(it->key().ToStringView()) == snapshot_key; it->Next()) {
      ASSERT_OK_AND_ASSIGN(FileEntry entry, DecodeFileRecord(it->value().ToStringView()));
      if (entry.path == path) file_index = keys::FileIndexOf(it->key().ToStringView());
    }
    it.reset();
    ASSERT_TRUE(file_index.has_value()) << "no file record of " << path;
    const std::string key = keys::ExtentKey(snapshot_key, *file_index, offset);
    rocksdb::ColumnFamilyHandle* extents = StoreDbRocks::family(*db, format::kExtentsFamily);
    std::string old;
    ASSERT_TRUE(StoreDbRocks::db(*db)->Get(rocksdb::ReadOptions(), extents, key, &old).ok())
        << "no extent at " << offset;
    rocksdb::Status s =
        value ? StoreDbRocks::db(*db)->Put(rocksdb::WriteOptions(), extents, key, *value)
              : StoreDbRocks::db(*db)->Delete(rocksdb::WriteOptions(), extents, key);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static bool HasProblem(const FsckReport& report, const std::string& text) {
    return std::any_of(report.problems.begin(), report.problems.end(),
                       [&](const std::string& p) { return p.find(text) != std::string::npos; });
  }

  TempDir tmp_;
  const std::string store_dir_ = tmp_.Sub("store");
  const std::string src_ = tmp_.Sub("src");
  std::string victim_, text_, bystander_;
};

TEST_F(CorruptionTest, FlippedByteInARawChunkIsDetected) {
  const auto chunks = ChunksOf(victim_);
  ASSERT_GE(chunks.size(), 4u);
  const ChunkSpan& bad = chunks[2];
  ASSERT_EQ(CodecOf(bad.hex), 0) << "random data should be stored raw";
  ASSERT_OK(testing::FlipChunkByte(store_dir_, bad.hex, bad.length / 2));
  ExpectDetected("victim.bin", victim_, bad, chunks[0]);
}

TEST_F(CorruptionTest, FlippedByteInAZstdChunkIsDetected) {
  const auto chunks = ChunksOf(text_);
  ASSERT_GE(chunks.size(), 4u);
  const ChunkSpan& bad = chunks[1];
  ASSERT_EQ(CodecOf(bad.hex), 1) << "text should be stored with zstd";
  // Past the frame header, into the compressed data.
  ASSERT_OK(testing::FlipChunkByte(store_dir_, bad.hex, 40));
  ExpectDetected("text.txt", text_, bad, chunks[3]);
}

TEST_F(CorruptionTest, MissingChunkRecordIsDetected) {
  const auto chunks = ChunksOf(victim_);
  ASSERT_GE(chunks.size(), 4u);
  ASSERT_OK(testing::DeleteChunkData(store_dir_, chunks[3].hex));
  ExpectDetected("victim.bin", victim_, chunks[3], chunks[1]);
}

TEST_F(CorruptionTest, IntactRecordsUnderTheWrongKeysAreDetected) {
  // Chunks are kept under sequence numbers and found through their meta
  // record and the extents: a record under the wrong number is intact and
  // hashes right, and must still never be returned for another chunk.
  const auto chunks = ChunksOf(victim_);
  ASSERT_GE(chunks.size(), 4u);
  const std::string key_a = Stored(chunks[1].hex).key, key_b = Stored(chunks[2].hex).key;
  ASSERT_FALSE(key_a.empty());
  ASSERT_NE(key_a, key_b);
  ASSERT_OK(testing::SwapChunkRecords(store_dir_, key_a, key_b));
  ExpectDetected("victim.bin", victim_, chunks[1], chunks[0]);
}

TEST_F(CorruptionTest, GapInTheExtentIndexIsDetected) {
  // An extent record gone: the bytes it covered have no extent. Each reader
  // of the index says where, and the bytes before the gap still read.
  const auto chunks = ChunksOf(victim_);
  ASSERT_GE(chunks.size(), 4u);
  const ChunkSpan& lost = chunks[2];
  DamageExtent("victim.bin", lost.offset, std::nullopt);
  auto store = Open();
  ASSERT_NE(store, nullptr);

  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("snap", "victim.bin"));
  std::string buf(std::max(lost.length, chunks[1].length) + 200, '\0');
  Status s = reader->Pread(lost.offset + 10, 100, buf.data()).status();
  EXPECT_CODE(s, StatusCode::kCorruption);
  EXPECT_NE(s.message().find("no extent covers offset " + std::to_string(lost.offset + 10)),
            std::string::npos)
      << s.ToString();
  // A read that runs from a good extent into the gap fails where the gap starts.
  s = reader->Pread(lost.offset - 50, 100, buf.data()).status();
  EXPECT_NE(s.message().find("no extent covers offset " + std::to_string(lost.offset)),
            std::string::npos)
      << s.ToString();
  auto n = reader->Pread(chunks[1].offset, chunks[1].length, buf.data());
  ASSERT_OK(n);
  EXPECT_EQ(std::string(buf.data(), *n), victim_.substr(chunks[1].offset, chunks[1].length));

  const std::string parent = tmp_.Sub("exports");
  testing::MakeDirs(parent);
  s = store->Export("snap", parent + "/out");
  EXPECT_CODE(s, StatusCode::kCorruption);
  EXPECT_NE(
      s.message().find("'victim.bin': gap in the extent index at " + std::to_string(lost.offset)),
      std::string::npos)
      << s.ToString();
  EXPECT_TRUE(testing::ListDir(parent).empty()) << "a failed export left files behind";

  ASSERT_OK_AND_ASSIGN(FsckReport report, store->Fsck());
  const std::string expected = "snapshot 'snap' file 'victim.bin': extent at " +
                               std::to_string(chunks[3].offset) + ", expected " +
                               std::to_string(lost.offset);
  EXPECT_TRUE(HasProblem(report, expected))
      << "fsck does not say '" << expected
      << "'; first problem: " << (report.problems.empty() ? "(none)" : report.problems[0]);
  EXPECT_EQ(report.damaged_chunks, 0u);
}

TEST_F(CorruptionTest, MalformedExtentRecordIsDetected) {
  const auto chunks = ChunksOf(victim_);
  ASSERT_GE(chunks.size(), 4u);
  const ChunkSpan& bad = chunks[2];
  DamageExtent("victim.bin", bad.offset, std::string("not an extent record"));
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string what = "malformed extent record at offset " + std::to_string(bad.offset);

  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("snap", "victim.bin"));
  std::string buf(100, '\0');
  Status s = reader->Pread(bad.offset + 10, 100, buf.data()).status();
  EXPECT_CODE(s, StatusCode::kCorruption);
  EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();

  const std::string parent = tmp_.Sub("exports");
  testing::MakeDirs(parent);
  s = store->Export("snap", parent + "/out");
  EXPECT_CODE(s, StatusCode::kCorruption);
  EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
  EXPECT_TRUE(testing::ListDir(parent).empty()) << "a failed export left files behind";

  ASSERT_OK_AND_ASSIGN(FsckReport report, store->Fsck());
  EXPECT_TRUE(HasProblem(report, "snapshot 'snap' file 'victim.bin': " + what))
      << "first problem: " << (report.problems.empty() ? "(none)" : report.problems[0]);
  // gc will not sweep what it cannot read: it stops.
  EXPECT_CODE(store->Gc(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace gpuckpt
