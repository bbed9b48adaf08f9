#include "core/store/chunker.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <string>

#include "core/store/format.h"

namespace gpuckpt {
namespace {

// The gear table is part of the format in effect: changing it changes every
// boundary and so what later checkpoints can share with earlier ones. It is
// generated from a fixed seed (splitmix64) rather than listed.
constexpr std::array<uint64_t, 256> MakeGearTable() {
  std::array<uint64_t, 256> table{};
  uint64_t state = 0x6770756b63707431ull;  // "gpuckpt1"
  for (auto& entry : table) {
    state += 0x9e3779b97f4a7c15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    entry = z ^ (z >> 31);
  }
  return table;
}
constexpr std::array<uint64_t, 256> kGear = MakeGearTable();

constexpr size_t kWindow = 64;  // bytes a 64-bit gear fingerprint depends on

// A mask of the `bits` most significant bits: in a gear hash the high bits
// depend on the most bytes of the window, the low bits on the last few only.
constexpr uint64_t TopBits(int bits) {
  bits = std::clamp(bits, 1, 63);
  return ~uint64_t{0} << (64 - bits);
}

// Fingerprint of an aligned candidate: a hash of the whole unit (page)
// before it. A gear hash of the last 64 bytes would do for most data, but
// memory is full of pages that end in zeros (sparse structs, zero-padded
// buffers); hashing the whole page keeps boundaries content-defined there
// too, so a change in such a region costs an average chunk, not a maximal
// one. XXH3 hashes a page in about 100 ns.
inline uint64_t UnitFingerprint(const uint8_t* end, size_t unit) {
  return XXH3_64bits(end - unit, unit);
}

}  // namespace

Result<Chunker> Chunker::Create(const ChunkSizes& s, uint32_t alignment) {
  auto invalid = [&](const std::string& why) {
    return Status::InvalidArgument("chunk sizes " + std::to_string(s.min_size) + "/" +
                                   std::to_string(s.avg_size) + "/" + std::to_string(s.max_size) +
                                   " (alignment " + std::to_string(alignment) + "): " + why);
  };
  if (alignment == 0 || !std::has_single_bit(alignment))
    return invalid("alignment must be a power of two");
  if (!(s.min_size <= s.avg_size && s.avg_size <= s.max_size))
    return invalid("need min <= avg <= max");
  if (s.min_size < kWindow) return invalid("min must be at least 64 bytes");
  if (!std::has_single_bit(s.avg_size)) return invalid("avg must be a power of two");
  if (s.max_size > format::kMaxChunkSize) return invalid("max is above the 64 MiB limit");
  if (s.min_size % alignment || s.avg_size % alignment || s.max_size % alignment)
    return invalid("sizes must be multiples of the alignment");
  if (alignment > 1 && s.avg_size / alignment < 2)
    return invalid("avg must be at least two alignment units");
  return Chunker(s, alignment);
}

Chunker::Chunker(const ChunkSizes& sizes, uint32_t alignment)
    : sizes_(sizes), alignment_(alignment) {
  // Normalized chunking: a stricter mask before the average size and a
  // looser one after it pull chunk sizes towards the average. Rolling mode
  // uses FastCDC's level 2; aligned mode has few candidates per chunk
  // (avg/alignment), where level 1 keeps the average near the target.
  if (alignment == 1) {
    const int bits = std::countr_zero(sizes.avg_size);
    mask_small_ = TopBits(bits + 2);
    mask_large_ = TopBits(bits - 2);
  } else {
    // One threshold, no normalization: each page boundary is judged on the
    // page before it alone. A stricter-then-looser rule makes where a chunk
    // ends depend on where it started, so one changed page could move the
    // boundaries after it for several chunks; without it a changed or
    // inserted page costs the chunks it touches and no more. XXH3's bits
    // are all equally good; take the low ones.
    const int bits = std::countr_zero(sizes.avg_size / alignment);
    mask_small_ = mask_large_ = (uint64_t{1} << bits) - 1;
  }
}

size_t Chunker::NextChunkLength(const uint8_t* data, size_t len, uint64_t file_offset,
                                bool at_eof) const {
  if (len == 0) return 0;
  if (len <= sizes_.min_size) return at_eof ? len : 0;
  const size_t cut = alignment_ == 1 ? CutRolling(data, len) : CutAligned(data, len, file_offset);
  if (cut != 0) return cut;
  return at_eof ? len : 0;
}

size_t Chunker::CutRolling(const uint8_t* data, size_t len) const {
  const size_t limit = std::min<size_t>(len, sizes_.max_size);
  const size_t normal = std::min<size_t>(limit, sizes_.avg_size);
  // Cut-point skipping: nothing before min_size can be a boundary, so hashing
  // starts one window earlier (the fingerprint then equals a full roll).
  size_t i = sizes_.min_size - kWindow;
  uint64_t fp = 0;
  for (; i < sizes_.min_size; ++i) fp = (fp << 1) + kGear[data[i]];
  for (; i < normal; ++i) {
    if ((fp & mask_small_) == 0) return i;
    fp = (fp << 1) + kGear[data[i]];
  }
  for (; i < limit; ++i) {
    if ((fp & mask_large_) == 0) return i;
    fp = (fp << 1) + kGear[data[i]];
  }
  if (limit == sizes_.max_size) return limit;
  return 0;
}

size_t Chunker::CutAligned(const uint8_t* data, size_t len, uint64_t file_offset) const {
  const size_t limit = std::min<size_t>(len, sizes_.max_size);
  const size_t normal = std::min<size_t>(limit, sizes_.avg_size);
  const uint64_t mask = alignment_ - 1;
  // First candidate length at or after min_size that ends on an aligned
  // file offset.
  size_t candidate =
      sizes_.min_size + ((alignment_ - ((file_offset + sizes_.min_size) & mask)) & mask);
  for (; candidate < limit; candidate += alignment_) {
    const uint64_t fp = UnitFingerprint(data + candidate, alignment_);
    if ((fp & (candidate < normal ? mask_small_ : mask_large_)) == 0) return candidate;
  }
  if (limit == sizes_.max_size) return limit;
  return 0;
}

}  // namespace gpuckpt
