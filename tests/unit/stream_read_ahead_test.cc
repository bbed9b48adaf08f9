// StreamReadAhead on a reader of known bytes that records what it is asked
// for: a stream's bytes come back unchanged from the slabs it read ahead,
// reads at a fixed stride (forward or back) from the reads ahead along it,
// also past a stray read; reads that jump about irregularly read nothing
// ahead, a failed read-ahead does not stand in for the read, and closing
// leaves the inner reader unused.
#include "fs/stream_read_ahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/mutex.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

char ByteAt(uint64_t offset) { return static_cast<char>((offset * 7 + offset / 4096) & 0xff); }

// What the fake reader shares with its test once it is handed over.
struct Record {
  Mutex mu;
  std::vector<std::pair<uint64_t, size_t>> reads GUARDED_BY(mu);
  std::atomic<bool> failing{false};  // reads covering fail_at fail
  uint64_t fail_at = 0;
  std::atomic<int> delay_ms{0};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> used_after_destroyed{false};

  std::vector<std::pair<uint64_t, size_t>> Reads() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return reads;
  }
};

class PatternReader final : public FileReader {
 public:
  PatternReader(uint64_t size, std::shared_ptr<Record> record) : record_(std::move(record)) {
    entry_.size = size;
  }
  ~PatternReader() override { record_->destroyed = true; }

  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override {
    if (record_->destroyed) record_->used_after_destroyed = true;
    {
      MutexLock lock(&record_->mu);
      record_->reads.emplace_back(offset, len);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(record_->delay_ms.load()));
    if (record_->failing && offset <= record_->fail_at && record_->fail_at < offset + len)
      return Status::Corruption("chunk at " + std::to_string(record_->fail_at) + " is damaged");
    if (offset >= entry_.size) return size_t{0};
    const size_t n = static_cast<size_t>(std::min<uint64_t>(len, entry_.size - offset));
    for (size_t i = 0; i < n; ++i) buf[i] = ByteAt(offset + i);
    return n;
  }
  const FileEntry& entry() const override { return entry_; }

 private:
  std::shared_ptr<Record> record_;
  FileEntry entry_;
};

JobThreads* Threads() {
  static JobThreads threads(2);
  return &threads;
}

StreamReadAhead::Options SmallSlabs() {
  StreamReadAhead::Options options;
  options.slab_bytes = 64 << 10;
  options.slabs_ahead = 4;
  options.max_gap = 16 << 10;
  options.quiet_after_jump_ns = 0;
  return options;
}

std::string Gather(const FileReader::ReadPieces& read) {
  std::string bytes;
  for (const FileReader::Piece& p : read.pieces) bytes.append(p.data, p.size);
  return bytes;
}

std::string Expected(uint64_t offset, size_t len) {
  std::string bytes(len, '\0');
  for (size_t i = 0; i < len; ++i) bytes[i] = ByteAt(offset + i);
  return bytes;
}

TEST(StreamReadAheadTest, AStreamReadsAheadAndGetsItsBytesUnchangedToTheEnd) {
  const uint64_t size = (1 << 20) + 12345;  // not a whole number of slabs
  auto record = std::make_shared<Record>();
  StreamReadAhead reader(std::make_unique<PatternReader>(size, record), Threads(), SmallSlabs());
  // 40 KiB at a time, across slab boundaries, with a small gap now and then
  // (a page the tree's faults took meanwhile) and a read of 64 KiB elsewhere.
  uint64_t at = 0;
  int n = 0;
  while (at < size) {
    if (++n % 5 == 0) {
      ASSERT_OK_AND_ASSIGN(auto fault, reader.Read(size / 2 + 4096 * n, 4096));
      EXPECT_EQ(Gather(fault), Expected(size / 2 + 4096 * n, 4096));
      at += 8192;
      continue;
    }
    ASSERT_OK_AND_ASSIGN(auto read, reader.Read(at, 40 << 10));
    const size_t want = static_cast<size_t>(std::min<uint64_t>(40 << 10, size - at));
    ASSERT_EQ(read.size(), want) << "at " << at;
    EXPECT_EQ(Gather(read), Expected(at, want)) << "at " << at;
    at += 40 << 10;
  }
  ASSERT_OK_AND_ASSIGN(auto past_end, reader.Read(size, 4096));
  EXPECT_EQ(past_end.size(), 0u);
  const StreamReadAhead::Counts counts = reader.counts();
  // Every slab after the first two reads was read ahead, and most reads
  // were served from them.
  EXPECT_GE(counts.slabs_read, size / (64 << 10) - 1);
  EXPECT_GE(counts.reads_from_read_ahead, 20u);
  for (const auto& [offset, len] : record->Reads()) {
    if (len == 64 << 10) {
      EXPECT_EQ(offset % (64 << 10), 0u) << "a read-ahead off a slab";
    }
  }
}

TEST(StreamReadAheadTest, ReadsThatJumpAboutIrregularlyReadNothingAhead) {
  auto record = std::make_shared<Record>();
  StreamReadAhead reader(std::make_unique<PatternReader>(8 << 20, record), Threads(), SmallSlabs());
  // A tree's page faults: 4 KiB here and there, never twice the same
  // distance apart in a row.
  uint64_t at = 4096;
  for (uint64_t step = 1; at + (step << 12) < (8 << 20); ++step) {
    at += (step % 2 == 0 ? 64 : 96) << 10;
    ASSERT_OK_AND_ASSIGN(auto read, reader.Read(at, 4096));
    EXPECT_EQ(Gather(read), Expected(at, 4096));
  }
  EXPECT_EQ(reader.counts().slabs_read, 0u);
  EXPECT_EQ(reader.counts().strided_reads, 0u);
  for (const auto& read : record->Reads()) EXPECT_EQ(read.second, 4096u);
}

// Reads `count` reads of `len` bytes `stride` apart from `first` (a
// negative stride goes back), each checked; every `stray_every`th (0:
// none) is followed by a read elsewhere.
void ReadAlongStride(StreamReadAhead* reader, uint64_t first, int64_t stride, int count, size_t len,
                     int stray_every) {
  uint64_t at = first;
  for (int i = 0; i < count; ++i, at += stride) {
    ASSERT_OK_AND_ASSIGN(auto read, reader->Read(at, len));
    ASSERT_EQ(Gather(read), Expected(at, len)) << "at " << at;
    if (stray_every != 0 && i % stray_every == stray_every - 1) {
      const uint64_t stray = 4096 * (1000 + 37 * i);
      ASSERT_OK_AND_ASSIGN(auto other, reader->Read(stray, 4096));
      ASSERT_EQ(Gather(other), Expected(stray, 4096));
    }
  }
}

TEST(StreamReadAheadTest, ReadsAtAFixedStrideAreReadAheadAlongIt) {
  auto record = std::make_shared<Record>();
  record->delay_ms = 1;  // a disk: read-aheads finish after the reads that follow
  StreamReadAhead::Options options = SmallSlabs();
  options.strides_ahead = 8;
  StreamReadAhead reader(std::make_unique<PatternReader>(64 << 20, record), Threads(), options);
  constexpr uint64_t kStride = 256 << 10;
  ReadAlongStride(&reader, 3 * 4096, kStride, 200, 16 << 10, 0);
  const StreamReadAhead::Counts counts = reader.counts();
  EXPECT_EQ(counts.slabs_read, 0u);
  // From the fourth read on, each found its bytes read ahead.
  EXPECT_EQ(counts.reads_from_read_ahead, 197u);
  EXPECT_GE(counts.strided_reads, 197u);
  EXPECT_LE(counts.strided_reads, 205u);  // and never more than 8 past the last
  for (const auto& [offset, len] : record->Reads()) {
    EXPECT_EQ(offset % kStride, 3 * 4096u) << "a read off the stride";
    EXPECT_EQ(len, 16u << 10);
  }
}

TEST(StreamReadAheadTest, AStrideWithinTheStreamsGapIsFollowedAsAStride) {
  auto record = std::make_shared<Record>();
  StreamReadAhead::Options options = SmallSlabs();
  options.max_gap = 1 << 20;  // as by default: farther than the stride
  options.strides_ahead = 8;
  StreamReadAhead reader(std::make_unique<PatternReader>(64 << 20, record), Threads(), options);
  // A stream first (its slabs read ahead), then 64 KiB of every 256 KiB.
  ASSERT_OK(reader.Read(0, 16 << 10).status());
  ASSERT_OK(reader.Read(16 << 10, 16 << 10).status());
  const uint64_t slabs = reader.counts().slabs_read;
  EXPECT_EQ(slabs, 4u);
  ReadAlongStride(&reader, 1 << 20, 256 << 10, 100, 64 << 10, 0);
  // Each read from the fourth on found its bytes read ahead along the
  // stride, and the stream read nothing more ahead of them.
  EXPECT_GE(reader.counts().reads_from_read_ahead, 97u);
  EXPECT_GE(reader.counts().strided_reads, 97u);
  EXPECT_LE(reader.counts().slabs_read, slabs + 3 * options.slabs_ahead);
}

TEST(StreamReadAheadTest, AStrideBackIsFollowedToTheStartOfTheFile) {
  auto record = std::make_shared<Record>();
  StreamReadAhead::Options options = SmallSlabs();
  options.strides_ahead = 4;
  StreamReadAhead reader(std::make_unique<PatternReader>(8 << 20, record), Threads(), options);
  // A layer's backward pass: the same parts of each tensor, last first.
  ReadAlongStride(&reader, (8 << 20) - (64 << 10), -(128 << 10), 64, 8 << 10, 0);
  EXPECT_EQ(reader.counts().reads_from_read_ahead, 61u);
  for (const auto& [offset, len] : record->Reads())
    EXPECT_EQ(offset % (128 << 10), 64u << 10) << "a read off the stride (or before the file)";
}

TEST(StreamReadAheadTest, AStrayReadLeavesTheStrideFollowed) {
  auto record = std::make_shared<Record>();
  StreamReadAhead::Options options = SmallSlabs();
  options.strides_ahead = 8;
  StreamReadAhead reader(std::make_unique<PatternReader>(64 << 20, record), Threads(), options);
  ReadAlongStride(&reader, 0, 200 << 10, 100, 4096, 10);
  // Only the first three reads, and none after a stray one, went unserved.
  EXPECT_EQ(reader.counts().reads_from_read_ahead, 97u);
}

TEST(StreamReadAheadTest, WhileReadsJumpAboutTheStreamReadsNothingAhead) {
  auto record = std::make_shared<Record>();
  StreamReadAhead::Options options = SmallSlabs();
  options.quiet_after_jump_ns = 3600'000'000'000;  // never, after a jump
  StreamReadAhead reader(std::make_unique<PatternReader>(8 << 20, record), Threads(), options);
  ASSERT_OK(reader.Read(0, 16 << 10).status());
  ASSERT_OK(reader.Read(16 << 10, 16 << 10).status());  // a stream, nothing jumped yet
  EXPECT_EQ(reader.counts().slabs_read, 4u);
  ASSERT_OK(reader.Read(6 << 20, 4096).status());  // a fault elsewhere
  // The stream goes on past its slabs, and asks for no more.
  for (uint64_t at = 32 << 10; at < (1 << 20); at += 16 << 10) {
    ASSERT_OK_AND_ASSIGN(auto read, reader.Read(at, 16 << 10));
    EXPECT_EQ(Gather(read), Expected(at, 16 << 10));
  }
  EXPECT_EQ(reader.counts().slabs_read, 4u);
}

TEST(StreamReadAheadTest, AFailedReadAheadIsReadAgainAndItsErrorIsTheReadersOwn) {
  auto record = std::make_shared<Record>();
  record->fail_at = 300 << 10;
  record->failing = true;
  StreamReadAhead reader(std::make_unique<PatternReader>(1 << 20, record), Threads(), SmallSlabs());
  uint64_t at = 0;
  Status failed;
  for (; at < (1 << 20); at += 32 << 10) {
    auto read = reader.Read(at, 32 << 10);
    if (!read.ok()) {
      failed = read.status();
      break;
    }
    EXPECT_EQ(Gather(*read), Expected(at, 32 << 10));
  }
  EXPECT_CODE(failed, StatusCode::kCorruption);
  EXPECT_EQ(at, 288u << 10);  // the read that covers the damaged byte
  // Mended (a gc moved the chunk, say): the same read now succeeds, not
  // answered by the failed read-ahead.
  record->failing = false;
  ASSERT_OK_AND_ASSIGN(auto again, reader.Read(at, 32 << 10));
  EXPECT_EQ(Gather(again), Expected(at, 32 << 10));
}

TEST(StreamReadAheadTest, ClosingWaitsForReadAheadsAndLeavesTheInnerReaderUnused) {
  auto record = std::make_shared<Record>();
  record->delay_ms = 20;
  {
    StreamReadAhead reader(std::make_unique<PatternReader>(8 << 20, record), Threads(),
                           SmallSlabs());
    ASSERT_OK(reader.Read(0, 4096).status());
    ASSERT_OK(reader.Read(4096, 4096).status());  // a stream: 4 slabs asked for
    EXPECT_EQ(reader.counts().slabs_read, 4u);
  }
  EXPECT_TRUE(record->destroyed);
  // Queued read-aheads run after the close and must not touch the reader.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(record->used_after_destroyed);
}

}  // namespace
}  // namespace gpuckpt
