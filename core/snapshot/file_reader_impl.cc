#include "core/snapshot/file_reader_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "core/snapshot/extent_index.h"
#include "core/snapshot/records.h"
#include "core/snapshot/store_impl.h"

namespace gpuckpt {

Status FileReaderImpl::MissingExtent(uint64_t offset) const {
  // The pin keeps the extents of a removed snapshot: the index is damaged.
  return Status::Corruption("snapshot '" + snapshot_id_ + "' file '" + entry_.path +
                            "': no extent covers offset " + std::to_string(offset));
}

Result<size_t> FileReaderImpl::Pread(uint64_t offset, size_t len, char* buf) {
  if (offset >= entry_.size || len == 0) return size_t{0};
  len = static_cast<size_t>(std::min<uint64_t>(len, entry_.size - offset));
  if (spool_file_.get() >= 0) return PreadSpooled(offset, len, buf);
  const uint64_t end = offset + len;

  // Holes read as zeros: the buffer is cleared, and only the extents' bytes
  // are copied in. A read that starts in a hole looks up the extents after
  // it, if it reaches them.
  if (!entry_.holes.empty()) std::memset(buf, 0, len);
  uint64_t pos = offset;
  if (const FileHole* hole = HoleContaining(entry_.holes, offset)) pos = hole->end();
  if (pos >= end) return len;

  ExtentIndex index(store_->db(),
                    ExtentIndex::Scope::File(snapshot_key_, file_index_, entry_.holes));
  // One seek: the extent starting at or before `pos`.
  index.SeekTo(pos);

  // First the extents the read covers, then their chunks in one batch (one
  // MultiGet, neighbouring records in one disk read), then the copy.
  std::vector<ChunkStore::ChunkRef> refs;
  std::vector<uint64_t> starts;  // file offset of each ref's chunk
  while (index.covered_to() < end) {
    const uint64_t at = index.walked_to();
    GPUCKPT_ASSIGN_OR_RETURN(std::optional<ExtentIndex::Step> step, index.NextInOrder());
    if (!step) {
      GPUCKPT_RETURN_IF_ERROR(FromRocks(index.status(), "reading the extent index"));
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
  std::vector<std::shared_ptr<const std::string>> chunks;
  GPUCKPT_RETURN_IF_ERROR(
      store_->chunks().ReadMany(refs, domain_key_ ? &*domain_key_ : nullptr, &chunks));
  for (size_t i = 0; i < chunks.size(); ++i) {
    // Never a buffer with bytes nobody wrote into it.
    if (chunks[i]->size() != refs[i].expected_len) return MissingExtent(starts[i]);
    const uint64_t from = std::max(starts[i], offset);
    const uint64_t to = std::min<uint64_t>(starts[i] + chunks[i]->size(), end);
    if (from >= to) continue;
    std::memcpy(buf + (from - offset), chunks[i]->data() + (from - starts[i]),
                static_cast<size_t>(to - from));
  }
  return len;
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
