// PwriteFully: writes all of a buffer at an offset, across short writes and
// EINTR. Stateless; safe from any thread (each call writes its own range).
#ifndef GPUCKPT_CORE_BASE_FULL_IO_H_
#define GPUCKPT_CORE_BASE_FULL_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Writes `len` bytes of `data` at `offset` of `fd`; errors say "writing
// <what>".
Status PwriteFully(int fd, const char* data, size_t len, uint64_t offset, const std::string& what);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_FULL_IO_H_
