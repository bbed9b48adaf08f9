#include "core/store/chunk_hash.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/base/hex.h"

namespace gpuckpt {
namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

const EVP_MD* Sha256() {
  // Fetched once: a per-call implicit fetch costs more than hashing a small
  // chunk.
  static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (md == nullptr) std::abort();  // OpenSSL without SHA-256 cannot happen on a sane system
  return md;
}

// SHA-256 of `prefix` followed by `data`.
ChunkHash Sha256Of(std::string_view prefix, const uint8_t* data, size_t len) {
  thread_local std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  ChunkHash out;
  unsigned int out_len = 0;
  if (!ctx || EVP_DigestInit_ex(ctx.get(), Sha256(), nullptr) != 1 ||
      (!prefix.empty() && EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size()) != 1) ||
      EVP_DigestUpdate(ctx.get(), data, len) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), out.bytes.data(), &out_len) != 1 ||
      out_len != out.bytes.size()) {
    std::abort();  // only fails on allocation failure inside OpenSSL
  }
  return out;
}

}  // namespace

ChunkDomainKey DeriveChunkDomainKey(std::string_view seed, uint32_t uid) {
  // Fixed-length fields after a label of its own, so that no other use of
  // the seed (the fingerprint secret) and no other uid can give this input.
  std::string input(format::kChunkDomainLabel);
  input.append(seed);
  for (int shift = 24; shift >= 0; shift -= 8) input.push_back(static_cast<char>(uid >> shift));
  const ChunkHash h = Sha256Of({}, reinterpret_cast<const uint8_t*>(input.data()), input.size());
  ChunkDomainKey key;
  key.bytes = h.bytes;
  return key;
}

ChunkHash HashChunk(const uint8_t* data, size_t len, const ChunkDomainKey* domain) {
  if (domain == nullptr) return Sha256Of({}, data, len);
  return Sha256Of({reinterpret_cast<const char*>(domain->bytes.data()), domain->bytes.size()}, data,
                  len);
}

std::string ChunkHash::Hex() const { return LowerHex(view()); }

Result<ChunkHash> ChunkHash::FromBytes(std::string_view raw) {
  if (raw.size() != format::kChunkHashSize) {
    return Status::Corruption("chunk hash of " + std::to_string(raw.size()) +
                              " bytes, expected 32");
  }
  ChunkHash h;
  std::memcpy(h.bytes.data(), raw.data(), raw.size());
  return h;
}

}  // namespace gpuckpt
