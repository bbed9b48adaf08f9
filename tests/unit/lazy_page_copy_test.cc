// CopyIntoTask on a real userfaultfd of this process's own memory: pieces
// whose edges fall inside pages arrive byte for byte, a page already in is
// kept and counted, an image that ends early is EIO, a range no longer
// registered stops with ENOENT, and copied in parts side by side the same
// bytes arrive, a part that stops ending what counts as in place; TakeServersUserfaultfd takes a
// userfaultfd and refuses any other descriptor; CheckLazyCopyRequest refuses shapes the copy cannot
// take; CopyBatchIntoTask reads a batch's ranges in its order while they
// are copied, each range's outcome its own, a failed read ending the batch,
// and CheckLazyCopyBatch refuses batches the copy cannot take.
#include "fs/lazy_page_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/base/job_threads.h"
#include "core/base/mutex.h"

namespace gpuckpt {
namespace {

constexpr uint64_t kPage = 4096;

char ByteAt(uint64_t offset) { return static_cast<char>((offset * 13 + offset / kPage) & 0xff); }

// `pages` pages of anonymous memory registered for missing-page faults on
// a userfaultfd of this process, as a lazily restored task's are.
class RegisteredMemory {
 public:
  explicit RegisteredMemory(size_t pages) : len_(pages * kPage) {
    uffd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (uffd_ < 0) {
      why_not_ = std::string("userfaultfd: ") + std::strerror(errno);
      return;
    }
    uffdio_api api{};
    api.api = UFFD_API;
    if (ioctl(uffd_, UFFDIO_API, &api) != 0) {
      why_not_ = std::string("UFFDIO_API: ") + std::strerror(errno);
      return;
    }
    void* at = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) {
      why_not_ = std::string("mmap: ") + std::strerror(errno);
      return;
    }
    memory_ = static_cast<char*>(at);
    uffdio_register reg{};
    reg.range.start = reinterpret_cast<uint64_t>(memory_);
    reg.range.len = len_;
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0)
      why_not_ = std::string("UFFDIO_REGISTER: ") + std::strerror(errno);
  }
  ~RegisteredMemory() {
    if (memory_ != nullptr) munmap(memory_, len_);
    if (uffd_ >= 0) close(uffd_);
  }
  // Why no such memory could be made here ("" when it was).
  const std::string& why_not() const { return why_not_; }
  int uffd() const { return uffd_; }
  uint64_t address(uint64_t offset = 0) const {
    return reinterpret_cast<uint64_t>(memory_) + offset;
  }
  // Only pages already copied in may be read: any other would wait for a
  // server forever.
  const char* bytes() const { return memory_; }

 private:
  size_t len_;
  int uffd_ = -1;
  char* memory_ = nullptr;
  std::string why_not_;
};

// The image's bytes [offset, offset + len) as pieces cut at `cuts` (sizes,
// the last piece taking the rest).
struct CutImage {
  std::string bytes;
  FileReader::ReadPieces read;
};
std::shared_ptr<CutImage> Cut(uint64_t offset, uint64_t len, const std::vector<size_t>& cuts) {
  auto image = std::make_shared<CutImage>();
  for (uint64_t i = 0; i < len; ++i) image->bytes.push_back(ByteAt(offset + i));
  size_t at = 0;
  for (size_t cut : cuts) {
    image->read.pieces.push_back({image->bytes.data() + at, cut});
    at += cut;
  }
  image->read.pieces.push_back({image->bytes.data() + at, image->bytes.size() - at});
  return image;
}

// That `outcome` copied all `len` bytes, and the memory holds the image's
// bytes from `image_offset` on.
void ExpectAllCopied(const LazyCopyOutcome& outcome, const RegisteredMemory& memory,
                     uint64_t image_offset, uint64_t len) {
  EXPECT_EQ(outcome.error, 0);
  EXPECT_EQ(outcome.in_place, len);
  EXPECT_EQ(outcome.copied, len);
  for (uint64_t i = 0; i < len; ++i)
    ASSERT_EQ(memory.bytes()[i], ByteAt(image_offset + i)) << "at byte " << i;
}

// Takes [offset, offset + len) of `memory` out of its userfaultfd, as a
// task's unmapped or removed range is.
void Unregister(const RegisteredMemory& memory, uint64_t offset, uint64_t len) {
  uffdio_range range{memory.address(offset), len};
  ASSERT_EQ(ioctl(memory.uffd(), UFFDIO_UNREGISTER, &range), 0) << std::strerror(errno);
}

#define SKIP_WITHOUT(memory)                                    \
  if (!(memory).why_not().empty())                              \
  GTEST_SKIP() << "no userfaultfd here (" << (memory).why_not() \
               << "): the copy is checked by the lazy-restore integration tests too"

TEST(LazyPageCopyTest, PiecesCutInsidePagesArriveByteForByte) {
  RegisteredMemory memory(8);
  SKIP_WITHOUT(memory);
  // Edges at 100 bytes, inside the second page, across a whole page, and a
  // last piece of several pages.
  auto image = Cut(kPage * 3, kPage * 8, {100, kPage + 50, kPage * 2, 7});
  const LazyCopyOutcome outcome =
      CopyIntoTask(memory.uffd(), memory.address(), image->read, kPage * 8);
  ExpectAllCopied(outcome, memory, kPage * 3, kPage * 8);
}

TEST(LazyPageCopyTest, OnlyTheAskedLengthIsCopied) {
  RegisteredMemory memory(4);
  SKIP_WITHOUT(memory);
  auto image = Cut(0, kPage * 4, {kPage / 2});
  const LazyCopyOutcome outcome =
      CopyIntoTask(memory.uffd(), memory.address(), image->read, kPage * 2);
  EXPECT_EQ(outcome.error, 0);
  EXPECT_EQ(outcome.in_place, kPage * 2);
  EXPECT_EQ(outcome.copied, kPage * 2);
  // The third page is still missing: copying it now succeeds.
  auto third = Cut(kPage * 2, kPage, {});
  EXPECT_EQ(CopyIntoTask(memory.uffd(), memory.address(kPage * 2), third->read, kPage).copied,
            kPage);
}

TEST(LazyPageCopyTest, APageAlreadyInIsKeptAndCounted) {
  RegisteredMemory memory(4);
  SKIP_WITHOUT(memory);
  // The second page comes in first, with other bytes.
  std::string other(kPage, 'x');
  FileReader::ReadPieces first;
  first.pieces.push_back({other.data(), other.size()});
  ASSERT_EQ(CopyIntoTask(memory.uffd(), memory.address(kPage), first, kPage).copied, kPage);
  auto image = Cut(0, kPage * 4, {kPage + 10});
  const LazyCopyOutcome outcome =
      CopyIntoTask(memory.uffd(), memory.address(), image->read, kPage * 4);
  EXPECT_EQ(outcome.error, 0);
  EXPECT_EQ(outcome.in_place, kPage * 4);
  EXPECT_EQ(outcome.copied, kPage * 3);
  EXPECT_EQ(std::string(memory.bytes() + kPage, kPage), other);
  EXPECT_EQ(memory.bytes()[0], ByteAt(0));
  EXPECT_EQ(memory.bytes()[kPage * 2], ByteAt(kPage * 2));
}

TEST(LazyPageCopyTest, AnImageThatEndsEarlyIsEio) {
  RegisteredMemory memory(4);
  SKIP_WITHOUT(memory);
  // A page and a half where two pages were asked for.
  auto image = Cut(0, kPage + kPage / 2, {kPage / 4});
  const LazyCopyOutcome outcome =
      CopyIntoTask(memory.uffd(), memory.address(), image->read, kPage * 2);
  EXPECT_EQ(outcome.error, EIO);
  EXPECT_EQ(outcome.in_place, kPage);
}

TEST(LazyPageCopyTest, ARangeNoLongerRegisteredStopsWithEnoent) {
  RegisteredMemory memory(4);
  SKIP_WITHOUT(memory);
  ASSERT_NO_FATAL_FAILURE(Unregister(memory, kPage * 2, kPage * 2));
  // Two pieces of two pages: the first goes in, the second finds its
  // range gone.
  auto image = Cut(0, kPage * 4, {kPage * 2});
  const LazyCopyOutcome outcome =
      CopyIntoTask(memory.uffd(), memory.address(), image->read, kPage * 4);
  EXPECT_EQ(outcome.error, ENOENT);
  EXPECT_EQ(outcome.in_place, kPage * 2);
}

// A duplicate of the memory's userfaultfd, as the daemon holds the server's.
std::shared_ptr<const UniqueFd> Duplicate(const RegisteredMemory& memory) {
  return std::make_shared<const UniqueFd>(fcntl(memory.uffd(), F_DUPFD_CLOEXEC, 0));
}

TEST(LazyPageCopyTest, PartsCopiedSideBySideArriveByteForByte) {
  RegisteredMemory memory(10);
  SKIP_WITHOUT(memory);
  JobThreads threads(2);
  // Parts of 3 pages, pieces whose edges fall inside pages and across the
  // parts' edges.
  auto image = Cut(kPage * 5, kPage * 10, {kPage * 2 + 300, kPage * 3, 17, kPage});
  const LazyCopyOutcome outcome =
      CopyIntoTaskInParts(Duplicate(memory), memory.address(),
                          std::shared_ptr<const FileReader::ReadPieces>(image, &image->read),
                          kPage * 10, &threads, kPage * 3);
  ExpectAllCopied(outcome, memory, kPage * 5, kPage * 10);
}

TEST(LazyPageCopyTest, APartThatStopsEndsWhatIsInPlaceButNotWhatWasCopied) {
  RegisteredMemory memory(8);
  SKIP_WITHOUT(memory);
  JobThreads threads(3);
  // Parts of 2 pages; the third part's range is no longer registered.
  ASSERT_NO_FATAL_FAILURE(Unregister(memory, kPage * 4, kPage * 2));
  auto image = Cut(0, kPage * 8, {kPage + 1});
  const LazyCopyOutcome outcome =
      CopyIntoTaskInParts(Duplicate(memory), memory.address(),
                          std::shared_ptr<const FileReader::ReadPieces>(image, &image->read),
                          kPage * 8, &threads, kPage * 2);
  EXPECT_EQ(outcome.error, ENOENT);
  EXPECT_EQ(outcome.in_place, kPage * 4);
  EXPECT_EQ(outcome.copied, kPage * 6);
  EXPECT_EQ(memory.bytes()[kPage * 7], ByteAt(kPage * 7));
}

TEST(LazyPageCopyTest, WithoutThreadsThePartsAreOneCopy) {
  RegisteredMemory memory(4);
  SKIP_WITHOUT(memory);
  auto image = Cut(0, kPage * 4, {kPage / 3});
  const LazyCopyOutcome outcome =
      CopyIntoTaskInParts(Duplicate(memory), memory.address(),
                          std::shared_ptr<const FileReader::ReadPieces>(image, &image->read),
                          kPage * 4, nullptr, kPage);
  EXPECT_EQ(outcome.error, 0);
  EXPECT_EQ(outcome.in_place, kPage * 4);
  EXPECT_EQ(memory.bytes()[kPage * 3 + 5], ByteAt(kPage * 3 + 5));
}

TEST(LazyPageCopyTest, OnlyAUserfaultfdIsTaken) {
  RegisteredMemory memory(1);
  SKIP_WITHOUT(memory);
  auto taken = TakeServersUserfaultfd(getpid(), memory.uffd());
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_NE(taken->get(), memory.uffd());
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  auto pipe_taken = TakeServersUserfaultfd(getpid(), pipe_fds[0]);
  EXPECT_EQ(pipe_taken.status().code(), StatusCode::kInvalidArgument)
      << pipe_taken.status().ToString();
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_FALSE(TakeServersUserfaultfd(getpid(), 1 << 20).ok());
}

TEST(LazyPageCopyTest, ShapesTheCopyCannotTakeAreRefused) {
  LazyCopyRequest good;
  good.dst = kPage * 16;
  good.len = kPage * 4;
  good.uffd = 3;
  EXPECT_TRUE(CheckLazyCopyRequest(good).ok());
  LazyCopyRequest r = good;
  r.dst += 1;
  EXPECT_EQ(CheckLazyCopyRequest(r).code(), StatusCode::kInvalidArgument);
  r = good;
  r.len = 0;
  EXPECT_EQ(CheckLazyCopyRequest(r).code(), StatusCode::kInvalidArgument);
  r.len = kPage + 1;
  EXPECT_EQ(CheckLazyCopyRequest(r).code(), StatusCode::kInvalidArgument);
  r.len = kLazyCopyMaxBytes + kPage;
  EXPECT_EQ(CheckLazyCopyRequest(r).code(), StatusCode::kInvalidArgument);
  r = good;
  r.dst = ~uint64_t{0} - kPage + 1;
  EXPECT_EQ(CheckLazyCopyRequest(r).code(), StatusCode::kInvalidArgument);
  r = good;
  r.uffd = -1;
  EXPECT_EQ(CheckLazyCopyRequest(r).code(), StatusCode::kInvalidArgument);
}

// An image of `size` bytes of ByteAt() that notes where each read began;
// a read that covers `fail_at` fails.
class ImageReader final : public FileReader {
 public:
  ImageReader(uint64_t size, uint64_t fail_at) : fail_at_(fail_at) { entry_.size = size; }
  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override {
    {
      MutexLock lock(&mu_);
      reads_.push_back(offset);
    }
    if (offset <= fail_at_ && fail_at_ < offset + len)
      return Status::Corruption("chunk at " + std::to_string(fail_at_) + " is damaged");
    const size_t n = static_cast<size_t>(std::min<uint64_t>(len, entry_.size - offset));
    for (size_t i = 0; i < n; ++i) buf[i] = ByteAt(offset + i);
    return n;
  }
  const FileEntry& entry() const override { return entry_; }
  std::vector<uint64_t> reads() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return reads_;
  }

 private:
  const uint64_t fail_at_;
  FileEntry entry_;
  Mutex mu_;
  std::vector<uint64_t> reads_ GUARDED_BY(mu_);
};

constexpr uint64_t kNoFailure = ~uint64_t{0};

// A batch of `ranges` ranges of `pages` pages each, the task's range i at
// page i * pages, its bytes from the image's page (count - 1 - i) * pages:
// backwards, so that a range copied from the wrong place shows.
LazyCopyBatch Backwards(const RegisteredMemory& memory, uint32_t ranges, uint64_t pages) {
  LazyCopyBatch batch;
  batch.uffd = memory.uffd();
  batch.count = ranges;
  for (uint32_t i = 0; i < ranges; ++i) {
    batch.ranges[i].dst = memory.address(kPage * pages * i);
    batch.ranges[i].offset = kPage * pages * (ranges - 1 - i);
    batch.ranges[i].len = kPage * pages;
  }
  return batch;
}

// That range i of a Backwards() batch of `ranges` ranges of `pages` pages
// went in whole, with its image's bytes.
void ExpectRangeIn(const RegisteredMemory& memory, const LazyCopyBatch& batch, uint32_t i,
                   uint32_t ranges, uint64_t pages) {
  EXPECT_EQ(batch.ranges[i].error, 0) << "range " << i;
  EXPECT_EQ(batch.ranges[i].copied, kPage * pages) << "range " << i;
  const uint64_t from = kPage * pages * (ranges - 1 - i);
  for (uint64_t b = 0; b < kPage * pages; ++b)
    ASSERT_EQ(memory.bytes()[kPage * pages * i + b], ByteAt(from + b)) << "range " << i;
}

TEST(LazyPageCopyTest, ABatchIsReadInItsOrderAndCopiedByteForByte) {
  RegisteredMemory memory(24);
  SKIP_WITHOUT(memory);
  JobThreads threads(2);
  ImageReader image(kPage * 24, kNoFailure);
  LazyCopyBatch batch = Backwards(memory, 8, 3);
  ASSERT_TRUE(CopyBatchIntoTask(Duplicate(memory), &image, &batch, &threads, 2).ok());
  // In the batch's order, as the stream's read-ahead expects.
  std::vector<uint64_t> expected;
  for (uint32_t i = 0; i < 8; ++i) expected.push_back(kPage * 3 * (7 - i));
  EXPECT_EQ(image.reads(), expected);
  for (uint32_t i = 0; i < 8; ++i) ExpectRangeIn(memory, batch, i, 8, 3);
}

TEST(LazyPageCopyTest, WithoutThreadsABatchGoesOneRangeAfterAnother) {
  RegisteredMemory memory(8);
  SKIP_WITHOUT(memory);
  ImageReader image(kPage * 8, kNoFailure);
  LazyCopyBatch batch = Backwards(memory, 4, 2);
  ASSERT_TRUE(CopyBatchIntoTask(Duplicate(memory), &image, &batch, nullptr, 4).ok());
  for (uint32_t i = 0; i < 4; ++i) ExpectRangeIn(memory, batch, i, 4, 2);
}

TEST(LazyPageCopyTest, ABatchRangeThatStopsSaysSoAndTheOthersGoIn) {
  RegisteredMemory memory(8);
  SKIP_WITHOUT(memory);
  JobThreads threads(1);
  // The task's pages 4-5 (range 2) are no longer registered; page 7 is in.
  ASSERT_NO_FATAL_FAILURE(Unregister(memory, kPage * 4, kPage * 2));
  const char zeros[kPage] = {};
  uffdio_copy in{memory.address(kPage * 7), reinterpret_cast<uint64_t>(zeros), kPage, 0, 0};
  ASSERT_EQ(ioctl(memory.uffd(), UFFDIO_COPY, &in), 0) << std::strerror(errno);
  ImageReader image(kPage * 8, kNoFailure);
  LazyCopyBatch batch = Backwards(memory, 4, 2);
  ASSERT_TRUE(CopyBatchIntoTask(Duplicate(memory), &image, &batch, &threads, 1).ok());
  EXPECT_EQ(batch.ranges[2].error, ENOENT);
  EXPECT_EQ(batch.ranges[2].copied, 0u);
  EXPECT_EQ(batch.ranges[3].error, 0);
  EXPECT_EQ(batch.ranges[3].copied, kPage * 2);  // in place: one copied, one kept
  EXPECT_EQ(memory.bytes()[kPage * 7], 0);       // kept, never overwritten
  EXPECT_EQ(memory.bytes()[kPage * 6], ByteAt(0));
  ExpectRangeIn(memory, batch, 0, 4, 2);
  ExpectRangeIn(memory, batch, 1, 4, 2);
}

TEST(LazyPageCopyTest, AFailedReadEndsTheBatchAfterWhatCameBefore) {
  RegisteredMemory memory(16);
  SKIP_WITHOUT(memory);
  JobThreads threads(2);
  // Range 3 reads the image's pages 8-9, and page 9 cannot be read: ranges
  // 0-2 go in, and nothing after range 3 is read.
  ImageReader image(kPage * 16, kPage * 9);
  LazyCopyBatch batch = Backwards(memory, 8, 2);
  const Status status = CopyBatchIntoTask(Duplicate(memory), &image, &batch, &threads, 2);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_EQ(image.reads().size(), 4u);
  for (uint32_t i = 0; i < 3; ++i) ExpectRangeIn(memory, batch, i, 8, 2);
  EXPECT_EQ(batch.ranges[3].copied, 0u);
  EXPECT_EQ(batch.ranges[4].copied, 0u);
}

TEST(LazyPageCopyTest, BatchesTheCopyCannotTakeAreRefused) {
  LazyCopyBatch good;
  good.uffd = 3;
  good.count = 2;
  good.ranges[0] = {kPage * 16, 0, kPage * 4, 0, 0, 0};
  good.ranges[1] = {kPage * 20, kPage * 4, kPage * 4, 0, 0, 0};
  EXPECT_TRUE(CheckLazyCopyBatch(good).ok());
  LazyCopyBatch b = good;
  b.count = 0;
  EXPECT_EQ(CheckLazyCopyBatch(b).code(), StatusCode::kInvalidArgument);
  b.count = kLazyCopyBatchMaxRanges + 1;
  EXPECT_EQ(CheckLazyCopyBatch(b).code(), StatusCode::kInvalidArgument);
  b = good;
  b.uffd = -1;
  EXPECT_EQ(CheckLazyCopyBatch(b).code(), StatusCode::kInvalidArgument);
  b = good;
  b.ranges[1].dst = kPage * 19;  // overlaps the first
  EXPECT_EQ(CheckLazyCopyBatch(b).code(), StatusCode::kInvalidArgument);
  b = good;
  b.ranges[1].len = kPage + 7;
  EXPECT_EQ(CheckLazyCopyBatch(b).code(), StatusCode::kInvalidArgument);
  b = good;
  b.count = 32;
  for (uint32_t i = 0; i < 32; ++i) b.ranges[i] = {i * (4ull << 20), 0, 4ull << 20, 0, 0, 0};
  EXPECT_EQ(CheckLazyCopyBatch(b).code(), StatusCode::kInvalidArgument);  // 128 MiB
}

}  // namespace
}  // namespace gpuckpt
