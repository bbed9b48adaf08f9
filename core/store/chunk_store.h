// ChunkStore: reads and checks chunks of the chunks column family.
//
// Reading a chunk fetches its record, decodes it and (when verifying)
// re-hashes the bytes: a chunk whose bytes do not match its name is
// kCorruption, never returned. Writes are not here: the snapshot writer
// batches chunk records together with its extents.
//
// Thread-safe. Borrows the StoreDb and the ChunkCache, which must outlive it.
#ifndef GPUCKPT_CORE_STORE_CHUNK_STORE_H_
#define GPUCKPT_CORE_STORE_CHUNK_STORE_H_

#include <memory>
#include <string>

#include "core/store/chunk_cache.h"
#include "core/store/chunk_hash.h"
#include "core/store/store_db.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

class ChunkStore {
 public:
  ChunkStore(StoreDb* db, ChunkCache* cache, bool verify_on_read)
      : db_(db), cache_(cache), verify_(verify_on_read) {}

  // Whether a chunk named `hash` is stored.
  Result<bool> Contains(const ChunkHash& hash) const;

  // The raw bytes of chunk `hash`, which must be `expected_len` long
  // (from the extent that names it). Served from the cache when there.
  Result<std::shared_ptr<const std::string>> Read(const ChunkHash& hash,
                                                  uint64_t expected_len) const;

  // Decodes and re-hashes a stored record regardless of verify_on_read
  // (fsck). Returns the raw length.
  static Result<uint64_t> Check(const ChunkHash& hash, std::string_view record);

  ChunkCache* cache() const { return cache_; }

 private:
  StoreDb* db_;
  ChunkCache* cache_;
  bool verify_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_STORE_H_
