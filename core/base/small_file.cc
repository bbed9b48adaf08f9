#include "core/base/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/base/unique_fd.h"

namespace gpuckpt {

Result<std::string> ReadSmallFileNoFollow(const std::string& path, size_t max_bytes) {
  return ReadSmallFileNoFollowAt(AT_FDCWD, path, SmallFileRead(path, max_bytes));
}

Result<std::string> ReadSmallFileNoFollowAt(int dir_fd, const std::string& name,
                                            const SmallFileRead& how) {
  const std::string& shown = how.shown;
  UniqueFd fd(
      openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) {
    if (errno == ELOOP) return Status::InvalidArgument(shown + " is a symlink");
    return StatusFromErrno(errno, "open " + shown);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return StatusFromErrno(errno, "stat " + shown);
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(shown + " is not a regular file");
  if (how.owner && st.st_uid != *how.owner)
    return Status::PermissionDenied(shown + " belongs to uid " + std::to_string(st.st_uid));
  auto too_large = [&](uint64_t size) {
    return Status(how.too_large, shown + " is too large (" + std::to_string(size) +
                                     " bytes; at most " + std::to_string(how.max_bytes) +
                                     " are read)");
  };
  if (static_cast<uint64_t>(st.st_size) > how.max_bytes) return too_large(st.st_size);
  std::string text;
  char buf[16 * 1024];
  while (true) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "read " + shown);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > how.max_bytes) return too_large(text.size());
  }
  return text;
}

}  // namespace gpuckpt
