// Key encodings of the catalog's column families (see core/store/FORMAT.md).
// Big-endian integers so that RocksDB's bytewise order is numeric order: a
// snapshot's files are one contiguous range, a file's extents another, in
// offset order. The snapshots family is keyed by the snapshot's id itself.
#ifndef GPUCKPT_CORE_CATALOG_CATALOG_KEYS_H_
#define GPUCKPT_CORE_CATALOG_CATALOG_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/big_endian.h"

namespace gpuckpt::keys {

// files: snapshot_key:u64 file_index:u32
inline std::string FileKey(uint64_t snapshot_key, uint32_t file_index) {
  std::string k;
  PutBigEndian(&k, snapshot_key, 8);
  PutBigEndian(&k, file_index, 4);
  return k;
}
inline constexpr size_t kFileKeySize = 12;

// extents: snapshot_key:u64 file_index:u32 offset:u64
inline std::string ExtentKey(uint64_t snapshot_key, uint32_t file_index, uint64_t offset) {
  std::string k = FileKey(snapshot_key, file_index);
  PutBigEndian(&k, offset, 8);
  return k;
}
inline constexpr size_t kExtentKeySize = 20;

// The prefix of every key of snapshot `snapshot_key` (in files and extents
// alike): its 8-byte big-endian key.
inline std::string SnapshotPrefix(uint64_t snapshot_key) {
  std::string k;
  PutBigEndian(&k, snapshot_key, 8);
  return k;
}

inline uint64_t SnapshotKeyOf(std::string_view key) { return GetBigEndian(key, 8); }
inline uint32_t FileIndexOf(std::string_view key) {
  return static_cast<uint32_t>(GetBigEndian(key.substr(8), 4));
}
inline uint64_t ExtentOffsetOf(std::string_view key) { return GetBigEndian(key.substr(12), 8); }

}  // namespace gpuckpt::keys

#endif  // GPUCKPT_CORE_CATALOG_CATALOG_KEYS_H_
