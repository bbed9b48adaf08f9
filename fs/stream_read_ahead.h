// StreamReadAhead: a FileReader that reads ahead of a reader going forward
// through an image file, on threads of its own.
//
// The kernel reads ahead for readers of the mount's page cache, but not for
// an open with direct_io: a lazy restore's server (CRIU lazy-pages) opens
// its page images that way and reads them one request at a time. Each
// request then waits for the store to find, read and check its chunks on
// one daemon thread, and the server waits for each, so a large tree comes
// in at the pace of one core. Once the server's reads go forward through
// the file (each starting at or shortly after the previous one's end), the
// slabs of the file after the last read are read on the threads of
// JobThreads, several at once, and later reads take their bytes from
// there. Reads that jump about (the page faults of the restored tree, in
// between) are served as before and start no read-ahead; while they come,
// no slab is asked for at all (Options::quiet_after_jump_ns), so that a
// tree working again waits for its own pages, not behind slabs. A fault
// whose bytes a slab already holds takes them from it.
//
// What it holds: at most 2 * slabs_ahead slabs (each up to slab_bytes, as
// the inner reader's pieces), the slabs behind the stream dropped as it
// goes. Thread-safe, as every FileReader: concurrent reads of one open file
// are served side by side. The destructor drops read-aheads that have not
// started and waits for those that have (a slab's read, milliseconds), so
// the inner reader (and the store it borrows) is not used once it returns.
#ifndef GPUCKPT_FS_STREAM_READ_AHEAD_H_
#define GPUCKPT_FS_STREAM_READ_AHEAD_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/base/job_threads.h"
#include "gpuckpt/file_reader.h"

namespace gpuckpt {

// The threads every StreamReadAhead of the process reads ahead on, by
// default: a quarter of the CPUs it may run on, at most 4; null on fewer
// than 4 CPUs, where the restored tree, its server and the daemon already
// share every core (on 2 cores reading ahead changed nothing beyond the
// spread between runs). Made once, never destroyed.
JobThreads* LazyReadAheadThreadsForThisMachine();

class StreamReadAhead final : public FileReader {
 public:
  struct Options {
    uint64_t slab_bytes = 1 << 20;  // what one read-ahead reads
    size_t slabs_ahead = 8;         // how far ahead of the stream
    uint64_t max_gap = 1 << 20;     // a read this far past the stream's end continues it
    // No slab is asked for within this long of a read that jumped: while
    // the tree faults, its faults' reads go first (read-aheads then held
    // up its next step 4x on 16 cores), and the stream reads on unaided.
    int64_t quiet_after_jump_ns = 20'000'000;
  };
  // Reads through `inner`, ahead on `threads` (borrowed: it must outlive
  // this reader and every job it posts, as a JobThreads made once does).
  StreamReadAhead(std::unique_ptr<FileReader> inner, JobThreads* threads, Options options);
  StreamReadAhead(std::unique_ptr<FileReader> inner, JobThreads* threads)
      : StreamReadAhead(std::move(inner), threads, Options()) {}
  ~StreamReadAhead() override;

  // Straight through to the inner reader (a copy either way).
  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override;
  // From the slabs read ahead where they hold the bytes, else from the
  // inner reader; notes the read for the stream (and reads ahead).
  Result<ReadPieces> Read(uint64_t offset, size_t len) override;
  const FileEntry& entry() const override;

  // Slabs read ahead so far, and reads (or parts) served from them.
  struct Counts {
    uint64_t slabs_read = 0;
    uint64_t reads_from_slabs = 0;
  };
  Counts counts() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STREAM_READ_AHEAD_H_
