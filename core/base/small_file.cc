#include "core/base/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/base/unique_fd.h"

namespace gpuckpt {

Result<std::string> ReadSmallFileNoFollow(const std::string& path, size_t max_bytes) {
  UniqueFd owned(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  const int fd = owned.get();
  if (fd < 0) {
    if (errno == ELOOP) return Status::InvalidArgument(path + " is a symlink");
    return StatusFromErrno(errno, "open " + path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return StatusFromErrno(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::Corruption(path + " is larger than " + std::to_string(max_bytes) + " bytes");
  }
  std::string text;
  char buf[16 * 1024];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "read " + path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      return Status::Corruption(path + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  return text;
}

}  // namespace gpuckpt
