#include "core/snapshot/file_reader_impl.h"

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

  ExtentIndex index(store_->db(), ExtentIndex::Scope::File(snapshot_key_, file_index_));
  // One seek: the extent starting at or before `offset`.
  index.SeekTo(offset);

  // First the extents the read covers, then their chunks in one batch (one
  // MultiGet, neighbouring records in one disk read), then the copy.
  std::vector<ChunkStore::ChunkRef> refs;
  std::vector<uint64_t> starts;  // file offset of each ref's chunk
  while (index.walked_to() < offset + len) {
    const uint64_t pos = index.walked_to();
    GPUCKPT_ASSIGN_OR_RETURN(std::optional<ExtentIndex::Step> step, index.NextInOrder());
    if (!step) {
      GPUCKPT_RETURN_IF_ERROR(FromRocks(index.status(), "reading the extent index"));
      return MissingExtent(pos);
    }
    if (step->join != ExtentJoin::kContiguous) return MissingExtent(pos);
    const Extent& e = step->extent;
    // A chunk this read consumes whole is not cached: sequential readers
    // (cat, cp, CRIU) never come back for it, and the kernel keeps the
    // file's pages anyway. Chunks cut by the read's edges are, since the
    // next request reads their other part.
    const bool whole = pos == e.offset && offset + len - pos >= e.length;
    refs.push_back(ChunkStore::ChunkRef{e.hash, e.seq, e.length, /*use_cache=*/!whole});
    starts.push_back(e.offset);
  }
  std::vector<std::shared_ptr<const std::string>> chunks;
  GPUCKPT_RETURN_IF_ERROR(
      store_->chunks().ReadMany(refs, domain_key_ ? &*domain_key_ : nullptr, &chunks));
  size_t done = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const size_t in_chunk = static_cast<size_t>(offset + done - starts[i]);
    const size_t n = std::min<size_t>(len - done, chunks[i]->size() - in_chunk);
    std::memcpy(buf + done, chunks[i]->data() + in_chunk, n);
    done += n;
  }
  return done;
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
