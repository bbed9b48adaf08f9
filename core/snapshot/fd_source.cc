#include "core/snapshot/fd_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "gpuckpt/store_types.h"

namespace gpuckpt {

Status FdSource::Changed() const {
  return Status::Aborted("'" + path_ + "' changed while it was read");
}

Result<SnapshotWriter::SparseSource::Run> FdSource::NextRun() {
  if (mode_ == Mode::kStart) {
    struct stat st {};
    const off_t at = lseek(fd_, 0, SEEK_CUR);
    if (at < 0 || fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      mode_ = Mode::kStream;
    } else {
      mode_ = Mode::kSparse;
      base_ = pos_ = static_cast<uint64_t>(at);
    }
  }
  if (mode_ == Mode::kSparse) return NextSparseRun();
  // One run, then the end where EOF was read.
  return Run{Relative(pos_), done_};
}

Result<SnapshotWriter::SparseSource::Run> FdSource::NextSparseRun() {
  const off_t data = lseek(fd_, static_cast<off_t>(pos_), SEEK_DATA);
  if (data < 0) {
    if (errno == ENXIO) return End();  // no data at or after pos_
    // A filesystem without SEEK_DATA: the rest is read.
    if (errno == EINVAL || errno == EOPNOTSUPP) {
      mode_ = Mode::kDense;
      return Run{Relative(pos_), false};
    }
    return StatusFromErrno(errno, "looking for the data of '" + path_ + "'");
  }
  if (static_cast<uint64_t>(data) < pos_) return Changed();
  const off_t hole = lseek(fd_, data, SEEK_HOLE);
  if (hole < 0) {
    if (errno == ENXIO) return Changed();  // shorter than a moment ago
    return StatusFromErrno(errno, "looking for the holes of '" + path_ + "'");
  }
  uint64_t start = static_cast<uint64_t>(data);
  if (start - pos_ < kMinHoleBytes) {
    start = pos_;  // a small hole, read as zeros
  } else if (holes_ == kMaxFileHoles) {
    mode_ = Mode::kDense;  // no room for more holes: the rest is read
    return Run{Relative(pos_), false};
  } else {
    ++holes_;
  }
  pos_ = start;
  run_end_ = static_cast<uint64_t>(hole);
  return Run{Relative(start), false};
}

Result<SnapshotWriter::SparseSource::Run> FdSource::End() {
  const off_t size = lseek(fd_, 0, SEEK_END);
  if (size < 0) return StatusFromErrno(errno, "finding the end of '" + path_ + "'");
  if (static_cast<uint64_t>(size) < pos_) return Changed();
  const uint64_t tail = static_cast<uint64_t>(size) - pos_;
  if (tail > 0 && (tail < kMinHoleBytes || holes_ == kMaxFileHoles)) {
    mode_ = Mode::kDense;  // a short hole at the end: read
    return Run{Relative(pos_), false};
  }
  if (tail > 0) ++holes_;
  pos_ = static_cast<uint64_t>(size);
  return Run{Relative(pos_), true};
}

Result<size_t> FdSource::Read(char* buf, size_t len) {
  if (mode_ == Mode::kSparse) len = static_cast<size_t>(std::min<uint64_t>(len, run_end_ - pos_));
  if (len == 0 || done_) return size_t{0};
  for (;;) {
    const ssize_t n = mode_ == Mode::kStream ? read(fd_, buf, len)
                                             : pread(fd_, buf, len, static_cast<off_t>(pos_));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return StatusFromErrno(errno, "reading '" + path_ + "'");
    if (n == 0) {
      // SEEK_HOLE said there was more.
      if (mode_ == Mode::kSparse) return Changed();
      done_ = true;
    }
    pos_ += static_cast<uint64_t>(n);
    return static_cast<size_t>(n);
  }
}

Result<uint64_t> FdSource::SkipRun() {
  if (mode_ == Mode::kSparse) {
    const uint64_t n = run_end_ - pos_;
    pos_ = run_end_;
    return n;
  }
  if (mode_ != Mode::kDense) {
    return Status::InvalidArgument("'" + path_ + "' is no regular file: it can only be read");
  }
  const off_t size = lseek(fd_, 0, SEEK_END);
  if (size < 0) return StatusFromErrno(errno, "finding the end of '" + path_ + "'");
  const uint64_t n = static_cast<uint64_t>(size) > pos_ ? static_cast<uint64_t>(size) - pos_ : 0;
  pos_ += n;
  done_ = true;
  return n;
}

}  // namespace gpuckpt
