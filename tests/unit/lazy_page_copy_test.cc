// CopyIntoTask on a real userfaultfd of this process's own memory: pieces
// whose edges fall inside pages arrive byte for byte, a page already in is
// kept and counted, an image that ends early is EIO, a range no longer
// registered stops with ENOENT, and copied in parts side by side the same
// bytes arrive, a part that stops ending what counts as in place; TakeServersUserfaultfd takes a
// userfaultfd and refuses any other descriptor; CheckLazyCopyRequest refuses shapes the copy cannot
// take.
#include "fs/lazy_page_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/base/job_threads.h"

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
  uffdio_range range{memory.address(kPage * 2), kPage * 2};
  ASSERT_EQ(ioctl(memory.uffd(), UFFDIO_UNREGISTER, &range), 0) << std::strerror(errno);
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
  uffdio_range range{memory.address(kPage * 4), kPage * 2};
  ASSERT_EQ(ioctl(memory.uffd(), UFFDIO_UNREGISTER, &range), 0) << std::strerror(errno);
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

}  // namespace
}  // namespace gpuckpt
