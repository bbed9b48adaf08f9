#include "core/base/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "core/base/mutex.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux >= 5.14
#endif

namespace gpuckpt {
namespace {

constexpr size_t kHugePage = 2u << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `size` bytes (a multiple of kHugePage) aligned to kHugePage, so that the
// kernel can back them with huge pages; nullptr when out of memory.
uint8_t* MapBlock(size_t size) {
  const size_t span = size + kHugePage;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = RoundUp(base, kHugePage);
  if (aligned > base) munmap(p, aligned - base);
  const uintptr_t end = base + span;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  auto* block = reinterpret_cast<uint8_t*>(aligned);
  madvise(block, size, MADV_HUGEPAGE);  // a hint; refused where THP is off
  return block;
}

// Faults every page of the block in now, instead of on first write.
void Populate(uint8_t* block, size_t size) {
  if (madvise(block, size, MADV_POPULATE_WRITE) == 0) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t off = 0; off < size; off += page) block[off] = 0;
}

}  // namespace

struct BlockPool::State {
  size_t block_size = 0;
  size_t keep = 0;
  Mutex mu;
  std::vector<uint8_t*> free GUARDED_BY(mu);
  size_t mapped GUARDED_BY(mu) = 0;

  void Put(uint8_t* block) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      if (free.size() < keep) {
        free.push_back(block);
        return;
      }
      --mapped;
    }
    munmap(block, block_size);
  }

  ~State() {
    for (uint8_t* block : free) munmap(block, block_size);
  }
};

BlockPool::BlockPool(size_t block_size, size_t keep) : state_(std::make_shared<State>()) {
  state_->block_size = RoundUp(block_size == 0 ? 1 : block_size, kHugePage);
  state_->keep = keep;
}

BlockPool::~BlockPool() = default;

size_t BlockPool::block_size() const { return state_->block_size; }

void BlockPool::Prefault(size_t count) {
  for (size_t i = 0; i < count; ++i) {
    {
      MutexLock lock(&state_->mu);
      if (state_->free.size() >= state_->keep) return;
    }
    uint8_t* block = MapBlock(state_->block_size);
    if (block == nullptr) return;
    Populate(block, state_->block_size);
    MutexLock lock(&state_->mu);
    ++state_->mapped;
    state_->free.push_back(block);
  }
}

std::shared_ptr<uint8_t[]> BlockPool::Get() {
  uint8_t* block = nullptr;
  {
    MutexLock lock(&state_->mu);
    if (!state_->free.empty()) {
      block = state_->free.back();
      state_->free.pop_back();
    }
  }
  if (block == nullptr) {
    block = MapBlock(state_->block_size);
    if (block == nullptr) return nullptr;
    MutexLock lock(&state_->mu);
    ++state_->mapped;
  }
  // The deleter holds the state, so a block may outlive the pool object.
  return std::shared_ptr<uint8_t[]>(block, [state = state_](uint8_t* p) { state->Put(p); });
}

size_t BlockPool::mapped_blocks() const {
  MutexLock lock(&state_->mu);
  return state_->mapped;
}

}  // namespace gpuckpt
