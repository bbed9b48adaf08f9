#include "core/base/full_io.h"

#include <unistd.h>

#include <cerrno>

namespace gpuckpt {

Status PwriteFully(int fd, const char* data, size_t len, uint64_t offset, const std::string& what) {
  while (len > 0) {
    const ssize_t n = pwrite(fd, data, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "writing " + what);
    }
    data += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

}  // namespace gpuckpt
