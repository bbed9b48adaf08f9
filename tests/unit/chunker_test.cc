// Chunker: parameter checks, chunk size distribution in both modes, page
// alignment, streaming equivalence, and boundary stability under inserts
// and changes (what deduplication across checkpoints relies on).
#include "core/store/chunker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/store/chunk_hash.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::RandomBytes;
using testing::Rng;

const ChunkSizes kGeneric = ChunkingOptions().generic;  // 16/64/256 KiB
const ChunkSizes kPages = ChunkingOptions().pages;      // 4/16/64 KiB
constexpr uint32_t kPage = 4096;

Chunker MakeChunker(const ChunkSizes& sizes, uint32_t alignment) {
  auto c = Chunker::Create(sizes, alignment);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

// Chunk lengths of a whole buffer known to end at EOF.
std::vector<size_t> CutAll(const Chunker& c, const std::string& data) {
  std::vector<size_t> out;
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t n = c.NextChunkLength(p + pos, data.size() - pos, pos, /*at_eof=*/true);
    if (n == 0 || n > data.size() - pos) {
      ADD_FAILURE() << "NextChunkLength returned " << n << " at offset " << pos << " with "
                    << data.size() - pos << " bytes left at EOF";
      break;
    }
    out.push_back(n);
    pos += n;
  }
  return out;
}

// The same, fed the way a reader sees a stream: the data arrives in pieces of
// random size and the chunker may ask for more.
std::vector<size_t> CutStreaming(const Chunker& c, const std::string& data, uint64_t seed) {
  std::vector<size_t> out;
  Rng rng(seed);
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t pos = 0;        // first byte not cut
  size_t available = 0;  // bytes "read" so far
  while (pos < data.size()) {
    const bool eof = available == data.size();
    const size_t n = c.NextChunkLength(p + pos, available - pos, pos, eof);
    if (n == 0) {
      if (eof) {
        ADD_FAILURE() << "NextChunkLength asked for more data at EOF";
        break;
      }
      available = std::min<size_t>(data.size(), available + rng.Uniform(1, 300000));
      continue;
    }
    EXPECT_LE(n, available - pos);
    out.push_back(n);
    pos += n;
  }
  return out;
}

std::vector<ChunkHash> HashesOf(const std::string& data, const std::vector<size_t>& lengths) {
  std::vector<ChunkHash> out;
  size_t pos = 0;
  for (size_t n : lengths) {
    out.push_back(HashChunk(reinterpret_cast<const uint8_t*>(data.data()) + pos, n));
    pos += n;
  }
  return out;
}

// --- parameters ---------------------------------------------------------------

TEST(ChunkerTest, AcceptsTheDefaultSizes) {
  EXPECT_OK(Chunker::Create(kGeneric, 1).status());
  EXPECT_OK(Chunker::Create(kPages, kPage).status());
}

TEST(ChunkerTest, RejectsInvalidSizes) {
  struct Case {
    ChunkSizes sizes;
    uint32_t alignment;
    const char* why;
  };
  const Case cases[] = {
      {{64u << 10, 32u << 10, 256u << 10}, 1, "min > avg"},
      {{16u << 10, 512u << 10, 256u << 10}, 1, "avg > max"},
      {{16u << 10, 48u << 10, 256u << 10}, 1, "avg not a power of two"},
      {{32, 64, 256}, 1, "min below the 64-byte window"},
      {{16u << 10, 64u << 10, 128u << 20}, 1, "max above kMaxChunkSize"},
      {{0, 0, 0}, 1, "all zero"},
      {{16u << 10, 32u << 10, 128u << 10}, 0, "alignment 0"},
      {{15u << 10, 30u << 10, 120u << 10}, 3072, "alignment not a power of two"},
      {{(16u << 10) + 100, 32u << 10, 128u << 10}, kPage, "min not page aligned"},
      {{16u << 10, 32u << 10, (128u << 10) + 512}, kPage, "max not page aligned"},
      {{4096, 4096, 128u << 10}, kPage, "avg of one page leaves no choice"},
  };
  for (const auto& c : cases) {
    auto r = Chunker::Create(c.sizes, c.alignment);
    EXPECT_CODE(r, StatusCode::kInvalidArgument) << c.why;
  }
}

TEST(ChunkerTest, StoreOpenRejectsInvalidChunkingWithoutCreatingTheStore) {
  testing::TempDir tmp;
  StoreOptions o = testing::TestOptions();
  o.chunking.generic = {16u << 10, 48u << 10, 256u << 10};
  EXPECT_CODE(Store::Open(tmp.Sub("store"), o), StatusCode::kInvalidArgument);
  o = testing::TestOptions();
  o.chunking.pages = {(16u << 10) + 1, 32u << 10, 128u << 10};
  EXPECT_CODE(Store::Open(tmp.Sub("store"), o), StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::ListDir(tmp.path()).empty()) << "a refused Open created files";
}

// --- sizes and alignment ---------------------------------------------------------

TEST(ChunkerTest, GenericChunksAverageNearTheConfiguredSize) {
  const Chunker c = MakeChunker(kGeneric, 1);
  const std::string data = RandomBytes(48u << 20, 1);
  const auto lengths = CutAll(c, data);
  ASSERT_GT(lengths.size(), 100u);
  for (size_t i = 0; i + 1 < lengths.size(); ++i) {
    ASSERT_GE(lengths[i], kGeneric.min_size) << "chunk " << i;
    ASSERT_LE(lengths[i], kGeneric.max_size) << "chunk " << i;
  }
  const double mean = double(data.size()) / double(lengths.size());
  EXPECT_GT(mean, 0.75 * kGeneric.avg_size);
  EXPECT_LT(mean, 1.35 * kGeneric.avg_size);
}

TEST(ChunkerTest, PageChunksAverageNearTheConfiguredSizeAndArePageAligned) {
  const Chunker c = MakeChunker(kPages, kPage);
  // Not a whole number of pages: only the last chunk may end unaligned.
  const std::string data = RandomBytes((48u << 20) + 1234, 2);
  const auto lengths = CutAll(c, data);
  ASSERT_GT(lengths.size(), 100u);
  uint64_t offset = 0;
  for (size_t i = 0; i + 1 < lengths.size(); ++i) {
    offset += lengths[i];
    ASSERT_EQ(offset % kPage, 0u) << "boundary " << i << " at offset " << offset;
    ASSERT_GE(lengths[i], kPages.min_size) << "chunk " << i;
    ASSERT_LE(lengths[i], kPages.max_size) << "chunk " << i;
  }
  EXPECT_EQ(offset + lengths.back(), data.size());
  const double mean = double(data.size()) / double(lengths.size());
  EXPECT_GT(mean, 0.75 * kPages.avg_size);
  EXPECT_LT(mean, 1.35 * kPages.avg_size);
}

TEST(ChunkerTest, PageBoundariesAreAlignedInFileOffsetsWhenTheChunkStartsUnaligned) {
  // The chunker is told the file offset of its data; candidates are aligned
  // in the file, not relative to the start of the data.
  const Chunker c = MakeChunker(kPages, kPage);
  const std::string data = RandomBytes(4u << 20, 3);
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  for (uint64_t file_offset : {uint64_t{100}, uint64_t{4095}, uint64_t{(1u << 30) + 7}}) {
    const size_t n = c.NextChunkLength(p, data.size(), file_offset, false);
    ASSERT_GT(n, 0u);
    EXPECT_EQ((file_offset + n) % kPage, 0u) << "file offset " << file_offset;
    EXPECT_GE(n, kPages.min_size);
    EXPECT_LE(n, kPages.max_size);
  }
}

TEST(ChunkerTest, TinyAndEmptyInputs) {
  for (const Chunker& c : {MakeChunker(kGeneric, 1), MakeChunker(kPages, kPage)}) {
    const std::string data = RandomBytes(100, 4);
    const auto* p = reinterpret_cast<const uint8_t*>(data.data());
    EXPECT_EQ(c.NextChunkLength(p, 0, 0, true), 0u);
    EXPECT_EQ(c.NextChunkLength(p, 1, 0, true), 1u);
    EXPECT_EQ(c.NextChunkLength(p, 100, 0, true), 100u);
    EXPECT_EQ(c.NextChunkLength(p, 100, 0, false), 0u) << "must wait for more data";
  }
}

TEST(ChunkerTest, NeverWaitsForMoreThanMaxSize) {
  // A full max-size window must always give a cut, even on data without any
  // content boundary (zeros have a constant fingerprint).
  for (auto [sizes, alignment] : {std::pair{kGeneric, 1u}, std::pair{kPages, kPage}}) {
    const Chunker c = MakeChunker(sizes, alignment);
    const std::string zeros(sizes.max_size, '\0');
    const size_t n =
        c.NextChunkLength(reinterpret_cast<const uint8_t*>(zeros.data()), zeros.size(), 0, false);
    EXPECT_GE(n, sizes.min_size);
    EXPECT_LE(n, sizes.max_size);
  }
}

TEST(ChunkerTest, StreamingGivesTheSameBoundariesAsOneBuffer) {
  const std::string data = RandomBytes(12u << 20, 5);
  for (auto [sizes, alignment] : {std::pair{kGeneric, 1u}, std::pair{kPages, kPage}}) {
    const Chunker c = MakeChunker(sizes, alignment);
    EXPECT_EQ(CutAll(c, data), CutStreaming(c, data, 6)) << "alignment " << alignment;
  }
}

// --- boundary stability ----------------------------------------------------------

// Runs `variant(i)` for i in [0, n) against `before` and checks each
// changes between 1 and `most` chunks; on failure, says how often each count
// occurred, so the message shows whether the bound is missed rarely or often.
::testing::AssertionResult AtMostNewChunks(const Chunker& c, const std::string& before, int n,
                                           size_t most,
                                           const std::function<std::string(int)>& variant) {
  std::set<std::string> known;
  for (const auto& h : HashesOf(before, CutAll(c, before))) known.insert(std::string(h.view()));
  std::map<size_t, int> histogram;
  std::string worst;
  for (int i = 0; i < n; ++i) {
    const std::string after = variant(i);
    size_t fresh = 0;
    for (const auto& h : HashesOf(after, CutAll(c, after)))
      fresh += known.count(std::string(h.view())) == 0;
    ++histogram[fresh];
    if ((fresh > most || fresh == 0) && worst.empty()) worst = "variant " + std::to_string(i);
  }
  if (worst.empty()) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure()
           << "bound of 1.." << most << " new chunks missed, first by " << worst
           << "; new chunks: count of variants =";
  for (const auto& [fresh, count] : histogram) f << " " << fresh << ":" << count;
  return f;
}

TEST(ChunkerTest, ByteInsertedNearTheStartChangesAtMostThreeChunks) {
  const Chunker c = MakeChunker(kGeneric, 1);
  const std::string before = RandomBytes(64u << 20, 7);
  const size_t positions[] = {0, 10, 4095, 100000, 1000000};
  EXPECT_TRUE(AtMostNewChunks(c, before, 5, 3, [&](int i) {
    std::string after = before;
    after.insert(after.begin() + static_cast<ptrdiff_t>(positions[i]), 'x');
    return after;
  }));
}

// Page images: every page position near the start of the file (the first
// 48 pages), and 48 pages in the middle. An 8 MiB image is as good as a
// large one here: what happens is decided within a few chunks of the change.
TEST(ChunkerTest, PageInsertedNearTheStartOfAPageImageChangesAtMostThreeChunks) {
  const Chunker c = MakeChunker(kPages, kPage);
  const std::string before = RandomBytes(8u << 20, 8);
  EXPECT_TRUE(AtMostNewChunks(c, before, 48, 3, [&](int page) {
    std::string after = before;
    after.insert(static_cast<size_t>(page) * kPage, RandomBytes(kPage, 1000 + page));
    return after;
  }));
}

TEST(ChunkerTest, PageChangedInTheMiddleOfAPageImageChangesAtMostTwoChunks) {
  const Chunker c = MakeChunker(kPages, kPage);
  const std::string before = RandomBytes(8u << 20, 10);
  const size_t middle = before.size() / 2 / kPage;
  EXPECT_TRUE(AtMostNewChunks(c, before, 48, 2, [&](int i) {
    std::string after = before;
    after.replace((middle + static_cast<size_t>(i)) * kPage, kPage, RandomBytes(kPage, 2000 + i));
    return after;
  }));
}

}  // namespace
}  // namespace gpuckpt
