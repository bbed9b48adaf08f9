// Fixed-width big-endian integers in byte strings: the order RocksDB's
// bytewise comparator sorts keys in is then numeric order, and the pool's
// records read the same on every machine. Pure functions; thread-safe.
#ifndef GPUCKPT_CORE_BASE_BIG_ENDIAN_H_
#define GPUCKPT_CORE_BASE_BIG_ENDIAN_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace gpuckpt {

// Appends the low `bytes` bytes of `v` to `dst`, most significant first.
inline void PutBigEndian(std::string* dst, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) dst->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// The integer in the first `bytes` bytes of `src`, which must hold them.
inline uint64_t GetBigEndian(std::string_view src, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(src[i]);
  return v;
}

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_BIG_ENDIAN_H_
