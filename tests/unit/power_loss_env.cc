#include "tests/unit/power_loss_env.h"

#include <fcntl.h>
#include <rocksdb/file_system.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <vector>

#include "core/base/full_io.h"
#include "core/base/unique_fd.h"

namespace gpuckpt::testing {

struct PowerLossEnv::Node {
  std::string current;  // what the file holds now
  std::string durable;  // what it holds after a power loss, if its name survives
};

namespace {

std::string Normal(const std::string& path) {
  std::string p = std::filesystem::path(path).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string ParentOf(const std::string& path) {
  return std::filesystem::path(path).parent_path().string();
}

// The whole of the file at `path`; nullopt when there is none.
std::optional<std::string> ReadWhole(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return std::nullopt;
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// RocksDB's writable files: every change mirrored into the recorder.
class RecordingFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  RecordingFile(std::unique_ptr<rocksdb::FSWritableFile> file, PowerLossEnv* env,
                std::shared_ptr<PowerLossEnv::Node> node)
      : FSWritableFileOwnerWrapper(std::move(file)), env_(env), node_(std::move(node)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Append(data, options, dbg);
    if (s.ok()) env_->Wrote(*node_, PowerLossEnv::kAppend, data.data(), data.size());
    return s;
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Append(data, options, info, dbg);
    if (s.ok()) env_->Wrote(*node_, PowerLossEnv::kAppend, data.data(), data.size());
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->PositionedAppend(data, offset, options, dbg);
    if (s.ok()) env_->Wrote(*node_, offset, data.data(), data.size());
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->PositionedAppend(data, offset, options, info, dbg);
    if (s.ok()) env_->Wrote(*node_, offset, data.data(), data.size());
    return s;
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Truncate(size, options, dbg);
    if (s.ok()) env_->Truncated(*node_, size);
    return s;
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Sync(options, dbg);
    if (s.ok()) env_->SyncedFile(*node_);
    return s;
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->Fsync(options, dbg);
    if (s.ok()) env_->SyncedFile(*node_);
    return s;
  }

 private:
  PowerLossEnv* const env_;
  const std::shared_ptr<PowerLossEnv::Node> node_;
};

class RecordingDirectory : public rocksdb::FSDirectoryWrapper {
 public:
  RecordingDirectory(std::unique_ptr<rocksdb::FSDirectory> dir, PowerLossEnv* env, std::string path)
      : FSDirectoryWrapper(std::move(dir)), env_(env), path_(std::move(path)) {}

  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = FSDirectoryWrapper::Fsync(options, dbg);
    if (s.ok()) env_->SyncedDirectory(path_);
    return s;
  }
  rocksdb::IOStatus FsyncWithDirOptions(const rocksdb::IOOptions& options,
                                        rocksdb::IODebugContext* dbg,
                                        const rocksdb::DirFsyncOptions& dir_options) override {
    // Counted as a whole directory sync, whatever the real filesystem does
    // for it (btrfs syncs only the renamed file).
    rocksdb::IOStatus s = FSDirectoryWrapper::FsyncWithDirOptions(options, dbg, dir_options);
    if (s.ok()) env_->SyncedDirectory(path_);
    return s;
  }

 private:
  PowerLossEnv* const env_;
  const std::string path_;
};

class RecordingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit RecordingFileSystem(PowerLossEnv* env)
      : FileSystemWrapper(rocksdb::FileSystem::Default()), env_(env) {}

  const char* Name() const override { return "PowerLossFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    env_->Existing(Normal(f));  // what it held before it is truncated
    rocksdb::IOStatus s = target()->NewWritableFile(f, options, r, dbg);
    if (s.ok()) r->reset(new RecordingFile(std::move(*r), env_, env_->Created(Normal(f))));
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    auto node = env_->Existing(Normal(f));
    rocksdb::IOStatus s = target()->ReopenWritableFile(f, options, r, dbg);
    if (!s.ok()) return s;
    if (!node) node = env_->Created(Normal(f));
    r->reset(new RecordingFile(std::move(*r), env_, std::move(node)));
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string&, const std::string&,
                                      const rocksdb::FileOptions&,
                                      std::unique_ptr<rocksdb::FSWritableFile>*,
                                      rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("the power loss recorder does not reuse files");
  }
  rocksdb::IOStatus NewRandomRWFile(const std::string&, const rocksdb::FileOptions&,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>*,
                                    rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("the power loss recorder has no random writes");
  }
  rocksdb::IOStatus LinkFile(const std::string&, const std::string&, const rocksdb::IOOptions&,
                             rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("the power loss recorder has no hard links");
  }
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& options,
                                 std::unique_ptr<rocksdb::FSDirectory>* r,
                                 rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewDirectory(name, options, r, dbg);
    if (s.ok()) r->reset(new RecordingDirectory(std::move(*r), env_, Normal(name)));
    return s;
  }
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& target_name,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override {
    env_->Existing(Normal(src));
    env_->Existing(Normal(target_name));
    rocksdb::IOStatus s = target()->RenameFile(src, target_name, options, dbg);
    if (s.ok()) env_->Renamed(Normal(src), Normal(target_name));
    return s;
  }
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override {
    env_->Existing(Normal(f));
    rocksdb::IOStatus s = target()->DeleteFile(f, options, dbg);
    if (s.ok()) env_->Removed(Normal(f));
    return s;
  }
  rocksdb::IOStatus CreateDir(const std::string& d, const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->CreateDir(d, options, dbg);
    if (s.ok()) env_->DirectoryCreated(Normal(d));
    return s;
  }
  rocksdb::IOStatus CreateDirIfMissing(const std::string& d, const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) override {
    struct stat st {};
    const bool existed = stat(d.c_str(), &st) == 0;
    rocksdb::IOStatus s = target()->CreateDirIfMissing(d, options, dbg);
    if (s.ok() && !existed) env_->DirectoryCreated(Normal(d));
    return s;
  }
  rocksdb::IOStatus Truncate(const std::string& f, size_t size, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
    auto node = env_->Existing(Normal(f));
    rocksdb::IOStatus s = target()->Truncate(f, size, options, dbg);
    if (s.ok() && node) env_->Truncated(*node, size);
    return s;
  }

 private:
  PowerLossEnv* const env_;
};

class RecordingFiles : public StoreFileOps {
 public:
  explicit RecordingFiles(PowerLossEnv* env) : env_(env) {}

  int CreateExclusive(int dir_fd, const char* name, mode_t mode) override {
    const int fd = StoreFileOps::CreateExclusive(dir_fd, name, mode);
    if (fd >= 0) env_->SetFd(fd, env_->Created(Normal(PathOfFd(dir_fd) + "/" + name)));
    return fd;
  }
  ssize_t Pwrite(int fd, const void* data, size_t len, off_t offset) override {
    auto node = env_->OfFd(fd);
    const ssize_t n = StoreFileOps::Pwrite(fd, data, len, offset);
    if (n > 0 && node) {
      env_->Wrote(*node, static_cast<uint64_t>(offset), static_cast<const char*>(data),
                  static_cast<size_t>(n));
    }
    return n;
  }
  int Fdatasync(int fd) override {
    auto node = env_->OfFd(fd);
    const int r = StoreFileOps::Fdatasync(fd);
    if (r == 0 && node) env_->SyncedFile(*node);
    return r;
  }
  int FsyncDirectory(int dir_fd) override {
    const int r = StoreFileOps::FsyncDirectory(dir_fd);
    if (r == 0) env_->SyncedDirectory(Normal(PathOfFd(dir_fd)));
    return r;
  }
  int Unlink(int dir_fd, const char* name) override {
    const std::string path = Normal(PathOfFd(dir_fd) + "/" + name);
    env_->Existing(path);
    const int r = StoreFileOps::Unlink(dir_fd, name);
    if (r == 0) env_->Removed(path);
    return r;
  }
  int MakeDirectory(const char* path, mode_t mode) override {
    const int r = StoreFileOps::MakeDirectory(path, mode);
    if (r == 0) env_->DirectoryCreated(Normal(path));
    return r;
  }
  int SyncDirectory(const char* path) override {
    const int r = StoreFileOps::SyncDirectory(path);
    if (r == 0) env_->SyncedDirectory(Normal(path));
    return r;
  }
  int PunchHole(int fd, off_t offset, off_t len) override {
    auto node = env_->OfFd(fd);
    const int r = StoreFileOps::PunchHole(fd, offset, len);
    if (r == 0 && node) {
      env_->Punched(*node, static_cast<uint64_t>(offset), static_cast<uint64_t>(len));
    }
    return r;
  }

 private:
  PowerLossEnv* const env_;
};

}  // namespace

std::string PathOfFd(int fd) {
  char buf[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

PowerLossEnv::PowerLossEnv() {
  env_.rocksdb_fs = std::make_shared<RecordingFileSystem>(this);
  env_.files = std::make_shared<RecordingFiles>(this);
}

PowerLossEnv::~PowerLossEnv() = default;

uint64_t PowerLossEnv::syncs() const {
  MutexLock lock(&mu_);
  return syncs_;
}

void PowerLossEnv::StopDurabilityAfter(uint64_t n) {
  MutexLock lock(&mu_);
  stop_after_ = n;
}

bool PowerLossEnv::DurabilityStoppedLocked() {
  ++syncs_;
  return stop_after_ && syncs_ > *stop_after_;
}

std::shared_ptr<PowerLossEnv::Node> PowerLossEnv::Created(const std::string& path) {
  MutexLock lock(&mu_);
  auto node = std::make_shared<Node>();
  live_[path] = node;
  return node;
}

std::shared_ptr<PowerLossEnv::Node> PowerLossEnv::Existing(const std::string& path) {
  MutexLock lock(&mu_);
  return ExistingLocked(path);
}

std::shared_ptr<PowerLossEnv::Node> PowerLossEnv::ExistingLocked(const std::string& path) {
  if (auto found = live_.find(path); found != live_.end()) return found->second;
  // Seen and removed since: whatever is there now is none of ours.
  if (durable_.count(path) != 0) return nullptr;
  auto bytes = ReadWhole(path);
  if (!bytes) return nullptr;
  auto node = std::make_shared<Node>();
  node->current = *bytes;
  node->durable = *bytes;
  live_[path] = node;
  durable_[path] = node;
  return node;
}

std::shared_ptr<PowerLossEnv::Node> PowerLossEnv::OfFd(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return nullptr;
  MutexLock lock(&mu_);
  const auto key = std::make_pair(st.st_dev, st.st_ino);
  if (auto found = by_inode_.find(key); found != by_inode_.end()) return found->second;
  auto node = ExistingLocked(Normal(PathOfFd(fd)));
  if (node) by_inode_[key] = node;
  return node;
}

void PowerLossEnv::SetFd(int fd, std::shared_ptr<Node> node) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return;
  MutexLock lock(&mu_);
  by_inode_[std::make_pair(st.st_dev, st.st_ino)] = std::move(node);
}

void PowerLossEnv::Wrote(Node& node, uint64_t offset, const char* data, size_t len) {
  MutexLock lock(&mu_);
  if (offset == kAppend) offset = node.current.size();
  if (node.current.size() < offset + len) node.current.resize(offset + len, '\0');
  node.current.replace(offset, len, data, len);
}

void PowerLossEnv::Truncated(Node& node, uint64_t size) {
  MutexLock lock(&mu_);
  node.current.resize(size, '\0');
}

void PowerLossEnv::Punched(Node& node, uint64_t offset, uint64_t len) {
  MutexLock lock(&mu_);
  if (offset >= node.current.size()) return;
  len = std::min<uint64_t>(len, node.current.size() - offset);
  std::fill_n(node.current.begin() + static_cast<std::ptrdiff_t>(offset), len, '\0');
}

void PowerLossEnv::SyncedFile(Node& node) {
  MutexLock lock(&mu_);
  if (DurabilityStoppedLocked()) return;
  node.durable = node.current;
}

void PowerLossEnv::SyncedDirectory(const std::string& dir) {
  MutexLock lock(&mu_);
  if (DurabilityStoppedLocked()) return;
  for (auto it = durable_.begin(); it != durable_.end();) {
    it = ParentOf(it->first) == dir ? durable_.erase(it) : std::next(it);
  }
  for (const auto& [path, node] : live_) {
    if (ParentOf(path) == dir) durable_[path] = node;
  }
  for (const std::string& path : live_dirs_) {
    if (ParentOf(path) == dir) durable_dirs_.insert(path);
  }
}

void PowerLossEnv::DirectoryCreated(const std::string& path) {
  MutexLock lock(&mu_);
  live_dirs_.insert(path);
}

void PowerLossEnv::Renamed(const std::string& from, const std::string& to) {
  MutexLock lock(&mu_);
  auto found = live_.find(from);
  if (found == live_.end()) return;
  live_[to] = found->second;
  live_.erase(from);
}

void PowerLossEnv::Removed(const std::string& path) {
  MutexLock lock(&mu_);
  live_.erase(path);
}

Status PowerLossEnv::PowerLoss() {
  MutexLock lock(&mu_);
  std::set<std::string> paths;
  for (const auto& entry : live_) paths.insert(entry.first);
  for (const auto& entry : durable_) paths.insert(entry.first);
  for (const std::string& path : paths) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return StatusFromErrno(errno, path);
  }
  // Directories whose names never became durable, with all inside them.
  std::vector<std::string> lost_dirs;
  for (const std::string& dir : live_dirs_) {
    if (durable_dirs_.count(dir) == 0) lost_dirs.push_back(dir);
  }
  auto lost = [&](const std::string& path) {
    for (const std::string& dir : lost_dirs) {
      if (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
          path[dir.size()] == '/') {
        return true;
      }
    }
    return false;
  };
  for (const auto& [path, node] : durable_) {
    if (lost(path)) continue;
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) return StatusFromErrno(errno, "recreating " + path);
    GPUCKPT_RETURN_IF_ERROR(
        PwriteFully(fd.get(), node->durable.data(), node->durable.size(), 0, path));
  }
  for (const std::string& dir : lost_dirs) {
    std::error_code error;
    std::filesystem::remove_all(dir, error);
    if (error) return StatusFromErrno(error.value(), "removing " + dir);
  }
  live_.clear();
  durable_.clear();
  live_dirs_.clear();
  durable_dirs_.clear();
  by_inode_.clear();
  syncs_ = 0;
  stop_after_.reset();
  return Status::Ok();
}

}  // namespace gpuckpt::testing
