// FileReaderImpl: FileReader on the extents column family. Holds no
// iterator between calls (an open iterator pins RocksDB's files), so a
// reader may be kept open indefinitely. Thread-safe; borrows the StoreImpl.
#ifndef GPUCKPT_CORE_SNAPSHOT_FILE_READER_IMPL_H_
#define GPUCKPT_CORE_SNAPSHOT_FILE_READER_IMPL_H_

#include <string>

#include "gpuckpt/file_reader.h"

namespace gpuckpt {

class StoreImpl;

class FileReaderImpl final : public FileReader {
 public:
  FileReaderImpl(StoreImpl* store, std::string snapshot_id, uint64_t snapshot_key,
                 uint32_t file_index, FileEntry entry)
      : store_(store),
        snapshot_id_(std::move(snapshot_id)),
        snapshot_key_(snapshot_key),
        file_index_(file_index),
        entry_(std::move(entry)) {}

  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override;
  const FileEntry& entry() const override { return entry_; }

 private:
  Status MissingExtent(uint64_t offset) const;

  StoreImpl* store_;
  const std::string snapshot_id_;
  const uint64_t snapshot_key_;
  const uint32_t file_index_;
  const FileEntry entry_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_FILE_READER_IMPL_H_
