// Chunk records: how one chunk's bytes are kept as a RocksDB value.
//
//   record := version:u8 codec:u8 raw_length:varint64 payload
//
// codec 0 stores the payload raw, codec 1 as one zstd frame. Encoding keeps
// a chunk raw when zstd saves less than 1/32 of it, so incompressible memory
// costs no decompression on read. Thread-safe: each thread keeps its own
// zstd contexts.
#ifndef GPUCKPT_CORE_STORE_CHUNK_CODEC_H_
#define GPUCKPT_CORE_STORE_CHUNK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Appends the record for `data` to `*record` (which it clears first).
void EncodeChunkRecord(const uint8_t* data, size_t len, int zstd_level, std::string* record);

// Decodes `record` into `*out`. kCorruption on any inconsistency (unknown
// version or codec, bad length, zstd error); `what` names the chunk in the
// message.
Status DecodeChunkRecord(std::string_view record, std::string_view what, std::string* out);

// The raw length a record declares, without decoding it.
Result<uint64_t> ChunkRecordRawLength(std::string_view record);

// Chunk meta records (column family chunk_meta):
//   meta := version:u8 raw_length:varint64 stored_length:varint64
struct ChunkMeta {
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
