#include "fs/lazy_page_copy.h"

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/mutex.h"

namespace gpuckpt {
namespace {

constexpr uint64_t kPage = 4096;

// UFFDIO_COPY of `len` bytes from `src` to `dst`, on past pages that are
// already there: how far it got, and the errno that stopped it (0: all).
LazyCopyOutcome CopyRun(int uffd, uint64_t dst, const char* src, uint64_t len) {
  LazyCopyOutcome out;
  while (out.in_place < len) {
    uffdio_copy copy{};
    copy.dst = dst + out.in_place;
    copy.src = reinterpret_cast<uint64_t>(src + out.in_place);
    copy.len = len - out.in_place;
    if (ioctl(uffd, UFFDIO_COPY, &copy) == 0) {
      out.in_place = len;
      out.copied += copy.len;
      return out;
    }
    const int error = errno;
    if (copy.copy > 0) {  // a part went in; what stopped it shows on the next try
      out.in_place += static_cast<uint64_t>(copy.copy);
      out.copied += static_cast<uint64_t>(copy.copy);
      continue;
    }
    if (copy.copy == -EEXIST || error == EEXIST) {  // that page is in already
      out.in_place += kPage;
      continue;
    }
    out.error = copy.copy < 0 ? static_cast<int>(-copy.copy) : error;
    return out;
  }
  return out;
}

}  // namespace

namespace {

Status CheckRange(uint64_t dst, uint64_t len) {
  if (dst % kPage != 0) return Status::InvalidArgument("the destination is not page-aligned");
  if (len == 0 || len % kPage != 0)
    return Status::InvalidArgument("the length is not a whole number of pages");
  if (len > kLazyCopyMaxBytes)
    return Status::InvalidArgument("more than " + std::to_string(kLazyCopyMaxBytes >> 20) +
                                   " MiB asked at once");
  if (dst + len < dst) return Status::InvalidArgument("the range wraps");
  return Status::Ok();
}

}  // namespace

Status CheckLazyCopyRequest(const LazyCopyRequest& request) {
  GPUCKPT_RETURN_IF_ERROR(CheckRange(request.dst, request.len));
  if (request.uffd < 0) return Status::InvalidArgument("no userfaultfd named");
  return Status::Ok();
}

Status CheckLazyCopyBatch(const LazyCopyBatch& batch) {
  if (batch.count == 0 || batch.count > kLazyCopyBatchMaxRanges)
    return Status::InvalidArgument("a batch of " + std::to_string(batch.count) + " ranges");
  if (batch.uffd < 0) return Status::InvalidArgument("no userfaultfd named");
  uint64_t total = 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [dst, dst + len)
  for (uint32_t i = 0; i < batch.count; ++i) {
    const LazyCopyRange& range = batch.ranges[i];
    GPUCKPT_RETURN_IF_ERROR(CheckRange(range.dst, range.len));
    total += range.len;
    spans.emplace_back(range.dst, range.dst + range.len);
  }
  if (total > kLazyCopyBatchMaxBytes)
    return Status::InvalidArgument("more than " + std::to_string(kLazyCopyBatchMaxBytes >> 20) +
                                   " MiB asked in one batch");
  // Ranges copied side by side must not meet: each one's outcome says what
  // of it is in place, which another's copy would make a guess.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      return Status::InvalidArgument("the ranges of a batch overlap");
  return Status::Ok();
}

Result<UniqueFd> TakeServersUserfaultfd(int server_pid, int fd_in_server) {
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, server_pid, 0)));
  if (pidfd.get() < 0) return StatusFromErrno(errno, "pidfd_open of the lazy-pages server");
  UniqueFd fd(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd.get(), fd_in_server, 0)));
  if (fd.get() < 0) return StatusFromErrno(errno, "its descriptor " + std::to_string(fd_in_server));
  // Anything else would take UFFDIO_COPY's number as a request of its own.
  char target[64] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd.get());
  const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  if (n < 0 || std::strcmp(target, "anon_inode:[userfaultfd]") != 0)
    return Status::InvalidArgument("descriptor " + std::to_string(fd_in_server) +
                                   " of the lazy-pages server is not a userfaultfd");
  return fd;
}

LazyCopyOutcome CopyIntoTask(int uffd, uint64_t dst, const FileReader::ReadPieces& read,
                             uint64_t len) {
  LazyCopyOutcome out;
  alignas(kPage) char straddling[kPage];
  uint64_t gathered = 0;  // bytes of the page at dst + in_place that straddles pieces
  for (const FileReader::Piece& piece : read.pieces) {
    const char* from = piece.data;
    uint64_t left = std::min<uint64_t>(piece.size, len - out.in_place - gathered);
    while (left > 0) {
      if (gathered > 0 || left < kPage) {
        const uint64_t take = std::min(kPage - gathered, left);
        std::memcpy(straddling + gathered, from, take);
        gathered += take;
        from += take;
        left -= take;
        if (gathered < kPage) continue;
        gathered = 0;
        const LazyCopyOutcome page = CopyRun(uffd, dst + out.in_place, straddling, kPage);
        out.in_place += page.in_place;
        out.copied += page.copied;
        if (page.error != 0) return {out.in_place, out.copied, page.error};
        continue;
      }
      const uint64_t whole = left / kPage * kPage;
      const LazyCopyOutcome run = CopyRun(uffd, dst + out.in_place, from, whole);
      out.in_place += run.in_place;
      out.copied += run.copied;
      if (run.error != 0) return {out.in_place, out.copied, run.error};
      from += whole;
      left -= whole;
    }
    if (out.in_place == len) return out;
  }
  if (out.in_place < len) out.error = EIO;  // the image ended before the range did
  return out;
}

namespace {

// The bytes [from, to) of `read`, as pieces of it (held by `read`).
FileReader::ReadPieces SliceOf(const FileReader::ReadPieces& read, uint64_t from, uint64_t to) {
  FileReader::ReadPieces slice;
  uint64_t at = 0;  // where the piece starts in the read
  for (const FileReader::Piece& piece : read.pieces) {
    const uint64_t end = at + piece.size;
    if (end > from && at < to) {
      const uint64_t begin = std::max(at, from);
      slice.pieces.push_back({piece.data + (begin - at), std::min(end, to) - begin});
    }
    if (end >= to) break;
    at = end;
  }
  return slice;
}

}  // namespace

LazyCopyOutcome CopyIntoTaskInParts(std::shared_ptr<const UniqueFd> uffd, uint64_t dst,
                                    std::shared_ptr<const FileReader::ReadPieces> read,
                                    uint64_t len, JobThreads* threads, uint64_t part_bytes) {
  part_bytes = std::max(kPage, part_bytes / kPage * kPage);
  const size_t parts = static_cast<size_t>((len + part_bytes - 1) / part_bytes);
  if (threads == nullptr || parts < 2) return CopyIntoTask(uffd->get(), dst, *read, len);
  struct Shared {
    Mutex mu;
    CondVar cv;
    size_t left GUARDED_BY(mu) = 0;
    std::vector<LazyCopyOutcome> outcomes;  // each written by its part alone
  };
  auto shared = std::make_shared<Shared>();
  shared->outcomes.resize(parts);
  {
    MutexLock lock(&shared->mu);
    shared->left = parts - 1;
  }
  auto copy_part = [uffd, dst, read, len, part_bytes](Shared* into, size_t part) {
    const uint64_t from = part * part_bytes;
    const uint64_t to = std::min(len, from + part_bytes);
    // A read shorter than the range leaves a part without all its bytes:
    // CopyIntoTask() says EIO for it.
    into->outcomes[part] =
        CopyIntoTask(uffd->get(), dst + from, SliceOf(*read, from, to), to - from);
  };
  for (size_t part = 1; part < parts; ++part) {
    const bool posted = threads->Post([shared, copy_part, part] {
      copy_part(shared.get(), part);
      MutexLock lock(&shared->mu);
      if (--shared->left == 0) shared->cv.NotifyAll();
    });
    if (!posted) {  // a bounded pool that is full: this thread does it
      copy_part(shared.get(), part);
      MutexLock lock(&shared->mu);
      --shared->left;
    }
  }
  copy_part(shared.get(), 0);
  {
    MutexLock lock(&shared->mu);
    while (shared->left > 0) shared->cv.Wait(shared->mu);
  }
  LazyCopyOutcome out;
  bool whole_so_far = true;
  for (size_t part = 0; part < parts; ++part) {
    const LazyCopyOutcome& outcome = shared->outcomes[part];
    out.copied += outcome.copied;
    if (!whole_so_far) continue;
    out.in_place += outcome.in_place;
    if (outcome.error != 0) {
      out.error = outcome.error;
      whole_so_far = false;
    }
  }
  return out;
}

Status CopyBatchIntoTask(std::shared_ptr<const UniqueFd> uffd, FileReader* reader,
                         LazyCopyBatch* batch, JobThreads* threads, size_t copiers) {
  // This thread reads the ranges in the batch's order (the stream's
  // read-ahead follows it as it followed single ranges), up to `copiers`
  // ahead of the copies, which the copiers take as they come.
  struct Read {
    uint32_t index;
    FileReader::ReadPieces pieces;
  };
  struct Shared {
    Mutex mu;
    CondVar cv;
    std::deque<Read> to_copy GUARDED_BY(mu);
    bool reading GUARDED_BY(mu) = true;  // more may come
    size_t copiers GUARDED_BY(mu) = 0;   // posted copiers not yet done
  };
  auto shared = std::make_shared<Shared>();
  auto copy = [uffd, batch](uint32_t index, const FileReader::ReadPieces& pieces) {
    LazyCopyRange& range = batch->ranges[index];  // written by its copier alone
    const LazyCopyOutcome outcome = CopyIntoTask(uffd->get(), range.dst, pieces, range.len);
    range.copied = outcome.in_place;
    range.error = outcome.error;
  };
  const size_t helpers = threads == nullptr ? 0 : std::min<size_t>(copiers, batch->count);
  for (size_t i = 0; i < helpers; ++i) {
    {
      MutexLock lock(&shared->mu);
      ++shared->copiers;
    }
    const bool posted = threads->Post([shared, copy] {
      MutexLock lock(&shared->mu);
      for (;;) {
        while (shared->to_copy.empty() && shared->reading) shared->cv.Wait(shared->mu);
        if (shared->to_copy.empty()) break;
        Read read = std::move(shared->to_copy.front());
        shared->to_copy.pop_front();
        shared->cv.NotifyAll();  // room for the reader
        lock.Unlock();
        copy(read.index, read.pieces);
        lock.Lock();
      }
      --shared->copiers;
      shared->cv.NotifyAll();
    });
    if (!posted) {  // a bounded pool that is full: fewer copiers
      MutexLock lock(&shared->mu);
      --shared->copiers;
      break;
    }
  }
  bool any_copier;
  {
    MutexLock lock(&shared->mu);
    any_copier = shared->copiers > 0;
  }
  Status failed;
  for (uint32_t index = 0; index < batch->count; ++index) {
    const LazyCopyRange& range = batch->ranges[index];
    Result<FileReader::ReadPieces> read = reader->Read(range.offset, range.len);
    if (!read.ok()) {
      failed = read.status();
      break;
    }
    if (!any_copier) {
      copy(index, *read);
      continue;
    }
    MutexLock lock(&shared->mu);
    while (shared->to_copy.size() >= helpers) shared->cv.Wait(shared->mu);
    shared->to_copy.push_back({index, std::move(*read)});
    shared->cv.NotifyAll();
  }
  MutexLock lock(&shared->mu);
  shared->reading = false;
  shared->cv.NotifyAll();
  while (shared->copiers > 0) shared->cv.Wait(shared->mu);
  return failed;
}

namespace {
size_t LazyBatchHelpers() { return std::thread::hardware_concurrency() >= 4 ? 3 : 1; }
}  // namespace

JobThreads* LazyBatchThreadsForThisMachine() {
  static JobThreads* const threads = new JobThreads(LazyBatchHelpers());
  return threads;
}

size_t LazyBatchCopiers() { return LazyBatchHelpers(); }

JobThreads* LazyCopyThreadsForThisMachine() {
  static JobThreads* const threads =
      std::thread::hardware_concurrency() >= 4 ? new JobThreads(3) : nullptr;
  return threads;
}

}  // namespace gpuckpt
