// ChunkHash: the name of a chunk: the SHA-256 of its raw bytes in the
// store-wide shared dedup domain, SHA-256(domain key || raw bytes) in the
// domain of one owner (SnapshotSpec::dedup_domain).
//
// Keyed names keep dedup from crossing owners: the same bytes get another
// name in every domain, so whether a chunk is new says nothing about what
// other owners stored. The key is a secret of the store (derived from its
// seed, FORMAT.md), so nobody without the store can compute a domain's
// names. Prefixing 32 bytes costs one more SHA-256 block per chunk (0.4% of
// a 16 KiB chunk); length extension does not matter here, since a name is
// never shown to anyone who could not read the store anyway.
//
// SHA-256 through OpenSSL's EVP interface, which uses the CPU's SHA
// extensions where present. HashChunk() is safe to call from any thread
// (each thread keeps its own digest context); ChunkDomainKey is a plain
// value.
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

// The secret that keys chunk names within one owner's dedup domain.
struct ChunkDomainKey {
  std::array<uint8_t, format::kChunkHashSize> bytes{};
  bool operator==(const ChunkDomainKey&) const = default;
};

// The key of domain `uid` in the store whose seed is `seed`:
// SHA-256(kChunkDomainLabel || seed || uid as 4 big-endian bytes).
ChunkDomainKey DeriveChunkDomainKey(std::string_view seed, uint32_t uid);

// The name of a chunk: SHA-256(data) when `domain` is null (the shared
// domain), SHA-256(domain->bytes || data) otherwise.
ChunkHash HashChunk(const uint8_t* data, size_t len, const ChunkDomainKey* domain = nullptr);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_HASH_H_
