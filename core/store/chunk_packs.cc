#include "core/store/chunk_packs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/base/job_threads.h"
#include "core/base/mutex.h"
#include "core/store/chunk_codec.h"
#include "core/store/format.h"

namespace gpuckpt {
namespace {

// Start writeback of a pack every this many bytes appended, so that the
// disk writes while the checkpoint is still arriving (and Sync() is short).
constexpr uint64_t kWritebackStep = 8ull << 20;

constexpr char kPackMagic[8] = {'G', 'P', 'C', 'K', 'P', 'A', 'C', 'K'};
constexpr uint32_t kPackFormatVersion = 1;
constexpr char kPackSuffix[] = ".pack";

// "<16 hex digits>.pack" -> id; false for anything else (RocksDB's and
// other files never live here, but a stray file must not be taken for a pack).
bool ParsePackName(const char* name, uint64_t* id) {
  if (std::strlen(name) != 16 + sizeof(kPackSuffix) - 1) return false;
  if (std::strcmp(name + 16, kPackSuffix) != 0) return false;
  uint64_t v = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[i];
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *id = v;
  return true;
}

// cachestat(2) (Linux 6.5), which Debian 12's headers predate.
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};
constexpr long kCachestatSyscall = 451;  // the same on every architecture

// Whether every page of [offset, offset + len) of `fd` is in the page
// cache. False where the kernel cannot say (before 6.5): a restore reads
// a checkpoint that was written long ago more often than one just written.
bool AllInPageCache(int fd, uint64_t offset, uint64_t len) {
  constexpr uint64_t kPage = 4096;
  CachestatRange range{offset, len};
  Cachestat stat{};
  if (syscall(kCachestatSyscall, fd, &range, &stat, 0) != 0) return false;
  return stat.nr_cache >= (offset + len + kPage - 1) / kPage - offset / kPage;
}

std::string PackName(uint64_t id) {
  char name[32];
  std::snprintf(name, sizeof(name), "%016" PRIx64 "%s", id, kPackSuffix);
  return name;
}

}  // namespace

struct ChunkPacks::File {
  File(uint64_t id, UniqueFd fd, uint64_t end) : id(id), fd(std::move(fd)), end(end) {}
  ~File() {
    if (const int direct = direct_fd.load(); direct >= 0) close(direct);
  }
  const uint64_t id;
  const UniqueFd fd;
  // O_DIRECT, read only, opened on the first direct read (a store read
  // without them never has one): kNotOpened until then, -1 where it could
  // not be (no direct I/O; the pack removed since, which `fd` still reads).
  static constexpr int kNotOpened = -2;
  std::atomic<int> direct_fd{kNotOpened};
  uint64_t end;  // guarded by ChunkPacks::mu_: the next record's offset (active pack)
};

std::string EncodePackLocation(const PackLocation& location) {
  std::string v(1, static_cast<char>(format::kPackLocationVersion));
  PutVarint64(&v, location.pack);
  PutVarint64(&v, location.offset);
  PutVarint64(&v, location.length);
  return v;
}

bool IsPackLocation(std::string_view value) {
  return !value.empty() && static_cast<uint8_t>(value[0]) == format::kPackLocationVersion;
}

Result<PackLocation> DecodePackLocation(std::string_view value) {
  if (!IsPackLocation(value)) return Status::Corruption("not a pack location record");
  value.remove_prefix(1);
  PackLocation l;
  if (!GetVarint64(&value, &l.pack) || !GetVarint64(&value, &l.offset) ||
      !GetVarint64(&value, &l.length) || l.offset < ChunkPacks::kHeaderSize || l.length == 0 ||
      l.length > format::kMaxChunkSize + 1024) {
    return Status::Corruption("malformed pack location record");
  }
  return l;
}

Result<std::unique_ptr<ChunkPacks>> ChunkPacks::Open(const std::string& dir, StoreFileOps* files) {
  if (files->MakeDirectory(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return StatusFromErrno(errno, "creating " + dir);
  }
  return OpenExisting(dir, files);
}

Result<std::unique_ptr<ChunkPacks>> ChunkPacks::OpenExisting(const std::string& dir,
                                                             StoreFileOps* files) {
  UniqueFd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (dir_fd.get() < 0) return StatusFromErrno(errno, "opening " + dir);
  std::unique_ptr<ChunkPacks> packs(new ChunkPacks(dir, std::move(dir_fd), files, 1));
  GPUCKPT_ASSIGN_OR_RETURN(auto existing, packs->List());
  // Never append to a pack of an earlier run: its tail may be torn.
  if (!existing.empty()) {
    MutexLock lock(&packs->mu_);
    packs->next_id_ = existing.back().id + 1;
  }
  return packs;
}

ChunkPacks::~ChunkPacks() = default;

std::string ChunkPacks::PathOf(uint64_t id) const { return dir_ + "/" + PackName(id); }

Status ChunkPacks::WriteFully(const File& file, const char* data, size_t len,
                              uint64_t offset) const {
  while (len > 0) {
    const ssize_t n = files_->Pwrite(file.fd.get(), data, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "writing pack " + PathOf(file.id));
    }
    data += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status ChunkPacks::StartPackLocked() {
  const uint64_t id = next_id_++;
  const std::string name = PackName(id);
  UniqueFd fd(files_->CreateExclusive(dir_fd_.get(), name.c_str(), 0600));
  if (fd.get() < 0) return StatusFromErrno(errno, "creating pack " + PathOf(id));
  char header[kHeaderSize] = {};
  std::memcpy(header, kPackMagic, sizeof(kPackMagic));
  for (int i = 0; i < 4; ++i)
    header[8 + i] = static_cast<char>((kPackFormatVersion >> (8 * i)) & 0xff);
  auto file = std::make_shared<File>(id, std::move(fd), kHeaderSize);
  GPUCKPT_RETURN_IF_ERROR(WriteFully(*file, header, sizeof(header), 0));
  open_[id] = file;
  active_ = file;
  dirty_.insert(id);
  dir_dirty_ = true;
  return Status::Ok();
}

Result<PackLocation> ChunkPacks::Append(std::string_view record) {
  std::shared_ptr<File> file;
  uint64_t offset = 0;
  {
    MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (!active_ || (active_->end > kHeaderSize && active_->end + record.size() > kTargetSize)) {
      GPUCKPT_RETURN_IF_ERROR(StartPackLocked());
    }
    file = active_;
    offset = file->end;
    file->end += record.size();
  }
  // Outside the lock: appenders write their own ranges side by side.
  GPUCKPT_RETURN_IF_ERROR(WriteFully(*file, record.data(), record.size(), offset));
  const uint64_t end = offset + record.size();
  if (offset / kWritebackStep != end / kWritebackStep) {
    // Best effort: start writing the step just filled; Sync() still waits
    // for all of it.
    const uint64_t step_end = end / kWritebackStep * kWritebackStep;
    sync_file_range(file->fd.get(), static_cast<off_t>(step_end - kWritebackStep),
                    static_cast<off_t>(kWritebackStep), SYNC_FILE_RANGE_WRITE);
  }
  {
    MutexLock lock(&mu_);
    dirty_.insert(file->id);
  }
  return PackLocation{file->id, offset, record.size()};
}

Result<std::shared_ptr<ChunkPacks::File>> ChunkPacks::FileFor(uint64_t id) const {
  {
    MutexLock lock(&mu_);
    auto found = open_.find(id);
    if (found != open_.end()) return found->second;
  }
  // Opened without mu_, which every read and append takes: an open on a
  // busy disk must not stall them. Of two threads opening one pack, the
  // first to put its file in keeps it.
  UniqueFd fd(openat(dir_fd_.get(), PackName(id).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound("pack " + PathOf(id) + " does not exist");
    return StatusFromErrno(errno, "opening pack " + PathOf(id));
  }
  auto file = std::make_shared<File>(id, std::move(fd), 0);
  MutexLock lock(&mu_);
  return open_.emplace(id, std::move(file)).first->second;
}

int ChunkPacks::DirectFdOf(File& file) const {
  const int known = file.direct_fd.load();
  if (known != File::kNotOpened) return known;
  int opened = openat(dir_fd_.get(), PackName(file.id).c_str(),
                      O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
  if (opened < 0) opened = -1;
  int expected = File::kNotOpened;
  if (file.direct_fd.compare_exchange_strong(expected, opened)) return opened;
  if (opened >= 0) close(opened);  // another reader's came first
  return expected;
}

Status ChunkPacks::Read(const PackLocation& location, std::string* out) const {
  out->resize(location.length);
  return ReadRange(location.pack, location.offset, location.length, out->data());
}

Status ChunkPacks::ReadRange(uint64_t pack, uint64_t start, size_t len, char* buf) const {
  GPUCKPT_ASSIGN_OR_RETURN(auto file, FileFor(pack));
  char* data = buf;
  size_t left = len;
  uint64_t offset = start;
  while (left > 0) {
    const ssize_t n = pread(file->fd.get(), data, left, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "reading pack " + PathOf(pack));
    }
    if (n == 0) {
      return Status::Corruption("pack " + PathOf(pack) + " ends at " + std::to_string(offset) +
                                ", records there are " + std::to_string(len) + " bytes at " +
                                std::to_string(start));
    }
    data += n;
    left -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status ChunkPacks::ReadRangeDirect(uint64_t pack, uint64_t start, size_t len, char* buf) const {
  GPUCKPT_ASSIGN_OR_RETURN(auto file, FileFor(pack));
  const int direct_fd = DirectFdOf(*file);
  if (direct_fd < 0 || AllInPageCache(file->fd.get(), start, len)) {
    return ReadRange(pack, start, len, buf);
  }
  const uint64_t head = start % kDirectAlign;
  const uint64_t end = start + len;
  char* data = buf - head;
  uint64_t offset = start - head;
  while (offset < end) {
    const ssize_t n =
        pread(direct_fd, data, DirectSpan(offset, end - offset), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    // EINVAL: blocks larger than kDirectAlign; a short read: the end of
    // the file (or an interrupted one). The rest through the cache, which
    // says what is wrong, if anything.
    if (n <= 0 || static_cast<uint64_t>(n) % kDirectAlign != 0) {
      if (n < 0 && errno != EINVAL) return StatusFromErrno(errno, "reading pack " + PathOf(pack));
      const uint64_t from =
          std::max(offset + static_cast<uint64_t>(std::max<ssize_t>(n, 0)), start);
      if (from >= end) return Status::Ok();
      return ReadRange(pack, from, static_cast<size_t>(end - from), buf + (from - start));
    }
    data += n;
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

void ChunkPacks::ReadAhead(uint64_t pack, uint64_t offset, uint64_t len) const {
  auto file = FileFor(pack);
  if (!file.ok()) return;
  posix_fadvise((*file)->fd.get(), static_cast<off_t>(offset), static_cast<off_t>(len),
                POSIX_FADV_WILLNEED);
}

namespace {

// ReadAheadLater()'s requests, made on a thread of their own: asking the
// kernel for 16 MiB allocates and queues thousands of pages (15% of the
// daemon's CPU in a lazy restore), which a reader waiting for its own bytes
// (a page fault of a lazily restored tree) should not wait for. Hints:
// when 64 wait, a new one is dropped. Made on first use and never
// destroyed (its thread may still be asking while the process exits).
JobThreads& PackReadAheadThread() {
  static JobThreads* const thread = new JobThreads(1, /*max_pending=*/64);
  return *thread;
}

}  // namespace

void ChunkPacks::ReadAheadLater(uint64_t pack, uint64_t offset, uint64_t len) const {
  auto file = FileFor(pack);
  if (!file.ok()) return;
  // The request holds its pack's file open, not the store, which may close
  // meanwhile.
  PackReadAheadThread().Post([file = std::move(*file), offset, len] {
    posix_fadvise(file->fd.get(), static_cast<off_t>(offset), static_cast<off_t>(len),
                  POSIX_FADV_WILLNEED);
  });
}

Status ChunkPacks::Sync() {
  // One Sync() at a time: a second one must not return while the first is
  // still writing packs the second's caller appended to.
  MutexLock sync_lock(&sync_mu_);
  std::vector<std::shared_ptr<File>> files;
  bool dir_dirty = false;
  {
    MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    for (uint64_t id : dirty_) {
      auto found = open_.find(id);
      if (found != open_.end()) files.push_back(found->second);
    }
    dirty_.clear();
    dir_dirty = std::exchange(dir_dirty_, false);
  }
  Status status;
  for (const auto& f : files) {
    if (files_->Fdatasync(f->fd.get()) != 0) {
      status = StatusFromErrno(errno, "syncing pack " + PathOf(f->id));
      break;
    }
  }
  if (status.ok() && dir_dirty && files_->FsyncDirectory(dir_fd_.get()) != 0) {
    status = StatusFromErrno(errno, "syncing " + dir_);
  }
  if (!status.ok()) {
    MutexLock lock(&mu_);
    failed_ = status;
  }
  return status;
}

void ChunkPacks::Rotate() {
  MutexLock lock(&mu_);
  active_.reset();
}

Result<std::vector<ChunkPacks::PackFile>> ChunkPacks::List() const {
  const int fd = dup(dir_fd_.get());
  if (fd < 0) return StatusFromErrno(errno, "listing " + dir_);
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return StatusFromErrno(errno, "listing " + dir_);
  }
  rewinddir(d);
  std::map<uint64_t, PackFile> found;
  while (dirent* e = readdir(d)) {
    uint64_t id = 0;
    if (!ParsePackName(e->d_name, &id)) continue;
    struct stat st {};
    if (fstatat(dir_fd_.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
      continue;
    }
    found[id] = PackFile{id, static_cast<uint64_t>(st.st_size), false};
  }
  closedir(d);
  std::vector<PackFile> out;
  MutexLock lock(&mu_);
  for (auto& [id, f] : found) {
    f.active = active_ && active_->id == id;
    out.push_back(f);
  }
  return out;
}

Status ChunkPacks::Remove(uint64_t id) {
  {
    MutexLock lock(&mu_);
    if (active_ && active_->id == id) {
      return Status::InvalidArgument("pack " + PathOf(id) + " is being appended to");
    }
    open_.erase(id);  // readers holding it keep reading the unlinked file
    dirty_.erase(id);
  }
  if (files_->Unlink(dir_fd_.get(), PackName(id).c_str()) != 0 && errno != ENOENT) {
    return StatusFromErrno(errno, "removing pack " + PathOf(id));
  }
  if (files_->FsyncDirectory(dir_fd_.get()) != 0) return StatusFromErrno(errno, "syncing " + dir_);
  return Status::Ok();
}

Result<uint64_t> ChunkPacks::PunchHoles(uint64_t id,
                                        const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  {
    MutexLock lock(&mu_);
    if (active_ && active_->id == id) {
      return Status::InvalidArgument("pack " + PathOf(id) + " is being appended to");
    }
  }
  // Its own descriptor: packs are opened for reading only.
  UniqueFd fd(openat(dir_fd_.get(), PackName(id).c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return StatusFromErrno(errno, "opening pack " + PathOf(id));
  struct stat before {};
  if (fstat(fd.get(), &before) != 0) return StatusFromErrno(errno, "pack " + PathOf(id));
  for (const auto& [offset, length] : ranges) {
    if (length == 0) continue;
    if (offset < kHeaderSize) return Status::InvalidArgument("punching the header of a pack");
    if (files_->PunchHole(fd.get(), static_cast<off_t>(offset), static_cast<off_t>(length)) != 0) {
      if (errno == EOPNOTSUPP || errno == ENOSYS) {
        return Status::Unavailable("the filesystem of " + dir_ + " cannot punch holes");
      }
      return StatusFromErrno(errno, "punching holes in pack " + PathOf(id));
    }
  }
  struct stat after {};
  if (fstat(fd.get(), &after) != 0) return StatusFromErrno(errno, "pack " + PathOf(id));
  return before.st_blocks > after.st_blocks
             ? static_cast<uint64_t>(before.st_blocks - after.st_blocks) * 512
             : uint64_t{0};
}

}  // namespace gpuckpt
