#include "core/snapshot/file_reader_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "core/catalog/extent_index.h"
#include "core/catalog/records.h"
#include "core/snapshot/store_impl.h"

namespace gpuckpt {

Status FileReaderImpl::MissingExtent(uint64_t offset) const {
  // The pin keeps the extents of a removed snapshot: the index is damaged.
  return Status::Corruption("snapshot '" + snapshot_id_ + "' file '" + entry_.path +
                            "': no extent covers offset " + std::to_string(offset));
}

namespace {

// What holes read as: pieces point into one buffer of zeros, made on the
// first read of a hole (not a zeroed array in every binary's data).
constexpr size_t kZerosBytes = 1 << 20;
const char* Zeros() {
  static const char* const zeros = new char[kZerosBytes]();
  return zeros;
}

void AddZeros(uint64_t count, std::vector<FileReader::Piece>* pieces) {
  while (count > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(count, kZerosBytes));
    pieces->push_back(FileReader::Piece{Zeros(), n});
    count -= n;
  }
}

}  // namespace

Result<size_t> FileReaderImpl::Pread(uint64_t offset, size_t len, char* buf) {
  // A spooled file straight into `buf`: Read() would read it into a buffer
  // of its own first.
  if (spool_file_.get() >= 0 && offset < entry_.size && len > 0)
    return PreadSpooled(offset, static_cast<size_t>(std::min<uint64_t>(len, entry_.size - offset)),
                        buf);
  GPUCKPT_ASSIGN_OR_RETURN(ReadPieces read, Read(offset, len));
  size_t done = 0;
  for (const Piece& piece : read.pieces) {
    std::memcpy(buf + done, piece.data, piece.size);
    done += piece.size;
  }
  return done;
}

Result<FileReader::ReadPieces> FileReaderImpl::Read(uint64_t offset, size_t len) {
  ReadPieces out;
  if (offset >= entry_.size || len == 0) return out;
  len = static_cast<size_t>(std::min<uint64_t>(len, entry_.size - offset));
  if (spool_file_.get() >= 0) {
    auto buffer = std::make_shared<std::string>(len, '\0');
    GPUCKPT_ASSIGN_OR_RETURN(size_t n, PreadSpooled(offset, len, buffer->data()));
    out.pieces.push_back(Piece{buffer->data(), n});
    out.held.push_back(std::move(buffer));
    return out;
  }
  const uint64_t end = offset + len;

  // Holes read as zeros (the shared zero buffer); a read that starts in a
  // hole looks up the extents after it, if it reaches them.
  uint64_t pos = offset;
  if (const FileHole* hole = HoleContaining(entry_.holes, offset)) pos = hole->end();
  if (pos >= end) {
    AddZeros(len, &out.pieces);
    return out;
  }

  ExtentIndex index(store_->catalog(),
                    ExtentIndex::Scope::File(snapshot_key_, file_index_, entry_.holes));
  // One seek: the extent starting at or before `pos`.
  index.SeekTo(pos);

  // First the extents the read covers, then their chunks in one batch (one
  // MultiGet, neighbouring records in one disk read).
  std::vector<ChunkStore::ChunkRef> refs;
  std::vector<uint64_t> starts;  // file offset of each ref's chunk
  while (index.covered_to() < end) {
    const uint64_t at = index.walked_to();
    GPUCKPT_ASSIGN_OR_RETURN(std::optional<ExtentIndex::Step> step, index.NextInOrder());
    if (!step) {
      GPUCKPT_RETURN_IF_ERROR(index.status("reading the extent index"));
      return MissingExtent(at);
    }
    if (step->join != ExtentJoin::kContiguous && step->join != ExtentJoin::kAfterHole) {
      return MissingExtent(at);
    }
    const Extent& e = step->extent;
    // A chunk this read consumes whole is not cached: sequential readers
    // (cat, cp, CRIU) never come back for it, and the kernel keeps the
    // file's pages anyway. Chunks cut by the read's edges are, since the
    // next request reads their other part.
    const bool whole = e.offset >= offset && end - e.offset >= e.length;
    refs.push_back(ChunkStore::ChunkRef{e.hash, e.seq, e.length, /*use_cache=*/!whole});
    starts.push_back(e.offset);
  }
  std::vector<ChunkStore::ChunkBytes> chunks;
  GPUCKPT_RETURN_IF_ERROR(
      store_->chunks().ReadMany(refs, domain_key_ ? &*domain_key_ : nullptr, &chunks));
  // The pieces in file order: each chunk's part in the read, and zeros for
  // the holes before, between and after them.
  uint64_t next = offset;
  for (size_t i = 0; i < chunks.size(); ++i) {
    // Never a piece of bytes nobody wrote.
    const std::string_view bytes = chunks[i].bytes;
    if (bytes.size() != refs[i].expected_len) return MissingExtent(starts[i]);
    const uint64_t from = std::max(starts[i], offset);
    const uint64_t to = std::min<uint64_t>(starts[i] + bytes.size(), end);
    if (from >= to) continue;
    if (from > next) AddZeros(from - next, &out.pieces);
    out.pieces.push_back(Piece{bytes.data() + (from - starts[i]), static_cast<size_t>(to - from)});
    // Chunks read together often share one read buffer: held once.
    if (out.held.empty() || out.held.back() != chunks[i].owner)
      out.held.push_back(std::move(chunks[i].owner));
    next = to;
  }
  if (end > next) AddZeros(end - next, &out.pieces);
  return out;
}

Result<size_t> FileReaderImpl::PreadSpooled(uint64_t offset, size_t len, char* buf) const {
  size_t done = 0;
  while (done < len) {
    const ssize_t n =
        pread(spool_file_.get(), buf + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return StatusFromErrno(errno, "reading the spool file of '" + entry_.path + "'");
    if (n == 0) {
      return Status::Corruption("snapshot '" + snapshot_id_ + "' file '" + entry_.path +
                                "': its spool file ends at " + std::to_string(offset + done) +
                                ", before its size");
    }
    done += static_cast<size_t>(n);
  }
  return len;
}

Result<std::string> ReadSmallStoredFile(Store& store, const std::string& id,
                                        const std::string& path, uint64_t max_bytes) {
  GPUCKPT_ASSIGN_OR_RETURN(auto reader, store.OpenFile(id, path));
  return ReadSmallStoredFile(*reader, path + " of checkpoint " + id, max_bytes);
}

Result<std::string> ReadSmallStoredFile(FileReader& reader, const std::string& what,
                                        uint64_t max_bytes) {
  const uint64_t size = reader.entry().size;
  if (size > max_bytes)
    return Status::InvalidArgument(what + " is too large (" + std::to_string(size) + " bytes)");
  std::string data(size, '\0');
  GPUCKPT_ASSIGN_OR_RETURN(size_t n, reader.Pread(0, data.size(), data.data()));
  data.resize(n);
  return data;
}

}  // namespace gpuckpt
