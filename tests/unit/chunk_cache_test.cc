// core/store/chunk_cache: the LRU of decompressed chunks that every reader
// of a store shares: hits and misses, eviction by bytes in least recently
// used order, what it refuses to keep, and many readers at once.
#include "core/store/chunk_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

// A distinct hash per n (ChunkCache's hasher reads the first bytes).
ChunkHash HashOf(uint64_t n) {
  ChunkHash h;
  for (size_t i = 0; i < h.bytes.size(); ++i) h.bytes[i] = static_cast<uint8_t>(n >> (8 * (i % 8)));
  h.bytes[31] = 0x5a;
  return h;
}

std::shared_ptr<const std::string> Data(size_t size, char fill) {
  return std::make_shared<const std::string>(size, fill);
}

TEST(ChunkCacheTest, CountsMissesAndHits) {
  ChunkCache cache(1000);
  EXPECT_EQ(cache.Lookup(HashOf(1)), nullptr);
  cache.Insert(HashOf(1), Data(10, 'a'));
  auto found = cache.Lookup(HashOf(1));
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(*found, std::string(10, 'a'));
  EXPECT_EQ(cache.Lookup(HashOf(2)), nullptr);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 2u);
  EXPECT_EQ(cache.bytes(), 10u);
}

TEST(ChunkCacheTest, EvictsTheLeastRecentlyUsedToStayWithinItsBytes) {
  ChunkCache cache(300);
  cache.Insert(HashOf(1), Data(100, '1'));
  cache.Insert(HashOf(2), Data(100, '2'));
  cache.Insert(HashOf(3), Data(100, '3'));
  EXPECT_EQ(cache.bytes(), 300u);
  // 1 used again: 2 is now the least recently used.
  ASSERT_NE(cache.Lookup(HashOf(1)), nullptr);
  cache.Insert(HashOf(4), Data(100, '4'));
  EXPECT_EQ(cache.bytes(), 300u);
  EXPECT_EQ(cache.Lookup(HashOf(2)), nullptr);
  EXPECT_NE(cache.Lookup(HashOf(1)), nullptr);
  EXPECT_NE(cache.Lookup(HashOf(3)), nullptr);
  EXPECT_NE(cache.Lookup(HashOf(4)), nullptr);
  // One large chunk pushes out as many as it needs, oldest first.
  cache.Insert(HashOf(5), Data(250, '5'));
  EXPECT_LE(cache.bytes(), 300u);
  EXPECT_NE(cache.Lookup(HashOf(5)), nullptr);
  EXPECT_EQ(cache.Lookup(HashOf(1)), nullptr);
  EXPECT_EQ(cache.Lookup(HashOf(3)), nullptr);
  EXPECT_EQ(cache.Lookup(HashOf(4)), nullptr);
  EXPECT_EQ(cache.bytes(), 250u);
}

TEST(ChunkCacheTest, KeepsNothingTooLargeAndNothingAtZeroCapacity) {
  ChunkCache none(0);
  none.Insert(HashOf(1), Data(1, 'x'));
  EXPECT_EQ(none.Lookup(HashOf(1)), nullptr);
  EXPECT_EQ(none.bytes(), 0u);

  ChunkCache cache(100);
  cache.Insert(HashOf(1), Data(60, 'a'));
  // Larger than the whole cache: refused, and evicts nothing.
  cache.Insert(HashOf(2), Data(101, 'b'));
  EXPECT_EQ(cache.Lookup(HashOf(2)), nullptr);
  EXPECT_NE(cache.Lookup(HashOf(1)), nullptr);
  // Exactly the capacity fits (evicting the rest).
  cache.Insert(HashOf(3), Data(100, 'c'));
  EXPECT_NE(cache.Lookup(HashOf(3)), nullptr);
  EXPECT_EQ(cache.Lookup(HashOf(1)), nullptr);
  EXPECT_EQ(cache.bytes(), 100u);
}

TEST(ChunkCacheTest, ASecondInsertOfAHashKeepsTheFirstAndCountsItOnce) {
  ChunkCache cache(1000);
  cache.Insert(HashOf(7), Data(10, 'a'));
  cache.Insert(HashOf(7), Data(20, 'b'));
  EXPECT_EQ(cache.bytes(), 10u);
  auto found = cache.Lookup(HashOf(7));
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(*found, std::string(10, 'a'));
}

TEST(ChunkCacheTest, EraseForgetsAChunkAndItsBytes) {
  ChunkCache cache(1000);
  cache.Insert(HashOf(1), Data(10, 'a'));
  cache.Insert(HashOf(2), Data(20, 'b'));
  cache.Erase(HashOf(1));
  EXPECT_EQ(cache.Lookup(HashOf(1)), nullptr);
  EXPECT_EQ(cache.bytes(), 20u);
  cache.Erase(HashOf(1));  // absent: nothing happens
  cache.Erase(HashOf(99));
  EXPECT_EQ(cache.bytes(), 20u);
  // Erased, it may come back.
  cache.Insert(HashOf(1), Data(5, 'c'));
  ASSERT_NE(cache.Lookup(HashOf(1)), nullptr);
  EXPECT_EQ(cache.bytes(), 25u);
}

TEST(ChunkCacheTest, AnEvictedChunkStaysValidForWhoeverHoldsIt) {
  ChunkCache cache(100);
  cache.Insert(HashOf(1), Data(100, 'a'));
  auto held = cache.Lookup(HashOf(1));
  ASSERT_NE(held, nullptr);
  cache.Insert(HashOf(2), Data(100, 'b'));  // evicts 1
  EXPECT_EQ(cache.Lookup(HashOf(1)), nullptr);
  EXPECT_EQ(*held, std::string(100, 'a'));
}

TEST(ChunkCacheTest, ManyReadersAtOnceSeeOnlyTheRightBytesAndStayWithinCapacity) {
  // Room for about a quarter of the chunks: lookups, inserts, evictions and
  // erasures all race.
  constexpr int kChunks = 64;
  constexpr size_t kSize = 100;
  constexpr uint64_t kCapacity = kChunks / 4 * kSize;
  ChunkCache cache(kCapacity);
  constexpr int kThreads = 8;
  constexpr int kRounds = 4000;
  std::atomic<uint64_t> lookups{0}, wrong{0}, over{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      testing::Rng rng(1000 + t);
      for (int i = 0; i < kRounds; ++i) {
        const uint64_t n = rng.Uniform(0, kChunks - 1);
        const char fill = static_cast<char>('A' + n % 26);
        ++lookups;
        auto found = cache.Lookup(HashOf(n));
        if (found == nullptr) {
          cache.Insert(HashOf(n), Data(kSize, fill));
        } else if (*found != std::string(kSize, fill)) {
          ++wrong;
        }
        if (rng.Uniform(0, 9) == 0) cache.Erase(HashOf(rng.Uniform(0, kChunks - 1)));
        if (cache.bytes() > kCapacity) ++over;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(over.load(), 0u);
  EXPECT_EQ(cache.hits() + cache.misses(), lookups.load());
  EXPECT_GT(cache.hits(), 0u);
  EXPECT_GT(cache.misses(), 0u);
  EXPECT_LE(cache.bytes(), kCapacity);
  EXPECT_EQ(cache.bytes() % kSize, 0u);
}

}  // namespace
}  // namespace gpuckpt
