// Dedup domains (SnapshotSpec::dedup_domain): chunks are shared only among
// snapshots of one domain, so what a snapshot reports as new never depends
// on another owner's data. The same tree in domains 1000, 1001 and the
// shared one is stored three times; within a domain it dedups as before;
// reads, exports, fsck (also of damage) and kFullHash reads use the
// domain's key; a base of another domain is ignored; gc reclaims a
// domain's chunks like any others.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/catalog/records.h"
#include "core/snapshot/store_impl.h"
#include "core/store/chunk_codec.h"
#include "core/store/chunk_hash.h"
#include "core/store/chunk_store.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::ReadAll;
using testing::TempDir;

constexpr uint32_t kAlice = 1000;
constexpr uint32_t kBob = 1001;

std::unique_ptr<Store> OpenStore(const std::string& dir,
                                 ReadVerification verify = ReadVerification::kChecksum) {
  StoreOptions options = testing::TestOptions();
  options.verify_on_read = verify;
  auto store = Store::Open(dir, options);
  EXPECT_TRUE(testing::IsOk(store));
  return store.ok() ? std::move(store).value() : nullptr;
}

Result<SnapshotInfo> ImportIn(Store& store, const std::string& src, const std::string& name,
                              std::optional<uint32_t> domain, const std::string& base = "") {
  SnapshotSpec spec;
  spec.name = name;
  spec.source = src;
  spec.dedup_domain = domain;
  spec.base = base;
  return store.ImportDirectory(src, spec);
}

// Incompressible files, so that every byte of a first import is new.
std::string MakeRandomTree(const TempDir& tmp) {
  const std::string src = tmp.Sub("src");
  testing::MakeDirs(src + "/sub");
  testing::WriteRandomFile(src + "/a.bin", 3u << 20, 11);
  testing::WriteRandomFile(src + "/sub/b.bin", 1u << 20, 12);
  testing::WriteRandomFile(src + "/tiny.bin", 1000, 13);  // one chunk
  return src;
}

void ExpectClean(Store& store) {
  auto report = store.Fsck();
  ASSERT_TRUE(testing::IsOk(report));
  EXPECT_TRUE(report->clean()) << ::testing::PrintToString(report->problems);
  EXPECT_EQ(report->damaged_chunks, 0u);
}

TEST(DedupDomainTest, EachDomainStoresItsChunksAnewAndDedupsWithinItself) {
  TempDir tmp;
  const std::string src = MakeRandomTree(tmp);
  const std::string store_dir = tmp.Sub("store");
  const std::string tiny = testing::ReadFile(src + "/tiny.bin");
  ChunkHash keyed_tiny;
  {
    auto store = OpenStore(store_dir);
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(SnapshotInfo alice, ImportIn(*store, src, "alice", kAlice));
    ASSERT_OK_AND_ASSIGN(SnapshotInfo bob, ImportIn(*store, src, "bob", kBob));
    ASSERT_OK_AND_ASSIGN(SnapshotInfo shared, ImportIn(*store, src, "shared", std::nullopt));
    for (const SnapshotInfo* info : {&alice, &bob, &shared}) {
      SCOPED_TRACE(info->id);
      EXPECT_EQ(info->logical_bytes, (4u << 20) + 1000u);
      EXPECT_EQ(info->new_bytes, info->logical_bytes);
      EXPECT_EQ(info->new_chunks, info->chunk_count);
      EXPECT_GT(info->stored_bytes, 0u);
    }
    EXPECT_EQ(alice.dedup_domain, std::optional<uint32_t>(kAlice));
    EXPECT_EQ(bob.dedup_domain, std::optional<uint32_t>(kBob));
    EXPECT_EQ(shared.dedup_domain, std::nullopt);

    // Within a domain, dedup as before.
    ASSERT_OK_AND_ASSIGN(SnapshotInfo again, ImportIn(*store, src, "alice2", kAlice));
    EXPECT_EQ(again.new_chunks, 0u);
    EXPECT_EQ(again.new_bytes, 0u);
    EXPECT_EQ(again.stored_bytes, 0u);
    ASSERT_OK_AND_ASSIGN(StoreStats stats, store->Stats());
    EXPECT_EQ(stats.chunk_count, 3 * alice.new_chunks);
    EXPECT_EQ(stats.unique_bytes, 3 * alice.new_bytes);

    // Recorded, and shown in the manifest only when set.
    ASSERT_OK_AND_ASSIGN(SnapshotInfo got, store->Get("alice"));
    EXPECT_EQ(got.dedup_domain, std::optional<uint32_t>(kAlice));
    ASSERT_OK_AND_ASSIGN(got, store->Get("shared"));
    EXPECT_EQ(got.dedup_domain, std::nullopt);
    EXPECT_NE(SnapshotManifestJson(alice).find("\"dedup_domain\": 1000"), std::string::npos)
        << SnapshotManifestJson(alice);
    EXPECT_EQ(SnapshotManifestJson(shared).find("dedup_domain"), std::string::npos);

    for (const std::string id : {"alice", "alice2", "bob", "shared"}) {
      SCOPED_TRACE(id);
      EXPECT_EQ(ReadAll(*store, id, "a.bin"), testing::ReadFile(src + "/a.bin"));
      EXPECT_EQ(ReadAll(*store, id, "tiny.bin"), tiny);
      EXPECT_TRUE(ExportMatches(*store, id, src, tmp.path()));
    }
    ExpectClean(*store);

    const auto& db = *static_cast<StoreImpl&>(*store).db();
    const std::optional<ChunkDomainKey> key = db.domain_key(kAlice);
    ASSERT_TRUE(key.has_value());
    EXPECT_EQ(db.domain_key(std::nullopt), std::nullopt);
    EXPECT_NE(db.domain_key(kBob), key);
    keyed_tiny = HashChunk(reinterpret_cast<const uint8_t*>(tiny.data()), tiny.size(), &*key);
  }
  // The one chunk of tiny.bin is stored under its keyed name in domain
  // 1000 and under its plain SHA-256 in the shared domain.
  const ChunkHash plain_tiny =
      HashChunk(reinterpret_cast<const uint8_t*>(tiny.data()), tiny.size());
  EXPECT_NE(keyed_tiny, plain_tiny);
  ASSERT_OK_AND_ASSIGN(auto stored, testing::ListStoredChunks(store_dir));
  auto has = [&](const ChunkHash& h) {
    return std::any_of(stored.begin(), stored.end(),
                       [&](const testing::StoredChunk& c) { return c.hash_hex == h.Hex(); });
  };
  EXPECT_TRUE(has(keyed_tiny));
  EXPECT_TRUE(has(plain_tiny));
}

TEST(DedupDomainTest, DomainKeysDependOnTheStoreAndTheUid) {
  const std::string seed_a(32, 'a'), seed_b(32, 'b');
  EXPECT_EQ(DeriveChunkDomainKey(seed_a, 7), DeriveChunkDomainKey(seed_a, 7));
  EXPECT_NE(DeriveChunkDomainKey(seed_a, 7), DeriveChunkDomainKey(seed_a, 8));
  EXPECT_NE(DeriveChunkDomainKey(seed_a, 7), DeriveChunkDomainKey(seed_b, 7));
  // uid 0 (root's domain) is a domain like any other, not the shared one.
  const std::string data = "some bytes";
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const ChunkDomainKey root = DeriveChunkDomainKey(seed_a, 0);
  EXPECT_NE(HashChunk(p, data.size(), &root), HashChunk(p, data.size()));
}

TEST(DedupDomainTest, FsckChecksKeyedNamesAndReportsAFlippedByte) {
  TempDir tmp;
  const std::string src = MakeRandomTree(tmp);
  const std::string store_dir = tmp.Sub("store");
  {
    auto store = OpenStore(store_dir);
    ASSERT_NE(store, nullptr);
    ASSERT_OK(ImportIn(*store, src, "alice", kAlice));
    ExpectClean(*store);
  }
  ASSERT_OK_AND_ASSIGN(auto stored, testing::ListStoredChunks(store_dir));
  ASSERT_FALSE(stored.empty());
  const std::string victim = stored.front().hash_hex;
  ASSERT_OK(testing::FlipChunkByte(store_dir, victim, 0));

  auto store = OpenStore(store_dir);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(FsckReport report, store->Fsck());
  EXPECT_EQ(report.damaged_chunks, 1u);
  EXPECT_EQ(report.damaged_files, 1u);
  ASSERT_EQ(report.problems.size(), 2u) << ::testing::PrintToString(report.problems);
  EXPECT_NE(report.problems[0].find("damaged chunk " + victim), std::string::npos)
      << report.problems[0];
}

TEST(DedupDomainTest, CheckRehashesInTheGivenDomains) {
  const std::string data = testing::RandomBytes(5000, 3);
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const ChunkDomainKey alice = DeriveChunkDomainKey(std::string(32, 's'), kAlice);
  const ChunkDomainKey bob = DeriveChunkDomainKey(std::string(32, 's'), kBob);
  std::string record;
  EncodeChunkRecord(p, data.size(), HashChunk(p, data.size(), &alice), 1, &record);
  // The checksum holds in every case: only the name tells them apart.
  using Domains = std::vector<const ChunkDomainKey*>;
  const Domains in_alice{&alice}, shared_or_alice{nullptr, &alice}, none, shared{nullptr},
      in_bob{&bob};
  EXPECT_OK(ChunkStore::Check(record, 1, in_alice));
  EXPECT_OK(ChunkStore::Check(record, 1, shared_or_alice));
  EXPECT_OK(ChunkStore::Check(record, 1, none));  // named by no snapshot: checksum only
  EXPECT_CODE(ChunkStore::Check(record, 1, shared), StatusCode::kCorruption);
  EXPECT_CODE(ChunkStore::Check(record, 1, in_bob), StatusCode::kCorruption);
}

TEST(DedupDomainTest, FsckDoesNotReportUnreferencedChunksOfAGoneDomain) {
  TempDir tmp;
  const std::string src = MakeRandomTree(tmp);
  auto store = OpenStore(tmp.Sub("store"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(ImportIn(*store, src, "alice", kAlice));
  ASSERT_OK(store->Remove("alice"));
  // Garbage of a domain that has no snapshot left: its names cannot be
  // checked, its checksums can.
  ASSERT_OK_AND_ASSIGN(FsckReport report, store->Fsck());
  EXPECT_TRUE(report.clean()) << ::testing::PrintToString(report.problems);
  EXPECT_GT(report.chunks_checked, 0u);
}

TEST(DedupDomainTest, FullHashReadsOfKeyedSnapshots) {
  TempDir tmp;
  const std::string src = MakeRandomTree(tmp);
  auto store = OpenStore(tmp.Sub("store"), ReadVerification::kFullHash);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(ImportIn(*store, src, "alice", kAlice));
  ASSERT_OK(ImportIn(*store, src, "shared", std::nullopt));
  for (const std::string id : {"alice", "shared"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(ReadAll(*store, id, "a.bin"), testing::ReadFile(src + "/a.bin"));
    EXPECT_EQ(ReadAll(*store, id, "sub/b.bin"), testing::ReadFile(src + "/sub/b.bin"));
    EXPECT_TRUE(ExportMatches(*store, id, src, tmp.path()));
  }
}

TEST(DedupDomainTest, ABaseIsUsedOnlyWithinItsDomain) {
  TempDir tmp;
  const std::string src = MakeRandomTree(tmp);
  auto store = OpenStore(tmp.Sub("store"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, ImportIn(*store, src, "alice1", kAlice));

  ASSERT_OK_AND_ASSIGN(SnapshotInfo bob, ImportIn(*store, src, "bob", kBob, "alice1"));
  EXPECT_EQ(bob.base_chunks, 0u);
  EXPECT_EQ(bob.base, "");
  EXPECT_EQ(bob.new_bytes, bob.logical_bytes);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo shared,
                       ImportIn(*store, src, "shared", std::nullopt, "alice1"));
  EXPECT_EQ(shared.base_chunks, 0u);
  EXPECT_EQ(shared.new_bytes, shared.logical_bytes);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo bob2, ImportIn(*store, src, "bob2", kBob, "shared"));
  EXPECT_EQ(bob2.base_chunks, 0u);
  EXPECT_EQ(bob2.new_bytes, 0u);  // bob's own chunks, found by name

  ASSERT_OK_AND_ASSIGN(SnapshotInfo second, ImportIn(*store, src, "alice2", kAlice, "alice1"));
  EXPECT_EQ(second.base, "alice1");
  EXPECT_EQ(second.base_chunks, first.chunk_count);
  EXPECT_EQ(second.new_bytes, 0u);
  for (const std::string id : {"bob", "shared", "bob2", "alice2"}) {
    EXPECT_TRUE(ExportMatches(*store, id, src, tmp.path()));
  }
  ExpectClean(*store);
}

TEST(DedupDomainTest, RemoveAndGcReclaimADomainsChunks) {
  TempDir tmp;
  const std::string src = MakeRandomTree(tmp);
  auto store = OpenStore(tmp.Sub("store"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo alice, ImportIn(*store, src, "alice", kAlice));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo bob, ImportIn(*store, src, "bob", kBob));
  ASSERT_OK(store->Remove("alice"));
  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_EQ(gc.chunks_deleted, alice.new_chunks);
  EXPECT_EQ(gc.chunks_kept, bob.new_chunks);
  ASSERT_OK_AND_ASSIGN(StoreStats stats, store->Stats());
  EXPECT_EQ(stats.chunk_count, bob.new_chunks);
  EXPECT_TRUE(ExportMatches(*store, "bob", src, tmp.path()));
  ExpectClean(*store);

  // Alice's next snapshot finds nothing of hers left, and nothing of Bob's.
  ASSERT_OK_AND_ASSIGN(SnapshotInfo again, ImportIn(*store, src, "alice-again", kAlice));
  EXPECT_EQ(again.new_bytes, again.logical_bytes);
}

TEST(DedupDomainTest, RecordsWithoutADomainAreShared) {
  SnapshotInfo info;
  info.id = "x";
  info.key = 4;
  ASSERT_OK_AND_ASSIGN(SnapshotInfo plain, DecodeSnapshotRecord("x", EncodeSnapshotRecord(info)));
  EXPECT_EQ(plain.dedup_domain, std::nullopt);
  EXPECT_EQ(EncodeSnapshotRecord(info).find("dedup_domain"), std::string::npos);
  info.dedup_domain = 0;  // root's own domain, not the shared one
  ASSERT_OK_AND_ASSIGN(SnapshotInfo keyed, DecodeSnapshotRecord("x", EncodeSnapshotRecord(info)));
  EXPECT_EQ(keyed.dedup_domain, std::optional<uint32_t>(0));
  std::string bad = EncodeSnapshotRecord(info);
  const size_t at = bad.find("\"dedup_domain\":0");
  ASSERT_NE(at, std::string::npos) << bad;
  bad.replace(at, 16, "\"dedup_domain\":4294967296");
  EXPECT_CODE(DecodeSnapshotRecord("x", bad), StatusCode::kCorruption);
}

}  // namespace
}  // namespace gpuckpt
