// StreamReadAhead: a FileReader that reads ahead of a reader going forward
// through an image file, or stepping through it at a fixed stride, on
// threads of its own.
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
// The faults themselves are followed where they step through the file at
// a fixed stride, as a tree does that reads a part of every row of a table
// or of every tensor of a list (and as the server does, going along such a
// stride ahead of them): once the distance between reads that did not
// follow on from the one before has come back Options::stride_repeats
// times in a row, the reads the next Options::strides_ahead strides on (as
// long as the last) are read at once on the threads, side by side, so that
// each read finds its bytes read instead of waiting for the disk and the
// index one after another. A read on the stride is not the stream's, also
// where it lies within max_gap of it. A read elsewhere meanwhile (a stray
// page) leaves the stride followed; a new distance that comes back as
// often replaces it.
//
// What it holds: at most 2 * slabs_ahead slabs (each up to slab_bytes, as
// the inner reader's pieces), the slabs behind the stream dropped as it
// goes, and at most strides_ahead reads along the stride. Thread-safe, as
// every FileReader: concurrent reads of one open file are served side by
// side. The destructor drops read-aheads that have not started and waits
// for those that have (a read's, milliseconds), so the inner reader (and
// the store it borrows) is not used once it returns.
#ifndef GPUCKPT_FS_STREAM_READ_AHEAD_H_
#define GPUCKPT_FS_STREAM_READ_AHEAD_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/base/job_threads.h"
#include "gpuckpt/file_reader.h"

namespace gpuckpt {

class StreamReadAhead final : public FileReader {
 public:
  struct Options {
    uint64_t slab_bytes = 1 << 20;  // what one read-ahead of the stream reads
    size_t slabs_ahead = 8;         // how far ahead of the stream; 0: not at all
    uint64_t max_gap = 1 << 20;     // a read this far past the stream's end continues it
    // No slab is asked for within this long of a read that jumped: while
    // the tree faults, its faults' reads go first (read-aheads then held
    // up its next step 4x on 16 cores), and the stream reads on unaided.
    int64_t quiet_after_jump_ns = 20'000'000;
    // Reads read ahead along a stride followed; 0: strides are not followed.
    size_t strides_ahead = 32;
    // How often the distance between reads that did not follow on comes
    // back in a row before it is followed (1: three reads evenly spaced).
    size_t stride_repeats = 1;
  };
  // Reads through `inner`, ahead on `threads` (borrowed: it must outlive
  // this reader and every job it posts, as a JobThreads made once does).
  StreamReadAhead(std::unique_ptr<FileReader> inner, JobThreads* threads, Options options);
  StreamReadAhead(std::unique_ptr<FileReader> inner, JobThreads* threads)
      : StreamReadAhead(std::move(inner), threads, Options()) {}
  ~StreamReadAhead() override;

  // Straight through to the inner reader (a copy either way).
  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override;
  // From the reads ahead where they hold the bytes, else from the inner
  // reader; notes the read for the stream and the stride (and reads ahead).
  Result<ReadPieces> Read(uint64_t offset, size_t len) override;
  const FileEntry& entry() const override;

  // Slabs and strided reads read ahead so far, and reads (or parts)
  // served from them.
  struct Counts {
    uint64_t slabs_read = 0;
    uint64_t strided_reads = 0;
    uint64_t reads_from_read_ahead = 0;
  };
  Counts counts() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The threads every StreamReadAhead of the process reads ahead on: half the
// CPUs, at least 4 (a read ahead mostly waits for the disk) and at most 8.
// Made once, never destroyed.
JobThreads* LazyReadAheadThreads();

// What a lazy restore's server is read ahead with here: strides always
// (their reads wait for the disk side by side, instead of one fault after
// another); the stream only on 4 CPUs or more, as many slabs ahead as
// there are CPUs, 8 to 16. On fewer, the restored tree, its server and the
// daemon already share every core, and reading the stream ahead changed
// nothing beyond the spread between runs.
StreamReadAhead::Options LazyReadAheadOptionsForThisMachine();

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STREAM_READ_AHEAD_H_
