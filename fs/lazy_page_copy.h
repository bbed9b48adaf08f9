// Lazy page copy: the daemon copying a range of a page image straight into
// the memory of a lazily restored task, when that task's lazy-pages server
// asks for it.
//
// A lazy restore's server (gpuckpt's CRIU, tools/criu-patches/0008) would
// otherwise read each range of pages through the mount and copy it into the
// task with UFFDIO_COPY on its userfaultfd: every page crossed the kernel
// twice, once into the server's buffer and once into the task, with a
// round trip through the mount in between. Instead, it asks with an ioctl
// (kLazyCopyIoctl) on the page image it opened in the mount, naming its
// userfaultfd of the task and where the range lies in the image and in the
// task. The daemon takes a duplicate of that userfaultfd from the server
// (pidfd_getfd(), as root, over its own child), reads the range as it would
// for a read, and copies it in from where the store's reader left it.
//
// Its background pass asks for several ranges at once (a batch, 0009),
// which the daemon reads in order while it copies those already read.
//
// Only a lazy-pages server the daemon started may ask, and only on an image
// it opened itself (Filesystem checks both); what is copied is the image's
// own bytes, at the image's offset, into the task that server restores.
//
// Thread-safety: free functions, safe from any thread.
#ifndef GPUCKPT_FS_LAZY_PAGE_COPY_H_
#define GPUCKPT_FS_LAZY_PAGE_COPY_H_

#include <linux/ioctl.h>

#include <cstdint>
#include <memory>

#include "core/base/job_threads.h"
#include "core/base/unique_fd.h"
#include "gpuckpt/file_reader.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// The ioctl's argument, as the server lays it out (the patch declares the
// same struct): its size and direction are in kLazyCopyIoctl, which is how
// FUSE knows what to pass us and back.
struct LazyCopyRequest {
  uint64_t dst = 0;     // where the range goes in the task (page-aligned)
  uint64_t offset = 0;  // where its bytes lie in the image
  uint64_t len = 0;     // its length, whole pages
  int32_t uffd = 0;     // the server's userfaultfd of the task, as the server numbers it
  int32_t error = 0;    // out: the errno that stopped the copy, 0 if none
  uint64_t copied = 0;  // out: the bytes in place from dst on
  uint32_t flags = 0;   // kLazyCopyFault
  uint32_t reserved = 0;
};
static_assert(sizeof(LazyCopyRequest) == 48, "laid out as the server's struct");

// LazyCopyRequest::flags: the range answers a page fault of the task (else
// the server brings it in ahead, or in the background).
constexpr uint32_t kLazyCopyFault = 1;

constexpr unsigned int kLazyCopyIoctl = _IOWR('g', 1, LazyCopyRequest);

// The most one request may copy: a bound on what one read holds in memory
// (the server asks for at most 4 MiB at a time).
constexpr uint64_t kLazyCopyMaxBytes = 64ull << 20;

// A batch: the ranges of one background transfer of the server
// (tools/criu-patches/0009), read and copied side by side by
// CopyBatchIntoTask(), so that the disk's wait for one range goes on
// beside the copy of another instead of one round trip per range. Laid
// out as the server's struct.
struct LazyCopyRange {
  uint64_t dst = 0;     // where the range goes in the task (page-aligned)
  uint64_t offset = 0;  // where its bytes lie in the image
  uint64_t len = 0;     // its length, whole pages
  uint64_t copied = 0;  // out: the bytes in place from dst on
  int32_t error = 0;    // out: the errno that stopped its copy, 0 if none
  uint32_t reserved = 0;
};
static_assert(sizeof(LazyCopyRange) == 40, "laid out as the server's struct");

constexpr uint32_t kLazyCopyBatchMaxRanges = 32;

struct LazyCopyBatch {
  int32_t uffd = 0;    // the server's userfaultfd of the task, as the server numbers it
  uint32_t count = 0;  // ranges in use, at most kLazyCopyBatchMaxRanges
  uint64_t reserved = 0;
  LazyCopyRange ranges[kLazyCopyBatchMaxRanges];
};
static_assert(sizeof(LazyCopyBatch) == 1296, "laid out as the server's struct");

constexpr unsigned int kLazyCopyBatchIoctl = _IOWR('g', 2, LazyCopyBatch);

// The most a batch may copy in all (the server gathers up to what the
// daemon's --lazy-copy-batch-mib says, at most 64 MiB).
constexpr uint64_t kLazyCopyBatchMaxBytes = 64ull << 20;

// What CopyIntoTaskInParts() copies as one part, for the daemon.
constexpr uint64_t kLazyCopyPartBytes = 1ull << 20;

// Checks a request's shape: page-aligned dst, whole pages, within
// kLazyCopyMaxBytes. kInvalidArgument says which is wrong.
Status CheckLazyCopyRequest(const LazyCopyRequest& request);

// Checks a batch's shape: a count within kLazyCopyBatchMaxRanges, each
// range as CheckLazyCopyRequest() checks one, none overlapping another,
// within kLazyCopyBatchMaxBytes in all. kInvalidArgument says which.
Status CheckLazyCopyBatch(const LazyCopyBatch& batch);

// A duplicate of descriptor `fd_in_server` of process `server_pid`, which
// must be a userfaultfd: kInvalidArgument when it is something else,
// errno's status when the process or its descriptor is gone.
Result<UniqueFd> TakeServersUserfaultfd(int server_pid, int fd_in_server);

// What a copy came to: `in_place` bytes from dst on are in the task
// (`copied` of them by this copy, the rest were there already); `error` is
// the errno of UFFDIO_COPY that stopped it before `len` (0 if none): EAGAIN
// while the task's mappings change (the server reads the event and asks
// again), ENOENT where the range is no longer registered, ESRCH or ENOSPC
// once the task is gone.
struct LazyCopyOutcome {
  uint64_t in_place = 0;
  uint64_t copied = 0;
  int error = 0;
};

// Copies the first `len` bytes of `read` (whole pages; less read is EIO at
// the end) into the task behind `uffd` from `dst` on, in order: each run of
// whole pages within one piece as it lies, a page that straddles pieces
// gathered first. A page already there (EEXIST) is counted in place and
// skipped, never overwritten.
LazyCopyOutcome CopyIntoTask(int uffd, uint64_t dst, const FileReader::ReadPieces& read,
                             uint64_t len);

// The same, in parts of `part_bytes` (whole pages) side by side: the first
// on this thread, the others on `threads`, which the call waits for. Null
// `threads`, or a range of one part: CopyIntoTask() on this thread.
// `in_place` counts up to the first part that did not all go in, with what
// of that part did; the parts after it that went in are counted in
// `copied` (a request for them later finds them in place).
LazyCopyOutcome CopyIntoTaskInParts(std::shared_ptr<const UniqueFd> uffd, uint64_t dst,
                                    std::shared_ptr<const FileReader::ReadPieces> read,
                                    uint64_t len, JobThreads* threads, uint64_t part_bytes);

// Reads each range of `batch` through `reader`, in the batch's order, and
// copies it into the task behind `uffd` as CopyIntoTask() does: on up to
// `copiers` of `threads` (which the call waits for), while this thread
// reads the next ranges, at most `copiers` of them ahead. Null `threads`:
// each range read and copied here, one after another. Fills in each
// range's `copied` and `error`. A read that fails ends the batch with its
// status: the ranges before it are copied, the ranges after it are not
// read.
Status CopyBatchIntoTask(std::shared_ptr<const UniqueFd> uffd, FileReader* reader,
                         LazyCopyBatch* batch, JobThreads* threads, size_t copiers);

// The threads CopyBatchIntoTask() copies on, made on first use and never
// destroyed: one below 4 CPUs, so that the disk's wait for one range goes
// on beside the copy of another; 3 on 4 CPUs or more, where the copy is
// what waits.
JobThreads* LazyBatchThreadsForThisMachine();
// How many copiers a batch has on those threads: all of them.
size_t LazyBatchCopiers();

// The threads CopyIntoTaskInParts() copies on, made on first use and never
// destroyed: 3 on machines of 4 CPUs or more, where the copy of one request
// into a task (a single thread's memory bandwidth) is what a lazy restore's
// background pass waits for; null below, where the restored tree, its
// server and the daemon already share every core.
JobThreads* LazyCopyThreadsForThisMachine();

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_LAZY_PAGE_COPY_H_
