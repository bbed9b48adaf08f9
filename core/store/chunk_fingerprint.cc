#include "core/store/chunk_fingerprint.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#define XXH_STATIC_LINKING_ONLY  // XXH3_generateSecret
#include <xxhash.h>

namespace gpuckpt {

Result<ChunkFingerprint> ChunkFingerprint::FromBytes(std::string_view raw) {
  if (raw.size() != format::kFingerprintSize) {
    return Status::Corruption("chunk fingerprint of " + std::to_string(raw.size()) +
                              " bytes, expected " + std::to_string(format::kFingerprintSize));
  }
  ChunkFingerprint f;
  std::memcpy(f.bytes.data(), raw.data(), raw.size());
  return f;
}

Result<FingerprintKey> FingerprintKey::FromSeed(std::string_view seed) {
  if (seed.size() != format::kFingerprintSeedSize) {
    return Status::Corruption("fingerprint seed of " + std::to_string(seed.size()) +
                              " bytes, expected " + std::to_string(format::kFingerprintSeedSize));
  }
  FingerprintKey key;
  static_assert(sizeof(key.secret_) >= XXH3_SECRET_SIZE_MIN);
  if (XXH3_generateSecret(key.secret_.data(), key.secret_.size(), seed.data(), seed.size()) !=
      XXH_OK) {
    return Status::Internal("XXH3 refused to derive a fingerprint secret");
  }
  return key;
}

Result<std::string> FingerprintKey::NewSeed() {
  std::string seed(format::kFingerprintSeedSize, '\0');
  size_t got = 0;
  while (got < seed.size()) {
    const ssize_t n = getrandom(seed.data() + got, seed.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "reading random bytes for the fingerprint seed");
    }
    got += static_cast<size_t>(n);
  }
  return seed;
}

ChunkFingerprint FingerprintKey::Of(const uint8_t* data, size_t len) const {
  const XXH128_hash_t h = XXH3_128bits_withSecret(data, len, secret_.data(), secret_.size());
  ChunkFingerprint f;
  // Little-endian, low half first, like the chunk records' checksum.
  for (int i = 0; i < 8; ++i) {
    f.bytes[i] = static_cast<uint8_t>(h.low64 >> (8 * i));
    f.bytes[8 + i] = static_cast<uint8_t>(h.high64 >> (8 * i));
  }
  return f;
}

}  // namespace gpuckpt
