// Chunker: finds content-defined chunk boundaries (FastCDC, normalized
// chunking, gear hash).
//
// The fingerprint at a position is a function of the bytes just before it
// only, so equal content gives equal boundaries wherever it sits: the 64
// bytes before it (a rolling 64-bit gear hash shifts older bytes out), or,
// with `alignment` > 1, the whole aligned unit (page) before it. In aligned
// mode only offsets that are multiples of the alignment (in the file, not
// in the chunk) are candidates.
//
// A Chunker is a value with no state beyond its parameters: safe to share
// between threads.
#ifndef GPUCKPT_CORE_STORE_CHUNKER_H_
#define GPUCKPT_CORE_STORE_CHUNKER_H_

#include <cstddef>
#include <cstdint>

#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

class Chunker {
 public:
  // Checks the sizes (min <= avg <= max, avg a power of two, all multiples
  // of alignment, max <= format::kMaxChunkSize).
  static Result<Chunker> Create(const ChunkSizes& sizes, uint32_t alignment);

  // Length of the next chunk of `data`, which starts at file offset
  // `file_offset`. `at_eof` says `data` runs to the end of the file. Returns
  // 0 when more data is needed to decide (only when !at_eof and
  // len < max_size).
  size_t NextChunkLength(const uint8_t* data, size_t len, uint64_t file_offset, bool at_eof) const;

  uint32_t max_size() const { return sizes_.max_size; }

 private:
  Chunker(const ChunkSizes& sizes, uint32_t alignment);
  size_t CutRolling(const uint8_t* data, size_t len) const;
  size_t CutAligned(const uint8_t* data, size_t len, uint64_t file_offset) const;

  ChunkSizes sizes_;
  uint32_t alignment_;
  uint64_t mask_small_;  // stricter, before avg_size
  uint64_t mask_large_;  // looser, after avg_size
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNKER_H_
