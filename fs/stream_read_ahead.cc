#include "fs/stream_read_ahead.h"

#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "core/base/log.h"
#include "core/base/mono_clock.h"
#include "core/base/mutex.h"

namespace gpuckpt {

JobThreads* LazyReadAheadThreadsForThisMachine() {
  static JobThreads* const threads = []() -> JobThreads* {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int count = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    if (count < 4) return nullptr;
    return new JobThreads(static_cast<size_t>(std::min(count / 4, 4)));
  }();
  return threads;
}

namespace {

// One slab read ahead: [index * slab_bytes, + slab_bytes), or less at the
// end of the file.
struct Slab {
  Mutex mu;
  CondVar cv;
  std::optional<Result<FileReader::ReadPieces>> read GUARDED_BY(mu);  // set once done

  const Result<FileReader::ReadPieces>& Wait() EXCLUDES(mu) {
    MutexLock lock(&mu);
    while (!read) cv.Wait(mu);
    return *read;  // never changed once set
  }
  void Finish(Result<FileReader::ReadPieces> result) EXCLUDES(mu) {
    MutexLock lock(&mu);
    read = std::move(result);
    cv.NotifyAll();
  }
};

// Appends `len` bytes of `from`'s pieces, starting `skip` bytes in, to `to`.
void AppendSlice(const FileReader::ReadPieces& from, uint64_t skip, uint64_t len,
                 FileReader::ReadPieces* to) {
  for (const FileReader::Piece& piece : from.pieces) {
    if (len == 0) break;
    if (skip >= piece.size) {
      skip -= piece.size;
      continue;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(piece.size - skip, len));
    to->pieces.push_back(FileReader::Piece{piece.data + skip, take});
    skip = 0;
    len -= take;
  }
}

}  // namespace

struct StreamReadAhead::State {
  State(std::unique_ptr<FileReader> inner, JobThreads* threads, Options options)
      : inner(std::move(inner)), threads(threads), options(options) {}

  // Thread-safe itself. A read-ahead uses it only while `running` counts
  // it; the destructor resets it once none runs, so that nothing of the
  // store it borrows is touched after the file's release.
  std::unique_ptr<FileReader> inner;
  JobThreads* const threads;
  const Options options;

  Mutex mu;
  CondVar cv;  // signalled as running falls
  bool closing GUARDED_BY(mu) = false;
  size_t running GUARDED_BY(mu) = 0;                               // read-aheads in inner->Read()
  std::map<uint64_t, std::shared_ptr<Slab>> slabs GUARDED_BY(mu);  // by index
  bool streaming GUARDED_BY(mu) = false;
  uint64_t stream_end GUARDED_BY(mu) = 0;  // where the stream's last read ended
  uint64_t last_end GUARDED_BY(mu) = 0;    // where the last read ended
  // When a read last jumped (MonotonicNowNs); none yet: long ago.
  int64_t last_jump_ns GUARDED_BY(mu) = std::numeric_limits<int64_t>::min() / 2;
  Counts counts GUARDED_BY(mu);

  std::shared_ptr<Slab> SlabAt(uint64_t index) EXCLUDES(mu) {
    MutexLock lock(&mu);
    auto found = slabs.find(index);
    return found == slabs.end() ? nullptr : found->second;
  }

  // Notes a read of [offset, end), `slices` of it from slabs; when it goes
  // on from the one before (or from the stream), drops the slabs behind it
  // and reads ahead of it.
  void Note(const std::shared_ptr<State>& self, uint64_t offset, uint64_t end, size_t slices)
      EXCLUDES(mu) {
    MutexLock lock(&mu);
    counts.reads_from_slabs += slices;
    const bool continues =
        streaming && offset >= stream_end && offset - stream_end <= options.max_gap;
    const bool follows = offset == last_end;  // on from the read before
    const bool starts = !continues && follows && offset > 0;
    last_end = end;
    const int64_t now = MonotonicNowNs();
    if (!continues && !follows) last_jump_ns = now;
    if (!continues && !starts) return;
    streaming = true;
    stream_end = end;
    const uint64_t slab = options.slab_bytes;
    slabs.erase(slabs.begin(), slabs.lower_bound(offset / slab));
    if (now - last_jump_ns < options.quiet_after_jump_ns) return;
    const uint64_t file_end = inner->entry().size;
    for (uint64_t index = end / slab;
         index < end / slab + options.slabs_ahead && index * slab < file_end; ++index) {
      if (slabs.count(index) != 0) continue;
      auto ahead = std::make_shared<Slab>();
      slabs.emplace(index, ahead);
      ++counts.slabs_read;
      threads->Post([self, ahead, index] { self->ReadSlab(*ahead, index); });
    }
    // A stream that jumped leaves slabs it went past: the farthest go.
    while (slabs.size() > 2 * options.slabs_ahead) slabs.erase(std::prev(slabs.end()));
  }

  void ReadSlab(Slab& slab, uint64_t index) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      if (closing) {
        slab.Finish(Status::Cancelled("the file was closed"));
        return;
      }
      ++running;
    }
    slab.Finish(inner->Read(index * options.slab_bytes, options.slab_bytes));
    MutexLock lock(&mu);
    --running;
    cv.NotifyAll();
  }
};

StreamReadAhead::StreamReadAhead(std::unique_ptr<FileReader> inner, JobThreads* threads,
                                 Options options)
    : state_(std::make_shared<State>(std::move(inner), threads, options)) {}

StreamReadAhead::~StreamReadAhead() {
  // Read-aheads still queued hold the state, not the inner reader.
  std::unique_ptr<FileReader> inner;
  Counts counts;
  {
    MutexLock lock(&state_->mu);
    state_->closing = true;
    while (state_->running > 0) state_->cv.Wait(state_->mu);
    state_->slabs.clear();
    inner = std::move(state_->inner);
    counts = state_->counts;
  }
  if (counts.slabs_read > 0) {
    spdlog::debug("lazy_read_ahead file={} slabs={} slab_bytes={} reads_from_slabs={}",
                  LogValue(inner->entry().path), counts.slabs_read, state_->options.slab_bytes,
                  counts.reads_from_slabs);
  }
}

Result<size_t> StreamReadAhead::Pread(uint64_t offset, size_t len, char* buf) {
  return state_->inner->Pread(offset, len, buf);
}

const FileEntry& StreamReadAhead::entry() const { return state_->inner->entry(); }

StreamReadAhead::Counts StreamReadAhead::counts() const {
  MutexLock lock(&state_->mu);
  return state_->counts;
}

Result<FileReader::ReadPieces> StreamReadAhead::Read(uint64_t offset, size_t len) {
  const uint64_t slab_bytes = state_->options.slab_bytes;
  const uint64_t end = offset + len;
  ReadPieces out;
  uint64_t at = offset;
  bool at_eof = false;
  size_t slices = 0;
  while (at < end) {
    const uint64_t index = at / slab_bytes;
    std::shared_ptr<Slab> slab = state_->SlabAt(index);
    if (!slab) break;
    const Result<ReadPieces>& result = slab->Wait();
    if (!result.ok()) break;  // read again below: the error is this read's to report
    const ReadPieces& read = result.value();
    const uint64_t slab_start = index * slab_bytes;
    const uint64_t slab_end = slab_start + read.size();
    if (at >= slab_end) {
      at_eof = read.size() < slab_bytes;
      break;
    }
    const uint64_t take = std::min(end, slab_end) - at;
    AppendSlice(read, at - slab_start, take, &out);
    // The slab's pieces stay valid while the slab lives.
    out.held.push_back(std::shared_ptr<const void>(slab, &read));
    ++slices;
    at += take;
    if (read.size() < slab_bytes && at >= slab_end) {
      at_eof = true;
      break;
    }
  }
  if (at < end && !at_eof) {
    GPUCKPT_ASSIGN_OR_RETURN(ReadPieces rest,
                             state_->inner->Read(at, static_cast<size_t>(end - at)));
    out.pieces.insert(out.pieces.end(), rest.pieces.begin(), rest.pieces.end());
    for (auto& owner : rest.held) out.held.push_back(std::move(owner));
  }
  state_->Note(state_, offset, offset + out.size(), slices);
  return out;
}

}  // namespace gpuckpt
