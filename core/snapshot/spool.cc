#include "core/snapshot/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/store/store_db.h"

namespace gpuckpt {
namespace {

constexpr char kSpoolDir[] = "spool";
constexpr char kSuffix[] = ".spool";
// Bytes moved per splice or read: large enough that system calls do not
// show, small enough to answer a cancel quickly.
constexpr size_t kMoveBytes = 4u << 20;
// Writeback is started every this many bytes.
constexpr uint64_t kWritebackBytes = 32u << 20;

bool IsPipe(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

}  // namespace

Result<std::unique_ptr<Spool>> Spool::Open(const std::string& store_dir, StoreFileOps* ops,
                                           bool create) {
  const std::string dir = store_dir + "/" + kSpoolDir;
  UniqueFd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (dir_fd.get() < 0 && errno == ENOENT && create) {
    if (ops->MakeDirectory(dir.c_str(), 0700) != 0 && errno != EEXIST)
      return OnStoreDisk(StatusFromErrno(errno, "creating " + dir));
    if (ops->SyncDirectory(store_dir.c_str()) != 0)
      return OnStoreDisk(StatusFromErrno(errno, "syncing " + store_dir));
    dir_fd = UniqueFd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  }
  if (dir_fd.get() < 0 && !(errno == ENOENT && !create))
    return StatusFromErrno(errno, "opening " + dir);
  return std::unique_ptr<Spool>(new Spool(dir, std::move(dir_fd), ops));
}

std::string Spool::FileName(uint64_t key, uint32_t index) {
  char name[64];
  std::snprintf(name, sizeof name, "%016" PRIx64 "-%08" PRIx32 "%s", key, index, kSuffix);
  return name;
}

Result<UniqueFd> Spool::Create(uint64_t key, uint32_t index) const {
  if (dir_fd_.get() < 0) return Status::Internal("the store has no spool directory");
  const std::string name = FileName(key, index);
  UniqueFd fd(ops_->CreateExclusive(dir_fd_.get(), name.c_str(), 0600));
  if (fd.get() < 0) return OnStoreDisk(StatusFromErrno(errno, "creating " + dir_ + "/" + name));
  return fd;
}

Result<uint64_t> Spool::Receive(int src, int dst, const std::function<bool()>& cancelled) const {
  bool pipe = IsPipe(src);
  std::unique_ptr<char[]> buf;
  uint64_t at = 0;
  uint64_t written_back = 0;
  for (;;) {
    if (cancelled && cancelled()) return Status::Cancelled("cancelled");
    ssize_t n;
    if (pipe) {
      n = ops_->SpliceFromPipe(src, dst, static_cast<off_t>(at), kMoveBytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && at == 0) {
        pipe = false;  // a filesystem that takes no splice: read and write
        continue;
      }
      if (n < 0) return OnStoreDisk(StatusFromErrno(errno, "spooling"));
    } else {
      if (!buf) buf = std::make_unique<char[]>(kMoveBytes);
      n = read(src, buf.get(), kMoveBytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return StatusFromErrno(errno, "reading a file to spool");
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = ops_->Pwrite(dst, buf.get() + done, static_cast<size_t>(n - done),
                                       static_cast<off_t>(at) + done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return OnStoreDisk(StatusFromErrno(w < 0 ? errno : EIO, "spooling"));
        done += w;
      }
    }
    if (n == 0) return at;
    at += static_cast<uint64_t>(n);
    if (at - written_back >= kWritebackBytes) {
      // Best effort: only a hint to start writing now.
      sync_file_range(dst, static_cast<off_t>(written_back), static_cast<off_t>(at - written_back),
                      SYNC_FILE_RANGE_WRITE);
      written_back = at;
    }
  }
}

Status Spool::Sync(int fd) const {
  if (ops_->Fdatasync(fd) != 0) return OnStoreDisk(StatusFromErrno(errno, "syncing a spool file"));
  return Status::Ok();
}

Status Spool::SyncDirectory() const {
  if (dir_fd_.get() < 0) return Status::Ok();
  if (ops_->FsyncDirectory(dir_fd_.get()) != 0)
    return OnStoreDisk(StatusFromErrno(errno, "syncing " + dir_));
  return Status::Ok();
}

Result<UniqueFd> Spool::OpenForReading(uint64_t key, uint32_t index) const {
  const std::string name = FileName(key, index);
  if (dir_fd_.get() < 0) return Status::NotFound("no spool file " + name);
  UniqueFd fd(openat(dir_fd_.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return StatusFromErrno(errno, "opening " + dir_ + "/" + name);
  return fd;
}

Status Spool::Remove(uint64_t key, uint32_t index) const {
  if (dir_fd_.get() < 0) return Status::Ok();
  const std::string name = FileName(key, index);
  if (ops_->Unlink(dir_fd_.get(), name.c_str()) != 0 && errno != ENOENT)
    return StatusFromErrno(errno, "removing " + dir_ + "/" + name);
  return Status::Ok();
}

Result<uint64_t> Spool::Bytes() const {
  GPUCKPT_ASSIGN_OR_RETURN(const auto files, List());
  uint64_t bytes = 0;
  for (const auto& [key, index] : files) {
    struct stat st {};
    // One settled meanwhile is simply gone.
    if (fstatat(dir_fd_.get(), FileName(key, index).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      bytes += static_cast<uint64_t>(st.st_size);
  }
  return bytes;
}

Result<std::vector<std::pair<uint64_t, uint32_t>>> Spool::List() const {
  std::vector<std::pair<uint64_t, uint32_t>> files;
  if (dir_fd_.get() < 0) return files;
  const int fd = dup(dir_fd_.get());
  if (fd < 0) return StatusFromErrno(errno, "listing " + dir_);
  std::unique_ptr<DIR, int (*)(DIR*)> dir(fdopendir(fd), closedir);
  if (!dir) {
    close(fd);
    return StatusFromErrno(errno, "listing " + dir_);
  }
  rewinddir(dir.get());
  while (const dirent* d = readdir(dir.get())) {
    uint64_t key = 0;
    uint32_t index = 0;
    char rest[16] = {};
    // Exactly "<16 hex>-<8 hex>.spool".
    if (std::strlen(d->d_name) != 16 + 1 + 8 + std::strlen(kSuffix) ||
        std::sscanf(d->d_name, "%16" SCNx64 "-%8" SCNx32 "%15s", &key, &index, rest) != 3 ||
        std::string(rest) != kSuffix || FileName(key, index) != d->d_name) {
      continue;
    }
    files.emplace_back(key, index);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace gpuckpt
