// FdSource: a descriptor's contents as a SnapshotWriter::SparseSource,
// what SnapshotWriter::AddFile() reads and what MeasureDirectory() counts.
//
// A regular file is read by its runs of data (lseek SEEK_DATA, then
// SEEK_HOLE for where each ends), from the descriptor's position when
// first asked: a hole of kMinHoleBytes or more is left to the writer as a
// hole, never read. Smaller holes, and every hole once kMaxFileHoles were
// given, are read as the zeros they are. Anything else (a pipe, a socket)
// is one run, read() to EOF.
//
// Borrows the descriptor, which must stay open while it is used; one
// thread uses it.
#ifndef GPUCKPT_CORE_SNAPSHOT_FD_SOURCE_H_
#define GPUCKPT_CORE_SNAPSHOT_FD_SOURCE_H_

#include <cstdint>
#include <string>

#include "gpuckpt/snapshot_writer.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// Holes shorter than this are read as zeros: a hole ends the chunk before
// it (the writer cuts a run of data at its end), so small ones would cut
// chunks short and use up the record's kMaxFileHoles for little. 64 KiB is
// the average chunk of files that are not page images.
inline constexpr uint64_t kMinHoleBytes = 64u << 10;

class FdSource final : public SnapshotWriter::SparseSource {
 public:
  // `path` names the file in messages.
  FdSource(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  Result<Run> NextRun() override;
  Result<size_t> Read(char* buf, size_t len) override;
  // Steps over the run NextRun() gave without reading it, and returns its
  // length: what reading it would cost. Regular files only (else
  // kInvalidArgument).
  Result<uint64_t> SkipRun();

 private:
  enum class Mode {
    kStart,   // nothing asked yet
    kSparse,  // a regular file, run by run
    kDense,   // a regular file, the rest read to its end
    kStream,  // no regular file: read() to EOF
  };
  Result<Run> NextSparseRun();
  Result<Run> End();
  Status Changed() const;
  uint64_t Relative(uint64_t offset) const { return offset - base_; }

  const int fd_;
  const std::string path_;
  Mode mode_ = Mode::kStart;
  uint64_t base_ = 0;     // the descriptor's position when first asked
  uint64_t pos_ = 0;      // the next byte to read (in the file, not relative)
  uint64_t run_end_ = 0;  // kSparse: where the current run ends
  uint64_t holes_ = 0;    // holes given
  bool done_ = false;     // kDense, kStream: EOF read
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_FD_SOURCE_H_
