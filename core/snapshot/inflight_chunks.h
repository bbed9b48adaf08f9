// InflightChunks: chunks that some snapshot writer has decided to store but
// whose record is not in RocksDB yet. A writer that meets such a chunk in
// its own data knows it will be stored and writes only the extent, so a
// chunk is written once even when it repeats within one import. Bounded by
// the chunks in flight, not by the size of the import.
//
// Thread-safe.
#ifndef GPUCKPT_CORE_SNAPSHOT_INFLIGHT_CHUNKS_H_
#define GPUCKPT_CORE_SNAPSHOT_INFLIGHT_CHUNKS_H_

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "core/store/chunk_hash.h"

namespace gpuckpt {

class InflightChunks {
 public:
  enum class Claim { kClaimed, kOwnedBySameWriter, kOwnedByOtherWriter };

  Claim TryClaim(const ChunkHash& hash, uint64_t writer_id) {
    std::lock_guard lock(mu_);
    auto [it, inserted] = owners_.try_emplace(hash, writer_id);
    if (inserted) return Claim::kClaimed;
    return it->second == writer_id ? Claim::kOwnedBySameWriter : Claim::kOwnedByOtherWriter;
  }

  void Release(const ChunkHash& hash) {
    std::lock_guard lock(mu_);
    owners_.erase(hash);
  }

 private:
  std::mutex mu_;
  std::unordered_map<ChunkHash, uint64_t, ChunkHashHasher> owners_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_INFLIGHT_CHUNKS_H_
