// ChunkHash: the name of a chunk, the SHA-256 of its raw bytes.
//
// SHA-256 through OpenSSL's EVP interface, which uses the CPU's SHA
// extensions where present. HashChunk() is safe to call from any thread
// (each thread keeps its own digest context).
#ifndef GPUCKPT_CORE_STORE_CHUNK_HASH_H_
#define GPUCKPT_CORE_STORE_CHUNK_HASH_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/store/format.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

struct ChunkHash {
  std::array<uint8_t, format::kChunkHashSize> bytes{};

  std::string_view view() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
  std::string Hex() const;
  // Reads a hash from its raw 32-byte form; kCorruption when the size is wrong.
  static Result<ChunkHash> FromBytes(std::string_view raw);

  bool operator==(const ChunkHash&) const = default;
};

struct ChunkHashHasher {
  size_t operator()(const ChunkHash& h) const {
    size_t v;
    static_assert(sizeof(v) <= format::kChunkHashSize);
    __builtin_memcpy(&v, h.bytes.data(), sizeof(v));  // already uniformly distributed
    return v;
  }
};

ChunkHash HashChunk(const uint8_t* data, size_t len);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_HASH_H_
