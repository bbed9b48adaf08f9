// Chunk records in pack files: ChunkPacks on its own (appends from many
// threads, rotation, removal, a new pack after reopening, damaged location
// records), and through the Store: gc gives pack space back by removing and
// rewriting packs, packs left without references are removed, a store
// written by version 1 (records inside RocksDB) is still read and upgraded,
// only large reads have the kernel read on ahead in the packs, and direct
// reads come straight from the disk where records are not in the page
// cache, from the cache where they are.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/base/scope_exit.h"
#include "core/store/chunk_cache.h"
#include "core/store/chunk_codec.h"
#include "core/store/chunk_hash.h"
#include "core/store/chunk_packs.h"
#include "core/store/chunk_store.h"
#include "core/store/format.h"
#include "core/store/store_db.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::Import;
using testing::TempDir;

uint64_t PackBytes(const std::string& store_dir) {
  uint64_t total = 0;
  for (const std::string& name : testing::ListDir(store_dir + "/" + format::kPacksDirName)) {
    struct stat st {};
    if (stat((store_dir + "/" + format::kPacksDirName + "/" + name).c_str(), &st) == 0) {
      total += static_cast<uint64_t>(st.st_size);
    }
  }
  return total;
}

TEST(ChunkPacksTest, AppendsFromManyThreadsReadBackWhereTheySay) {
  TempDir tmp;
  ASSERT_OK_AND_ASSIGN(auto packs, ChunkPacks::Open(tmp.Sub("packs")));
  constexpr int kThreads = 4, kEach = 200;
  std::vector<std::vector<std::pair<PackLocation, std::string>>> written(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::string record = testing::RandomBytes(100 + (i * 37) % 5000, t * 1000 + i);
        auto l = packs->Append(record);
        ASSERT_OK(l);
        written[t].emplace_back(*l, std::move(record));
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_OK(packs->Sync());
  std::set<uint64_t> offsets;
  for (const auto& per_thread : written) {
    for (const auto& [l, record] : per_thread) {
      EXPECT_GE(l.offset, ChunkPacks::kHeaderSize);
      EXPECT_TRUE(offsets.insert(l.offset).second) << "two records at " << l.offset;
      std::string got;
      ASSERT_OK(packs->Read(l, &got));
      EXPECT_EQ(got, record);
      ASSERT_OK_AND_ASSIGN(PackLocation back, DecodePackLocation(EncodePackLocation(l)));
      EXPECT_EQ(back.pack, l.pack);
      EXPECT_EQ(back.offset, l.offset);
      EXPECT_EQ(back.length, l.length);
    }
  }
}

TEST(ChunkPacksTest, RotateRemoveAndReopenNeverAppendToAnOldPack) {
  TempDir tmp;
  const std::string dir = tmp.Sub("packs");
  PackLocation first, second;
  {
    ASSERT_OK_AND_ASSIGN(auto packs, ChunkPacks::Open(dir));
    ASSERT_OK_AND_ASSIGN(first, packs->Append("one"));
    packs->Rotate();
    ASSERT_OK_AND_ASSIGN(second, packs->Append("two"));
    EXPECT_GT(second.pack, first.pack);
    ASSERT_OK_AND_ASSIGN(auto list, packs->List());
    ASSERT_EQ(list.size(), 2u);
    EXPECT_FALSE(list[0].active);
    EXPECT_TRUE(list[1].active);
    EXPECT_EQ(list[0].size, ChunkPacks::kHeaderSize + 3);
    EXPECT_CODE(packs->Remove(second.pack), StatusCode::kInvalidArgument)
        << "the active pack is never removed";
    ASSERT_OK(packs->Remove(first.pack));
    std::string got;
    EXPECT_CODE(packs->Read(first, &got), StatusCode::kNotFound);
    ASSERT_OK(packs->Sync());
  }
  ASSERT_OK_AND_ASSIGN(auto packs, ChunkPacks::Open(dir));
  ASSERT_OK_AND_ASSIGN(PackLocation third, packs->Append("three"));
  EXPECT_GT(third.pack, second.pack) << "a reopened store starts a new pack";
  std::string got;
  ASSERT_OK(packs->Read(second, &got));
  EXPECT_EQ(got, "two");
  // A location past the end of its pack is damage, not a short read.
  PackLocation beyond = second;
  beyond.length = 4096;
  EXPECT_CODE(packs->Read(beyond, &got), StatusCode::kCorruption);
}

TEST(ChunkPacksTest, DamagedLocationRecordsAreCorruption) {
  const std::string good = EncodePackLocation(PackLocation{3, 100, 2000});
  EXPECT_TRUE(IsPackLocation(good));
  EXPECT_FALSE(IsPackLocation(std::string(1, static_cast<char>(format::kChunkRecordVersion))));
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_CODE(DecodePackLocation(good.substr(0, cut)), StatusCode::kCorruption) << cut;
  }
  EXPECT_CODE(DecodePackLocation(EncodePackLocation(PackLocation{3, 0, 10})),
              StatusCode::kCorruption)
      << "no record lies in the header";
  EXPECT_CODE(DecodePackLocation(EncodePackLocation(PackLocation{3, 100, 0})),
              StatusCode::kCorruption);
  EXPECT_CODE(DecodePackLocation(EncodePackLocation(PackLocation{3, 100, 1ull << 40})),
              StatusCode::kCorruption)
      << "a length no chunk can have";
}

class PackStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> Open() {
    auto s = Store::Open(store_dir_, testing::TestOptions());
    EXPECT_TRUE(testing::IsOk(s));
    return s.ok() ? std::move(s).value() : nullptr;
  }
  void ExpectFsckClean(Store& store) {
    auto r = store.Fsck();
    ASSERT_OK(r);
    EXPECT_TRUE(r->clean()) << "first problem: " << (r->problems.empty() ? "" : r->problems[0]);
  }

  TempDir tmp_;
  const std::string store_dir_ = tmp_.Sub("store");
};

TEST_F(PackStoreTest, GcRewritesMostlyDeadPacksAndRemovesDeadOnes) {
  const std::string big = tmp_.Sub("big"), small = tmp_.Sub("small");
  testing::MakeDirs(big);
  testing::MakeDirs(small);
  testing::WriteRandomFile(big + "/only-big.bin", 6u << 20, 41);
  testing::WriteRandomFile(small + "/only-small.bin", 2u << 20, 42);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, big, "big"));
  ASSERT_OK(Import(*store, small, "small"));
  const uint64_t before = PackBytes(store_dir_);
  EXPECT_GE(before, 8u << 20) << "random chunks are stored raw, in packs";

  // Both snapshots share one pack; without "big" it is three quarters dead.
  ASSERT_OK(store->Remove("big"));
  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_EQ(gc.packs_rewritten, 1u);
  EXPECT_GE(gc.packs_removed, 1u);
  EXPECT_GE(gc.bytes_rewritten, 2u << 20);
  EXPECT_LT(gc.bytes_rewritten, 3u << 20);
  const uint64_t after = PackBytes(store_dir_);
  EXPECT_LT(after, before - (5u << 20)) << "the dead 6 MiB are given back";
  EXPECT_TRUE(ExportMatches(*store, "small", small, tmp_.path()));
  ExpectFsckClean(*store);

  // Nothing left to do: a second gc rewrites nothing.
  ASSERT_OK_AND_ASSIGN(GcReport again, store->Gc());
  EXPECT_EQ(again.packs_rewritten, 0u);
  ASSERT_OK(store->Remove("small"));
  ASSERT_OK_AND_ASSIGN(GcReport last, store->Gc());
  EXPECT_GE(last.packs_removed, 1u);
  EXPECT_LT(PackBytes(store_dir_), 64u) << "only empty pack headers may stay";

  // Still a working store.
  ASSERT_OK(Import(*store, small, "small-again"));
  EXPECT_TRUE(ExportMatches(*store, "small-again", small, tmp_.path()));
}

TEST_F(PackStoreTest, GcRemovesPacksThatNothingPointsInto) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  testing::WriteRandomFile(src + "/f.bin", 1u << 20, 43);
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Import(*store, src, "kept"));
  }
  // What a crash between appending and publishing leaves: records no
  // location points at.
  {
    ASSERT_OK_AND_ASSIGN(auto packs, ChunkPacks::Open(store_dir_ + "/" + format::kPacksDirName));
    ASSERT_OK(packs->Append(testing::RandomBytes(3u << 20, 44)));
    ASSERT_OK(packs->Sync());
  }
  const uint64_t before = PackBytes(store_dir_);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_EQ(gc.chunks_deleted, 0u);
  EXPECT_EQ(gc.packs_removed, 1u);
  EXPECT_EQ(gc.packs_rewritten, 0u);
  EXPECT_LT(PackBytes(store_dir_), before - (3u << 20));
  EXPECT_TRUE(ExportMatches(*store, "kept", src, tmp_.path()));
  ExpectFsckClean(*store);
}

TEST_F(PackStoreTest, AVersion1StoreIsReadAndUpgraded) {
  const std::string src = tmp_.Sub("src"), more = tmp_.Sub("more");
  testing::MakeCheckpointTree(src, 45, 3u << 20);
  testing::MakeCheckpointTree(more, 46, 3u << 20);
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Import(*store, src, "old"));
  }
  ASSERT_OK(testing::MakeVersion1Store(store_dir_));
  ASSERT_OK_AND_ASSIGN(auto inline_chunks, testing::ListStoredChunks(store_dir_));
  ASSERT_FALSE(inline_chunks.empty());
  EXPECT_EQ(PackBytes(store_dir_), 0u);

  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(ExportMatches(*store, "old", src, tmp_.path()));
  ASSERT_OK(Import(*store, more, "new"));
  EXPECT_GT(PackBytes(store_dir_), 0u) << "new chunks go to packs";
  EXPECT_TRUE(ExportMatches(*store, "new", more, tmp_.path()));
  ExpectFsckClean(*store);
  // Old and new chunks are collected alike.
  ASSERT_OK(store->Remove("old"));
  ASSERT_OK(store->Gc());
  EXPECT_TRUE(ExportMatches(*store, "new", more, tmp_.path()));
  ExpectFsckClean(*store);
  store.reset();
  ASSERT_OK_AND_ASSIGN(std::string version, testing::StoredVersion(store_dir_));
  EXPECT_EQ(version, std::to_string(format::kStoreVersion));
}

// The share of the pages of [offset, offset + len) of `fd` in the page
// cache; -1 where it cannot be told.
double ResidentShare(int fd, uint64_t offset, uint64_t len) {
  void* map = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (map == MAP_FAILED) return -1;
  const size_t pages = (len + 4095) / 4096;
  std::vector<unsigned char> in(pages);
  const int r = mincore(map, len, in.data());
  munmap(map, len);
  if (r != 0) return -1;
  size_t resident = 0;
  for (unsigned char c : in) resident += c & 1;
  return static_cast<double>(resident) / static_cast<double>(pages);
}

// `count` random chunks of kRawChunk bytes (stored raw), put one after
// another into `chunks`, which must be the first in `db`'s packs: their
// bytes into `*data`, their refs into `*refs`, the one pack's path into
// `*pack`.
constexpr size_t kRawChunk = 128u << 10;
void PutRawChunksInOnePack(StoreDb& db, ChunkStore* chunks, size_t count,
                           std::vector<std::string>* data, std::vector<ChunkStore::ChunkRef>* refs,
                           std::string* pack) {
  for (size_t i = 0; i < count; ++i) {
    data->push_back(testing::RandomBytes(kRawChunk, 700 + i));
    const auto* bytes = reinterpret_cast<const uint8_t*>(data->back().data());
    const ChunkHash hash = HashChunk(bytes, kRawChunk);
    ASSERT_OK_AND_ASSIGN(ChunkStore::PutResult put, chunks->Put(hash, bytes, kRawChunk, 0));
    refs->push_back(ChunkStore::ChunkRef{hash, put.seq, kRawChunk, /*use_cache=*/false});
  }
  ASSERT_OK(db.packs().Sync());
  const std::vector<std::string> names = testing::ListDir(db.packs().dir());
  ASSERT_EQ(names.size(), 1u);
  *pack = db.packs().dir() + "/" + names[0];
}

TEST(ChunkStoreReadAheadTest, OnlyLargeReadsHaveTheKernelReadAheadInThePacks) {
  TempDir tmp;
  ASSERT_OK_AND_ASSIGN(auto db, StoreDb::Open(tmp.Sub("store"), true, 8u << 20));
  ChunkCache cache(8u << 20);
  ASSERT_OK_AND_ASSIGN(auto chunks,
                       ChunkStore::Open(db.get(), &cache, ReadVerification::kChecksum));
  constexpr size_t kChunk = kRawChunk, kCount = 112;
  std::vector<std::string> data;
  std::vector<ChunkStore::ChunkRef> refs;
  std::string pack;
  ASSERT_NO_FATAL_FAILURE(PutRawChunksInOnePack(*db, chunks.get(), kCount, &data, &refs, &pack));
  const std::string bytes = testing::ReadFile(pack);
  // The chunk whose record crosses 4 MiB of the pack.
  size_t crossing = kCount;
  for (size_t i = 0; i + 1 < kCount && crossing == kCount; ++i) {
    const size_t at = bytes.find(data[i].substr(0, 64));
    ASSERT_NE(at, std::string::npos) << "chunk " << i << " is stored raw";
    if (at < (4u << 20) && at + kChunk > (4u << 20)) crossing = i;
  }
  ASSERT_LT(crossing, kCount - 1);

  const int fd = open(pack.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ScopeExit close_fd([&] { close(fd); });
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);  // as after a reboot
  const double dropped = ResidentShare(fd, 0, 12u << 20);
  if (dropped < 0 || dropped > 0.1)
    GTEST_SKIP() << "the page cache of " << pack << " cannot be dropped here (tmpfs?)";

  // One chunk (a page fault's read) across 4 MiB: nothing read ahead
  // after 8 MiB, where a read-ahead would start.
  std::vector<ChunkStore::ChunkBytes> out;
  ASSERT_OK(chunks->ReadMany({refs[crossing]}, nullptr, &out));
  ASSERT_EQ(out[0].bytes, data[crossing]);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(ResidentShare(fd, 8u << 20, 4u << 20), 0.05)
      << "a small read had the kernel read ahead in the pack";

  // Three (384 KiB, a reader going through) across the same 4 MiB: the
  // MiB after 8 MiB comes in.
  ASSERT_OK(
      chunks->ReadMany({refs[crossing - 1], refs[crossing], refs[crossing + 1]}, nullptr, &out));
  ASSERT_EQ(out[2].bytes, data[crossing + 1]);
  double ahead = 0;
  for (int i = 0; i < 100 && ahead < 0.9; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ahead = ResidentShare(fd, 8u << 20, 1u << 20);
  }
  EXPECT_GE(ahead, 0.9) << "a large read had nothing read ahead of it";
}

// Bytes this process has had read from storage so far (its I/O
// accounting; direct reads count as they are asked, cached ones not at
// all); -1 where the kernel does not tell.
int64_t StorageReadBytes() {
  const std::string io = testing::ReadFile("/proc/self/io");
  const size_t at = io.find("\nread_bytes: ");
  if (at == std::string::npos) return -1;
  return std::stoll(io.substr(at + 13));
}

// A buffer for ChunkPacks::ReadRangeDirect() of `len` bytes at `offset`.
struct DirectRoom {
  DirectRoom(uint64_t offset, size_t len)
      : block(static_cast<char*>(std::aligned_alloc(ChunkPacks::kDirectAlign,
                                                    ChunkPacks::DirectSpan(offset, len))),
              [](char* p) { std::free(p); }),
        data(block.get() + offset % ChunkPacks::kDirectAlign) {}
  std::unique_ptr<char, void (*)(char*)> block;
  char* const data;
};

TEST(ChunkPacksTest, DirectReadsReadWhatTheyAskForWhereverItLies) {
  TempDir tmp;
  ASSERT_OK_AND_ASSIGN(auto packs, ChunkPacks::Open(tmp.Sub("packs")));
  std::string records;
  PackLocation last{};
  for (int i = 0; i < 40; ++i) {  // about 2.6 MiB, records at any offset
    std::string record = testing::RandomBytes(1000 + (i * 7919) % 130000, 900 + i);
    ASSERT_OK_AND_ASSIGN(last, packs->Append(record));
    records += record;
  }
  ASSERT_OK(packs->Sync());
  const std::string path = packs->dir() + "/" + testing::ListDir(packs->dir())[0];
  const std::string bytes = testing::ReadFile(path);
  ASSERT_EQ(bytes.substr(ChunkPacks::kHeaderSize), records);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ScopeExit close_fd([&] { close(fd); });

  const uint64_t end = bytes.size();
  const std::vector<std::pair<uint64_t, size_t>> ranges = {
      {16, 1},      {16, 4080},         {4095, 2},
      {4096, 4096}, {5000, 300000},     {1u << 20, 1u << 20},
      {end - 1, 1}, {end - 5000, 5000}, {end - 70000, 70000}};
  for (bool cached : {false, true}) {
    // Cold (as after a reboot: each read straight from the disk) and all
    // in the page cache (each read from there).
    ASSERT_EQ(posix_fadvise(fd, 0, 0, cached ? POSIX_FADV_WILLNEED : POSIX_FADV_DONTNEED), 0);
    if (cached) (void)testing::ReadFile(path);
    for (const auto& [offset, len] : ranges) {
      DirectRoom room(offset, len);
      ASSERT_OK(packs->ReadRangeDirect(last.pack, offset, len, room.data))
          << offset << "+" << len << (cached ? " cached" : " cold");
      EXPECT_EQ(std::string_view(room.data, len), std::string_view(bytes).substr(offset, len))
          << offset << "+" << len << (cached ? " cached" : " cold");
    }
  }
  // Past the end of the pack: damage, as for ReadRange().
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  DirectRoom beyond(end - 100, 8192);
  EXPECT_CODE(packs->ReadRangeDirect(last.pack, end - 100, 8192, beyond.data),
              StatusCode::kCorruption);
}

TEST(ChunkStoreDirectReadTest, ColdDirectReadsLeaveThePageCacheAloneWarmOnesUseIt) {
  TempDir tmp;
  ASSERT_OK_AND_ASSIGN(auto db, StoreDb::Open(tmp.Sub("store"), true, 8u << 20));
  ChunkCache cache(8u << 20);
  ASSERT_OK_AND_ASSIGN(auto chunks, ChunkStore::Open(db.get(), &cache, ReadVerification::kChecksum,
                                                     /*direct_reads=*/true));
  constexpr size_t kChunk = kRawChunk, kCount = 64;
  std::vector<std::string> data;
  std::vector<ChunkStore::ChunkRef> refs;
  std::string pack;
  ASSERT_NO_FATAL_FAILURE(PutRawChunksInOnePack(*db, chunks.get(), kCount, &data, &refs, &pack));
  const int fd = open(pack.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ScopeExit close_fd([&] { close(fd); });
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);  // as after a reboot
  const double dropped = ResidentShare(fd, 0, kCount * kChunk);
  if (dropped < 0 || dropped > 0.1)
    GTEST_SKIP() << "the page cache of " << pack << " cannot be dropped here (tmpfs?)";
  const int64_t read_before = StorageReadBytes();
  if (read_before < 0) GTEST_SKIP() << "/proc/self/io has no read_bytes here";

  // Cold, in reads of 1, 3 and 8 chunks (a page fault's, a reader's going
  // through): every byte right, none of them left in the page cache.
  std::vector<ChunkStore::ChunkBytes> out;
  for (size_t i = 0; i < kCount;) {
    const size_t n = std::min<size_t>(kCount - i, i % 3 == 0 ? 1 : i % 3 == 1 ? 3 : 8);
    ASSERT_OK(chunks->ReadMany({refs.begin() + i, refs.begin() + i + n}, nullptr, &out));
    for (size_t k = 0; k < n; ++k) ASSERT_EQ(out[k].bytes, data[i + k]) << "chunk " << i + k;
    i += n;
  }
  EXPECT_LT(ResidentShare(fd, 0, kCount * kChunk), 0.05)
      << "a cold read filled the page cache with the pack";
  const int64_t read_cold = StorageReadBytes() - read_before;
  EXPECT_GE(read_cold, static_cast<int64_t>(kCount * kChunk)) << "the disk was not read";

  // All in the page cache (a checkpoint just written): read from there.
  (void)testing::ReadFile(pack);
  const int64_t read_warm_before = StorageReadBytes();
  ASSERT_OK(chunks->ReadMany(refs, nullptr, &out));
  for (size_t k = 0; k < kCount; ++k) ASSERT_EQ(out[k].bytes, data[k]) << "chunk " << k;
  EXPECT_LT(StorageReadBytes() - read_warm_before, static_cast<int64_t>(kChunk))
      << "a read of cached records went to the disk";
}

}  // namespace
}  // namespace gpuckpt
