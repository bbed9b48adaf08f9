#include "core/store/store_env.h"

#include <fcntl.h>
#include <unistd.h>

namespace gpuckpt {

int PackFileOps::CreateExclusive(int dir_fd, const char* name, mode_t mode) {
  return openat(dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
}

ssize_t PackFileOps::Pwrite(int fd, const void* data, size_t len, off_t offset) {
  return pwrite(fd, data, len, offset);
}

int PackFileOps::Fdatasync(int fd) { return fdatasync(fd); }

int PackFileOps::FsyncDirectory(int dir_fd) { return fsync(dir_fd); }

int PackFileOps::Unlink(int dir_fd, const char* name) { return unlinkat(dir_fd, name, 0); }

int PackFileOps::PunchHole(int fd, off_t offset, off_t len) {
  return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len);
}

PackFileOps* PackFileOps::System() {
  static PackFileOps* const system = new PackFileOps();
  return system;
}

}  // namespace gpuckpt
