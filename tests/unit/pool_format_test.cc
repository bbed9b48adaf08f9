// The shared pool's object names and encodings (core/pool/pool_format.h):
// round trips, and refusal of what is damaged or planted.
#include "core/pool/pool_format.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/unit/test_util.h"

namespace gpuckpt::pool {
namespace {

ChunkHash HashOf(uint8_t first, uint8_t fill) {
  ChunkHash h;
  h.bytes.fill(fill);
  h.bytes[0] = first;
  return h;
}

TEST(PoolFormatTest, ObjectNamesSayWhatTheyHold) {
  EXPECT_EQ(NameObject("1000.job-1"), "gpuckpt.name.1000.job-1");
  EXPECT_EQ(BodyObject("s", 0xab, 2), "gpuckpt.body.s.00000000000000ab.2");
  EXPECT_EQ(BodyObject("s", 1, 0).rfind(BodyObjectPrefix("s"), 0), 0u);
  EXPECT_EQ(IndexObject(63), "gpuckpt.index.3f");
  EXPECT_EQ(IndexShardOf(HashOf(0x41, 0)), 0x41u % kIndexShards);
  const std::string pack = PackObject(0x1234, 7);
  EXPECT_EQ(pack, "gpuckpt.pack.0000000000001234.0000000000000007");
  auto parsed = ParsePackObject(pack);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->first, 0x1234u);
  EXPECT_EQ(parsed->second, 7u);
  EXPECT_FALSE(ParsePackObject("gpuckpt.pack.0000000000001234-0000000000000007").has_value());
  EXPECT_FALSE(ParsePackObject("gpuckpt.pack.000000000000123g.0000000000000007").has_value());
  EXPECT_FALSE(ParsePackObject("gpuckpt.meta").has_value());
}

TEST(PoolFormatTest, MetaKeepsTheSeedAndRefusesAnotherFormat) {
  PoolMeta meta;
  meta.fingerprint_seed = std::string(32, '\x7f');
  meta.fingerprint_seed[0] = '\0';
  auto back = DecodePoolMeta(EncodePoolMeta(meta));
  ASSERT_OK(back);
  EXPECT_EQ(back->fingerprint_seed, meta.fingerprint_seed);
  EXPECT_CODE(DecodePoolMeta(R"({"format": 2, "fingerprint_seed": "00"})"),
              StatusCode::kUnavailable);
  EXPECT_CODE(DecodePoolMeta(R"({"format": 1, "fingerprint_seed": "0g"})"),
              StatusCode::kCorruption);
  EXPECT_CODE(DecodePoolMeta(R"({"format": 1, "fingerprint_seed": "00"})"),
              StatusCode::kCorruption);  // too short for a seed
  EXPECT_CODE(DecodePoolMeta("not json"), StatusCode::kCorruption);
}

TEST(PoolFormatTest, IndexEntriesRoundTripAndRefuseDamage) {
  IndexEntry e;
  e.pack_writer = 0xfedcba9876543210ull;
  e.pack_number = 300;
  e.offset = 5 << 20;
  e.length = 16411;
  e.raw_length = 65536;
  e.condemned_by = 9;
  const std::string encoded = EncodeIndexEntry(e);
  auto back = DecodeIndexEntry(encoded);
  ASSERT_OK(back);
  EXPECT_EQ(back->pack_writer, e.pack_writer);
  EXPECT_EQ(back->pack_number, e.pack_number);
  EXPECT_EQ(back->offset, e.offset);
  EXPECT_EQ(back->length, e.length);
  EXPECT_EQ(back->raw_length, e.raw_length);
  EXPECT_EQ(back->condemned_by, e.condemned_by);
  EXPECT_CODE(DecodeIndexEntry(encoded.substr(0, encoded.size() - 1)), StatusCode::kCorruption);
  EXPECT_CODE(DecodeIndexEntry(encoded + "x"), StatusCode::kCorruption);
  std::string other_version = encoded;
  other_version[0] = 2;
  EXPECT_CODE(DecodeIndexEntry(other_version), StatusCode::kCorruption);
  IndexEntry empty = e;
  empty.length = 0;
  EXPECT_CODE(DecodeIndexEntry(EncodeIndexEntry(empty)), StatusCode::kCorruption);
  const ChunkHash h = HashOf(3, 0xee);
  auto key = ChunkHashOfIndexKey(IndexKey(h));
  ASSERT_OK(key);
  EXPECT_EQ(*key, h);
  EXPECT_CODE(ChunkHashOfIndexKey("short"), StatusCode::kCorruption);
}

TEST(PoolFormatTest, CatalogEntriesRoundTripAndRefuseImpossibleBodies) {
  CatalogEntry e;
  e.incarnation = 42;
  e.body_parts = 2;
  e.body_bytes = kBodyPartBytes + 10;
  e.body_checksum = 0x0123456789abcdefull;
  e.snapshot_record = std::string("\x01{\"key\":0}", 10);
  auto back = DecodeCatalogEntry(EncodeCatalogEntry(e));
  ASSERT_OK(back);
  EXPECT_EQ(back->incarnation, 42u);
  EXPECT_EQ(back->body_parts, 2u);
  EXPECT_EQ(back->body_bytes, e.body_bytes);
  EXPECT_EQ(back->body_checksum, e.body_checksum);
  EXPECT_EQ(back->snapshot_record, e.snapshot_record);
  CatalogEntry too_big = e;
  too_big.body_parts = 1;  // more bytes than one part holds
  EXPECT_CODE(DecodeCatalogEntry(EncodeCatalogEntry(too_big)), StatusCode::kCorruption);
  CatalogEntry none = e;
  none.body_parts = 0;
  EXPECT_CODE(DecodeCatalogEntry(EncodeCatalogEntry(none)), StatusCode::kCorruption);
  EXPECT_CODE(DecodeCatalogEntry(std::string(kMaxCatalogEntryBytes + 1, '\x01')),
              StatusCode::kCorruption);
}

TEST(PoolFormatTest, BodiesRoundTripFilesAndExtents) {
  BodyEncoder encoder;
  std::vector<BodyExtent> extents;
  for (int i = 0; i < 1000; ++i) {
    BodyExtent e;
    e.hash = HashOf(static_cast<uint8_t>(i), static_cast<uint8_t>(i % 3));
    e.length = 4096 + static_cast<uint64_t>(i);
    if (i % 2 == 0) {
      e.fingerprint.emplace();
      e.fingerprint->bytes.fill(static_cast<uint8_t>(i));
    }
    extents.push_back(e);
  }
  ASSERT_OK(encoder.AddFile("\x01{\"path\":\"images/pages-1.img\"}", extents));
  ASSERT_OK(encoder.AddFile("\x01{\"path\":\"images\",\"type\":\"dir\"}", {}));
  auto encoded = encoder.Finish();
  ASSERT_OK(encoded);
  auto files = DecodeBody(*encoded, "test");
  ASSERT_OK(files);
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].file_record, "\x01{\"path\":\"images/pages-1.img\"}");
  ASSERT_EQ((*files)[0].extents.size(), extents.size());
  for (size_t i = 0; i < extents.size(); ++i) {
    EXPECT_EQ((*files)[0].extents[i].hash, extents[i].hash);
    EXPECT_EQ((*files)[0].extents[i].length, extents[i].length);
    EXPECT_EQ((*files)[0].extents[i].fingerprint, extents[i].fingerprint);
  }
  EXPECT_TRUE((*files)[1].extents.empty());
  // Repeated names compress: a body is far smaller than its extents.
  EXPECT_LT(encoded->size(), extents.size() * 40);
}

TEST(PoolFormatTest, DamagedBodiesAreRefused) {
  BodyEncoder encoder;
  ASSERT_OK(encoder.AddFile("\x01{}", {BodyExtent{HashOf(1, 1), 100, std::nullopt}}));
  auto encoded = encoder.Finish();
  ASSERT_OK(encoded);
  EXPECT_CODE(DecodeBody(encoded->substr(0, encoded->size() - 3), "cut"), StatusCode::kCorruption);
  EXPECT_CODE(DecodeBody(*encoded + *encoded, "twice"), StatusCode::kCorruption);
  EXPECT_CODE(DecodeBody("not zstd at all", "garbage"), StatusCode::kCorruption);
  // A well-formed frame of something that is no body.
  BodyEncoder empty;
  auto just_header = empty.Finish();
  ASSERT_OK(just_header);
  auto none = DecodeBody(*just_header, "empty");
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
  EXPECT_NE(BodyChecksum(*encoded), BodyChecksum(*just_header));
}

}  // namespace
}  // namespace gpuckpt::pool
