// Key encodings of the index column families (see FORMAT.md). Big-endian
// integers so that RocksDB's bytewise order is numeric order: a snapshot's
// files are one contiguous range, a file's extents another, in offset order.
#ifndef GPUCKPT_CORE_STORE_KEYS_H_
#define GPUCKPT_CORE_STORE_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace gpuckpt::keys {

inline void PutBigEndian(std::string* dst, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) dst->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline uint64_t GetBigEndian(std::string_view src, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(src[i]);
  return v;
}

// files: snapshot_key:u64 file_index:u32
inline std::string FileKey(uint64_t snapshot_key, uint32_t file_index) {
  std::string k;
  PutBigEndian(&k, snapshot_key, 8);
  PutBigEndian(&k, file_index, 4);
  return k;
}

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

#endif  // GPUCKPT_CORE_STORE_KEYS_H_
