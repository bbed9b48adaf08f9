// BlockPool: fixed-size memory blocks for data in flight (a snapshot
// writer's staging memory), mapped straight from the kernel, aligned for
// transparent huge pages, and reused once their last user lets go.
//
// Why not malloc: a block is a few MiB. Fresh memory costs a page fault and
// a clear per 4 KiB page, which a writer draining CRIU's pipes would pay
// while the frozen process waits; Prefault() pays it up front, in 2 MiB
// pages where the kernel allows. And unmapped blocks go back to the system
// at once, where malloc's arenas would keep them after a large checkpoint.
//
// Thread-safe. Blocks handed out keep the pool alive (they hold a
// shared_ptr to its state), so a block may outlive the BlockPool object.
#ifndef GPUCKPT_CORE_BASE_BLOCK_POOL_H_
#define GPUCKPT_CORE_BASE_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace gpuckpt {

class BlockPool {
 public:
  // Blocks of `block_size` bytes (rounded up to 2 MiB); at most `keep`
  // returned blocks are kept for reuse, the rest are unmapped.
  BlockPool(size_t block_size, size_t keep);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  size_t block_size() const;

  // Maps and faults in up to `count` blocks (no more than `keep` are held
  // free), ready for Get(). Best effort: stops quietly when memory is short.
  void Prefault(size_t count);

  // A block, reused or newly mapped; returned to the pool when the last
  // copy of the pointer goes. Its contents are undefined. nullptr when the
  // system has no memory left.
  std::shared_ptr<uint8_t[]> Get();

  // Blocks mapped now, free or in use (for tests and reports).
  size_t mapped_blocks() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_BLOCK_POOL_H_
