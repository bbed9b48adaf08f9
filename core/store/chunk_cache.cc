#include "core/store/chunk_cache.h"

namespace gpuckpt {

std::shared_ptr<const std::string> ChunkCache::Lookup(const ChunkHash& hash) {
  MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->data;
}

void ChunkCache::Insert(const ChunkHash& hash, std::shared_ptr<const std::string> data) {
  if (capacity_ == 0 || data->size() > capacity_) return;
  MutexLock lock(&mu_);
  if (index_.count(hash) != 0) return;
  bytes_ += data->size();
  lru_.push_front(Entry{hash, std::move(data)});
  index_[hash] = lru_.begin();
  while (bytes_ > capacity_ && !lru_.empty()) {
    bytes_ -= lru_.back().data->size();
    index_.erase(lru_.back().hash);
    lru_.pop_back();
  }
}

void ChunkCache::Erase(const ChunkHash& hash) {
  MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  bytes_ -= it->second->data->size();
  lru_.erase(it->second);
  index_.erase(it);
}

uint64_t ChunkCache::hits() const {
  MutexLock lock(&mu_);
  return hits_;
}
uint64_t ChunkCache::misses() const {
  MutexLock lock(&mu_);
  return misses_;
}
uint64_t ChunkCache::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace gpuckpt
