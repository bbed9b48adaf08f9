// Chunk records: how one chunk's bytes are kept as a RocksDB value.
//
//   record := version:u8 codec:u8 raw_length:varint64 hash:32 checksum:16 payload
//
// The hash (SHA-256, the chunk's name) is kept in the record so that fsck
// can check a chunk read in key (sequence) order without another lookup;
// the checksum (XXH3-128 of the raw bytes, little-endian low then high) is
// what readers check by default.
//
// codec 0 stores the payload raw, codec 1 as one zstd frame. Encoding keeps
// a chunk raw when zstd saves less than 1/32 of it, so incompressible memory
// costs no decompression on read, and does not even try zstd when a sample
// of the chunk's bytes looks random (its byte entropy), which saves most of
// the compression time on weights-like and already compressed memory. Thread-safe: each thread
// keeps its own zstd contexts.
#ifndef GPUCKPT_CORE_STORE_CHUNK_CODEC_H_
#define GPUCKPT_CORE_STORE_CHUNK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/store/chunk_hash.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// Writes the record for `data`, named `hash`, into `*record`.
void EncodeChunkRecord(const uint8_t* data, size_t len, const ChunkHash& hash, int zstd_level,
                       std::string* record);

// Decodes `record` into `*out` and the hash it claims into `*hash`.
// kCorruption on any inconsistency (unknown version or codec, bad length,
// zstd error, and, unless `check_checksum` is false, bytes that do not match
// the record's checksum); `what` names the chunk in the message. Does not
// compute SHA-256.
Status DecodeChunkRecord(std::string_view record, std::string_view what, std::string* out,
                         ChunkHash* hash, bool check_checksum = true);

// The bytes of `record` as they lie in it, when it keeps them raw (codec
// 0), checked as DecodeChunkRecord() checks them, with the hash it claims
// in `*hash`: no copy. std::nullopt when the record is compressed (then
// decode it). The view points into `record`.
Result<std::optional<std::string_view>> RawChunkPayload(std::string_view record,
                                                        std::string_view what, ChunkHash* hash,
                                                        bool check_checksum = true);

// The raw length a record declares, without decoding it.
Result<uint64_t> ChunkRecordRawLength(std::string_view record);

// Chunk meta records (column family chunk_meta):
//   meta := version:u8 seq:varint64 raw_length:varint64 stored_length:varint64
// `seq` is the chunk's key in the chunks family.
struct ChunkMeta {
  uint64_t seq = 0;
  uint64_t raw_length = 0;
  uint64_t stored_length = 0;  // size of the chunk record
};
std::string EncodeChunkMeta(const ChunkMeta& meta);
Result<ChunkMeta> DecodeChunkMeta(std::string_view record);

// Little helpers shared by the record formats of the store.
void PutVarint64(std::string* dst, uint64_t v);
// Reads a varint from the front of `*in` and advances it; false when
// malformed.
bool GetVarint64(std::string_view* in, uint64_t* v);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_CODEC_H_
