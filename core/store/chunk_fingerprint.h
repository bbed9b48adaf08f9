// ChunkFingerprint: a fast keyed digest of a chunk's raw bytes, used to
// recognise a chunk that has not changed since the snapshot a new one is
// based on, without computing its SHA-256 name.
//
// A fingerprint is XXH3-128 under a secret derived from the store's own
// random seed (kept in the store, which only its owner can read). XXH3 is
// about twenty times faster than SHA-256 but not cryptographic, so a
// fingerprint never names a chunk and is never compared across owners: it
// only says "this chunk is the one the same owner's base snapshot held at
// this offset", and the secret keeps even that owner from choosing two
// inputs that collide.
//
// FingerprintKey is an immutable value: safe to share between threads.
#ifndef GPUCKPT_CORE_STORE_CHUNK_FINGERPRINT_H_
#define GPUCKPT_CORE_STORE_CHUNK_FINGERPRINT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/store/format.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

struct ChunkFingerprint {
  std::array<uint8_t, format::kFingerprintSize> bytes{};

  std::string_view view() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
  // Reads a fingerprint from its raw 16-byte form; kCorruption when the size
  // is wrong.
  static Result<ChunkFingerprint> FromBytes(std::string_view raw);

  bool operator==(const ChunkFingerprint&) const = default;
};

class FingerprintKey {
 public:
  // Derives the key from a store's seed (format::kFingerprintSeedSize
  // bytes); kCorruption for a seed of another size.
  static Result<FingerprintKey> FromSeed(std::string_view seed);
  // kFingerprintSeedSize bytes from the kernel's random source.
  static Result<std::string> NewSeed();

  ChunkFingerprint Of(const uint8_t* data, size_t len) const;

 private:
  FingerprintKey() = default;
  // XXH3's recommended secret size (XXH3_SECRET_DEFAULT_SIZE).
  std::array<uint8_t, 192> secret_{};
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_FINGERPRINT_H_
