// PowerLossEnv: a StoreEnv that records what the store made durable, and
// rewrites the store's files to only that, as a power loss would leave them.
//
// What counts as durable, per file: its bytes as of its last fdatasync /
// fsync (writes after it are lost, wherever they lie); per name: that it
// existed (and named which file) as of the last fsync of its directory, so a
// file created, renamed or removed since then is respectively gone, back
// under its old name, or back. A directory the store made is gone, with
// everything in it, unless its parent was fsynced after. Files the store
// never wrote, renamed or removed through the environment (the lock file,
// the reserve, RocksDB's info log) are left alone, and files that existed
// before are taken as durable as they were when first touched.
//
// This is the least a disk keeps; one may keep any part of the rest too,
// which is closer to what a killed process leaves (the crash tests).
//
// StopDurabilityAfter(n) makes every sync after the n-th a no-op for
// durability (the sync still happens and succeeds): a power loss right
// after the n-th sync, whatever the store went on to do.
//
// Paths are compared as strings: open the store by a path without symlinks
// (realpath), so that RocksDB's paths and the packs' directory agree.
#ifndef GPUCKPT_TESTS_UNIT_POWER_LOSS_ENV_H_
#define GPUCKPT_TESTS_UNIT_POWER_LOSS_ENV_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "core/base/mutex.h"
#include "core/store/store_env.h"
#include "gpuckpt/status.h"

namespace gpuckpt::testing {

class PowerLossEnv {
 public:
  PowerLossEnv();
  ~PowerLossEnv();
  PowerLossEnv(const PowerLossEnv&) = delete;
  PowerLossEnv& operator=(const PowerLossEnv&) = delete;

  // For LocalStore::Open(); the PowerLossEnv must outlive the store.
  const StoreEnv& store_env() const { return env_; }

  // Syncs (of files and of directories) seen so far.
  uint64_t syncs() const EXCLUDES(mu_);
  // Syncs after the first `n` (counted from the start) make nothing durable.
  void StopDurabilityAfter(uint64_t n) EXCLUDES(mu_);

  // Rewrites every file it saw to its durable state: removes those whose
  // name is not durable, writes the others with their durable bytes. Call
  // with the store closed. The environment starts over afterwards, with
  // everything on disk taken as durable.
  Status PowerLoss() EXCLUDES(mu_);

  // The recorder's own half of the work, for its two front ends (RocksDB's
  // FileSystem and StoreFileOps). Paths are absolute.
  struct Node;
  std::shared_ptr<Node> Created(const std::string& path) EXCLUDES(mu_);
  // The file at `path`, registered as durable with what it holds now if
  // this is the first time it is seen; null when there is none.
  std::shared_ptr<Node> Existing(const std::string& path) EXCLUDES(mu_);
  // The file open as `fd` (by its inode), registered as Existing() does.
  std::shared_ptr<Node> OfFd(int fd) EXCLUDES(mu_);
  // Ties the file open as `fd` to `node` (a file just created).
  void SetFd(int fd, std::shared_ptr<Node> node) EXCLUDES(mu_);
  // Offset kAppend: at the end of what the file holds.
  static constexpr uint64_t kAppend = ~uint64_t{0};
  void Wrote(Node& node, uint64_t offset, const char* data, size_t len) EXCLUDES(mu_);
  void Truncated(Node& node, uint64_t size) EXCLUDES(mu_);
  void Punched(Node& node, uint64_t offset, uint64_t len) EXCLUDES(mu_);
  void SyncedFile(Node& node) EXCLUDES(mu_);
  void SyncedDirectory(const std::string& dir) EXCLUDES(mu_);
  void Renamed(const std::string& from, const std::string& to) EXCLUDES(mu_);
  void Removed(const std::string& path) EXCLUDES(mu_);
  void DirectoryCreated(const std::string& path) EXCLUDES(mu_);

 private:
  std::shared_ptr<Node> ExistingLocked(const std::string& path) REQUIRES(mu_);
  bool DurabilityStoppedLocked() REQUIRES(mu_);

  mutable Mutex mu_;
  // Names as they are now, and as a power loss would leave them.
  std::map<std::string, std::shared_ptr<Node>> live_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Node>> durable_ GUARDED_BY(mu_);
  // Directories made through the environment, now and durably.
  std::set<std::string> live_dirs_ GUARDED_BY(mu_);
  std::set<std::string> durable_dirs_ GUARDED_BY(mu_);
  // Pack files by inode: ChunkPacks names them by descriptor.
  std::map<std::pair<dev_t, ino_t>, std::shared_ptr<Node>> by_inode_ GUARDED_BY(mu_);
  uint64_t syncs_ GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> stop_after_ GUARDED_BY(mu_);
  StoreEnv env_;
};

// The path of descriptor `fd` (from /proc/self/fd).
std::string PathOfFd(int fd);

}  // namespace gpuckpt::testing

#endif  // GPUCKPT_TESTS_UNIT_POWER_LOSS_ENV_H_
