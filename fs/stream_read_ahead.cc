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

namespace {

int CpusWeMayRunOn() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
}

}  // namespace

JobThreads* LazyReadAheadThreads() {
  static JobThreads* const threads =
      new JobThreads(static_cast<size_t>(std::clamp(CpusWeMayRunOn() / 2, 4, 8)));
  return threads;
}

StreamReadAhead::Options LazyReadAheadOptionsForThisMachine() {
  StreamReadAhead::Options options;
  const int cpus = CpusWeMayRunOn();
  options.slabs_ahead = cpus < 4 ? 0 : static_cast<size_t>(std::clamp(cpus, 8, 16));
  return options;
}

namespace {

// One read ahead of the reader: [start, start + len), or less at the end
// of the file. A slab of the stream, or a read one or more strides on.
struct Ahead {
  Ahead(uint64_t start, uint64_t len) : start(start), len(len) {}
  const uint64_t start;
  const uint64_t len;  // as asked for
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
  size_t running GUARDED_BY(mu) = 0;  // read-aheads in inner->Read()
  // The stream's slabs, by index (start / slab_bytes).
  std::map<uint64_t, std::shared_ptr<Ahead>> slabs GUARDED_BY(mu);
  bool streaming GUARDED_BY(mu) = false;
  uint64_t stream_end GUARDED_BY(mu) = 0;  // where the stream's last read ended
  uint64_t last_end GUARDED_BY(mu) = 0;    // where the last read ended
  // When a read last jumped (MonotonicNowNs); none yet: long ago.
  int64_t last_jump_ns GUARDED_BY(mu) = std::numeric_limits<int64_t>::min() / 2;

  // Reads that did not follow on, looked at for a stride: where the last
  // one started, the distance to it from the one before, and how many
  // times in a row that distance came back.
  bool jumped GUARDED_BY(mu) = false;
  uint64_t last_jump_offset GUARDED_BY(mu) = 0;
  int64_t jump_distance GUARDED_BY(mu) = 0;
  size_t distance_repeats GUARDED_BY(mu) = 0;
  // The stride followed (0: none), and its reads ahead by start. A read
  // elsewhere (a stray page the tree touched) leaves them: the next read
  // on the stride finds its bytes read.
  int64_t stride GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::shared_ptr<Ahead>> strided GUARDED_BY(mu);
  Counts counts GUARDED_BY(mu);

  // The read ahead that holds byte `at`, if any.
  std::shared_ptr<Ahead> AheadAt(uint64_t at) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (options.slab_bytes > 0) {
      auto slab = slabs.find(at / options.slab_bytes);
      if (slab != slabs.end()) return slab->second;
    }
    auto after = strided.upper_bound(at);
    if (after == strided.begin()) return nullptr;
    const std::shared_ptr<Ahead>& ahead = std::prev(after)->second;
    return at - ahead->start < ahead->len ? ahead : nullptr;
  }

  // Notes a read of [offset, end), `slices` of it from reads ahead; when it
  // goes on from the one before (or from the stream), drops the slabs
  // behind it and reads ahead of it. A read that does not follow on is
  // looked at for a stride.
  void Note(const std::shared_ptr<State>& self, uint64_t offset, uint64_t end, size_t slices)
      EXCLUDES(mu) {
    MutexLock lock(&mu);
    counts.reads_from_read_ahead += slices;
    const bool follows = offset == last_end;  // on from the read before
    last_end = end;
    // Every read that does not follow on is looked at for a stride. One on
    // the stride followed is not the stream's, also where it lies within
    // max_gap of the stream's end (a stride of 1 MiB or less).
    const bool on_stride = !follows && NoteForStride(self, offset, end);
    const bool continues =
        !on_stride && streaming && offset >= stream_end && offset - stream_end <= options.max_gap;
    const bool starts = !continues && follows && offset > 0;
    const int64_t now = MonotonicNowNs();
    if (!continues && !follows) last_jump_ns = now;
    if (!continues && !starts) return;
    streaming = true;
    stream_end = end;
    if (options.slabs_ahead == 0) return;
    const uint64_t slab = options.slab_bytes;
    slabs.erase(slabs.begin(), slabs.lower_bound(offset / slab));
    if (now - last_jump_ns < options.quiet_after_jump_ns) return;
    const uint64_t file_end = inner->entry().size;
    for (uint64_t index = end / slab;
         index < end / slab + options.slabs_ahead && index * slab < file_end; ++index) {
      if (slabs.count(index) != 0) continue;
      auto ahead = std::make_shared<Ahead>(index * slab, slab);
      slabs.emplace(index, ahead);
      ++counts.slabs_read;
      threads->Post([self, ahead] { self->ReadAhead(*ahead); });
    }
    // A stream that jumped leaves slabs it went past: the farthest go.
    while (slabs.size() > 2 * options.slabs_ahead) slabs.erase(std::prev(slabs.end()));
  }

  // A read of [offset, end) that did not follow on from the one before: on
  // the stride followed, the next strides are read ahead; elsewhere, a
  // distance between such reads that came back stride_repeats times in a
  // row becomes the stride followed. True when the read is on the stride
  // followed (now).
  bool NoteForStride(const std::shared_ptr<State>& self, uint64_t offset, uint64_t end)
      REQUIRES(mu) {
    if (options.strides_ahead == 0) return false;
    const int64_t distance = static_cast<int64_t>(offset) - static_cast<int64_t>(last_jump_offset);
    const uint64_t magnitude =
        distance < 0 ? 0 - static_cast<uint64_t>(distance) : static_cast<uint64_t>(distance);
    // A stride's reads take at most half of it: reads that cover more (a
    // stream that skips what the faults took) are read on as a stream.
    if (jumped && distance == jump_distance && magnitude >= 2 * (end - offset)) {
      ++distance_repeats;
    } else {
      jump_distance = distance;
      distance_repeats = 0;
    }
    jumped = true;
    last_jump_offset = offset;
    const bool on_stride = stride != 0 && (distance == stride || strided.count(offset) != 0);
    if (!on_stride) {
      if (distance_repeats < options.stride_repeats) return false;
      stride = distance;  // a new stride: what was read along the old one goes
      strided.clear();
    }
    // Behind the read, along the stride: taken or passed.
    if (stride > 0) {
      strided.erase(strided.begin(), strided.upper_bound(offset));
    } else {
      strided.erase(strided.lower_bound(offset), strided.end());
    }
    const uint64_t file_end = inner->entry().size;
    const uint64_t len = end - offset;
    uint64_t at = offset;
    for (size_t k = 0; k < options.strides_ahead; ++k) {
      if (stride < 0 && at < magnitude) break;
      at = stride > 0 ? at + magnitude : at - magnitude;
      if (at >= file_end) break;
      if (strided.count(at) != 0) continue;
      auto ahead = std::make_shared<Ahead>(at, len);
      strided.emplace(at, ahead);
      ++counts.strided_reads;
      threads->Post([self, ahead] { self->ReadAhead(*ahead); });
    }
    return true;
  }

  void ReadAhead(Ahead& ahead) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      if (closing) {
        ahead.Finish(Status::Cancelled("the file was closed"));
        return;
      }
      ++running;
    }
    ahead.Finish(inner->Read(ahead.start, static_cast<size_t>(ahead.len)));
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
    state_->strided.clear();
    inner = std::move(state_->inner);
    counts = state_->counts;
  }
  if (counts.slabs_read > 0 || counts.strided_reads > 0) {
    spdlog::debug(
        "lazy_read_ahead file={} slabs={} slab_bytes={} strided_reads={} reads_from_read_ahead={}",
        LogValue(inner->entry().path), counts.slabs_read, state_->options.slab_bytes,
        counts.strided_reads, counts.reads_from_read_ahead);
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
  const uint64_t end = offset + len;
  ReadPieces out;
  uint64_t at = offset;
  bool at_eof = false;
  size_t slices = 0;
  while (at < end) {
    std::shared_ptr<Ahead> ahead = state_->AheadAt(at);
    if (!ahead) break;
    const Result<ReadPieces>& result = ahead->Wait();
    if (!result.ok()) break;  // read again below: the error is this read's to report
    const ReadPieces& read = result.value();
    const uint64_t ahead_end = ahead->start + read.size();
    if (at >= ahead_end) {
      at_eof = read.size() < ahead->len;
      break;
    }
    const uint64_t take = std::min(end, ahead_end) - at;
    AppendSlice(read, at - ahead->start, take, &out);
    // The pieces stay valid while the read ahead lives.
    out.held.push_back(std::shared_ptr<const void>(ahead, &read));
    ++slices;
    at += take;
    if (read.size() < ahead->len && at >= ahead_end) {
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
