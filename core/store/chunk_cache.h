// ChunkCache: a bounded LRU of decompressed, verified chunks shared by all
// readers of a store, so that small reads of one chunk (FUSE reads are 128
// KiB at most) decompress and hash it once.
//
// Thread-safe (one mutex; never held while decompressing or doing I/O).
// Values are shared_ptrs: a chunk evicted while a reader uses it stays alive
// until that reader lets go.
#ifndef GPUCKPT_CORE_STORE_CHUNK_CACHE_H_
#define GPUCKPT_CORE_STORE_CHUNK_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/base/mutex.h"
#include "core/store/chunk_hash.h"

namespace gpuckpt {

class ChunkCache {
 public:
  explicit ChunkCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  std::shared_ptr<const std::string> Lookup(const ChunkHash& hash) EXCLUDES(mu_);
  void Insert(const ChunkHash& hash, std::shared_ptr<const std::string> data) EXCLUDES(mu_);
  void Erase(const ChunkHash& hash) EXCLUDES(mu_);

  uint64_t hits() const EXCLUDES(mu_);
  uint64_t misses() const EXCLUDES(mu_);
  uint64_t bytes() const EXCLUDES(mu_);

 private:
  struct Entry {
    ChunkHash hash;
    std::shared_ptr<const std::string> data;
  };
  const uint64_t capacity_;
  mutable Mutex mu_;
  std::list<Entry> lru_ GUARDED_BY(mu_);  // front: most recent
  std::unordered_map<ChunkHash, std::list<Entry>::iterator, ChunkHashHasher> index_ GUARDED_BY(mu_);
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
  uint64_t hits_ GUARDED_BY(mu_) = 0;
  uint64_t misses_ GUARDED_BY(mu_) = 0;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_CACHE_H_
