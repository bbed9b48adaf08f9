// FileReaderImpl: FileReader on the extents column family, or, for a file
// still spooled, on its spool file (held open: settling removes the file's
// name, not the bytes this reader reads). Holds no
// iterator between calls (an open iterator pins RocksDB's files), so a
// reader may be kept open indefinitely. Owns a SnapshotPin: the snapshot's
// records and chunks stay, and reads return the same bytes, until the
// reader is destroyed, even if the snapshot is removed and gc runs
// meanwhile. Thread-safe; borrows the StoreImpl.
#ifndef GPUCKPT_CORE_SNAPSHOT_FILE_READER_IMPL_H_
#define GPUCKPT_CORE_SNAPSHOT_FILE_READER_IMPL_H_

#include <optional>
#include <string>

#include "core/base/unique_fd.h"
#include "core/snapshot/store_impl.h"
#include "gpuckpt/file_reader.h"

namespace gpuckpt {

class FileReaderImpl final : public FileReader {
 public:
  // `domain_key`: what the snapshot's chunks are named with (nullopt: the
  // shared domain), for ReadVerification::kFullHash.
  FileReaderImpl(StoreImpl* store, SnapshotPin pin, std::string snapshot_id, uint64_t snapshot_key,
                 std::optional<ChunkDomainKey> domain_key, uint32_t file_index, FileEntry entry,
                 UniqueFd spool_file = UniqueFd())
      : store_(store),
        pin_(std::move(pin)),
        snapshot_id_(std::move(snapshot_id)),
        snapshot_key_(snapshot_key),
        domain_key_(domain_key),
        file_index_(file_index),
        entry_(std::move(entry)),
        spool_file_(std::move(spool_file)) {}

  // On Read(), one copy of each chunk's bytes into `buf`; a spooled file
  // is read straight into `buf`.
  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override;
  // Pieces of the chunks as decoded (the cache's or this read's), holes as
  // one shared zero buffer; a spooled file's bytes read into a buffer.
  Result<ReadPieces> Read(uint64_t offset, size_t len) override;
  const FileEntry& entry() const override { return entry_; }

 private:
  Status MissingExtent(uint64_t offset) const;
  Result<size_t> PreadSpooled(uint64_t offset, size_t len, char* buf) const;

  StoreImpl* store_;
  const SnapshotPin pin_;
  const std::string snapshot_id_;
  const uint64_t snapshot_key_;
  const std::optional<ChunkDomainKey> domain_key_;
  const uint32_t file_index_;
  const FileEntry entry_;
  const UniqueFd spool_file_;  // -1: the file is read from its extents
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_FILE_READER_IMPL_H_
