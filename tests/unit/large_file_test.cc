// A 1 GiB file round trip. Kept cheap: the data is a counter-based PRNG
// stream, imported through a pipe (no source file), checked by Pread at
// random offsets against the regenerated stream and by exporting it and
// comparing the result block by block; 1 GiB is never held in memory.
// Labelled "large" in ctest.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::RandomStream;

constexpr uint64_t kSize = 1ull << 30;

TEST(LargeFileTest, OneGiBRoundTripsThroughImportPreadAndExport) {
  testing::TempDir tmp("gpuckpt-large");
  auto opened = Store::Open(tmp.Sub("store"), testing::TestOptions());
  ASSERT_OK(opened);
  Store& store = **opened;
  const RandomStream stream(0x1b);

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::thread feeder([&] {
    std::vector<char> buf(1u << 20);
    for (uint64_t off = 0; off < kSize;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), kSize - off));
      stream.Fill(off, buf.data(), n);
      size_t done = 0;
      while (done < n) {
        const ssize_t w = write(fds[1], buf.data() + done, n - done);
        if (w <= 0) {
          close(fds[1]);
          return;
        }
        done += static_cast<size_t>(w);
      }
      off += n;
    }
    close(fds[1]);
  });
  SnapshotSpec spec;
  spec.name = "large";
  auto writer = store.BeginSnapshot(spec);
  ASSERT_OK(writer);
  FileEntry e;
  e.path = "memory.bin";
  e.mode = 0600;
  const Status added = (*writer)->AddFile(e, fds[0]);
  feeder.join();
  close(fds[0]);
  ASSERT_OK(added);
  auto info = (*writer)->Commit();
  ASSERT_OK(info);
  writer->reset();
  EXPECT_EQ(info->logical_bytes, kSize);
  // 16384 chunks of 64 KiB on average; a wide band, for a gross error.
  EXPECT_GT(info->chunk_count, kSize / (128u << 10));
  EXPECT_LT(info->chunk_count, kSize / (32u << 10));
  EXPECT_EQ(info->new_chunks, info->chunk_count);

  // Random reads, many spanning chunk boundaries, some past EOF.
  auto reader = store.OpenFile("large", "memory.bin");
  ASSERT_OK(reader);
  EXPECT_EQ((*reader)->entry().size, kSize);
  testing::Rng rng(7);
  std::string got, want;
  for (int i = 0; i < 300; ++i) {
    uint64_t offset = rng.Uniform(0, kSize - 1);
    size_t len = static_cast<size_t>(rng.Uniform(1, 1u << 20));
    if (i % 50 == 0) offset = kSize - rng.Uniform(0, 1000);  // the tail, and past it
    if (i % 50 == 1) offset = kSize + rng.Uniform(0, 1000);
    got.assign(len, '\0');
    auto n = (*reader)->Pread(offset, len, got.data());
    ASSERT_OK(n);
    const size_t expect =
        offset >= kSize ? 0 : static_cast<size_t>(std::min<uint64_t>(len, kSize - offset));
    ASSERT_EQ(*n, expect) << "Pread(" << offset << ", " << len << ")";
    want = stream.Bytes(offset, expect);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), expect), 0)
        << "Pread(" << offset << ", " << len << ")";
  }
  reader->reset();

  ASSERT_OK(store.Export("large", tmp.Sub("out")));
  EXPECT_TRUE(testing::FileMatchesStream(tmp.Sub("out/memory.bin"), stream, kSize));

  // Streaming means bounded memory: nowhere near the 1 GiB that passed.
  // (Generous: RocksDB's write buffers and sanitizer overhead count too.)
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("[          ] peak RSS %ld MiB\n", usage.ru_maxrss / 1024);
  std::fflush(stdout);
  EXPECT_LT(usage.ru_maxrss, 900 * 1024) << "peak RSS in KiB";
}

}  // namespace
}  // namespace gpuckpt
