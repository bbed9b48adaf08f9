#include "core/store/store_env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace gpuckpt {

int StoreFileOps::CreateExclusive(int dir_fd, const char* name, mode_t mode) {
  return openat(dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
}

ssize_t StoreFileOps::Pwrite(int fd, const void* data, size_t len, off_t offset) {
  return pwrite(fd, data, len, offset);
}

ssize_t StoreFileOps::SpliceFromPipe(int pipe_fd, int fd, off_t offset, size_t len) {
  loff_t out = offset;
  return splice(pipe_fd, nullptr, fd, &out, len, SPLICE_F_MOVE | SPLICE_F_MORE);
}

int StoreFileOps::Fdatasync(int fd) { return fdatasync(fd); }

int StoreFileOps::FsyncDirectory(int dir_fd) { return fsync(dir_fd); }

int StoreFileOps::Unlink(int dir_fd, const char* name) { return unlinkat(dir_fd, name, 0); }

int StoreFileOps::PunchHole(int fd, off_t offset, off_t len) {
  return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len);
}

int StoreFileOps::MakeDirectory(const char* path, mode_t mode) { return mkdir(path, mode); }

int StoreFileOps::SyncDirectory(const char* path) {
  const int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  const int r = fsync(fd);
  const int err = errno;
  close(fd);
  errno = err;
  return r;
}

StoreFileOps* StoreFileOps::System() {
  static StoreFileOps* const system = new StoreFileOps();
  return system;
}

}  // namespace gpuckpt
