// Lazy restore: which trees may be restored lazily (WhyNotLazy), and the
// CRIU lazy-pages servers of the trees that were (LazyServers), from the
// restore's return until each tree is resident.
//
// A lazily restored tree runs before its private anonymous memory is in:
// CRIU registers that memory with userfaultfd and hands the descriptors to
// its `criu lazy-pages` server, which reads the pages from the checkpoint's
// images in the daemon's mount (read from the store on demand) and copies
// them in (for a tree without GPUs, has the daemon copy them in:
// fs/lazy_page_copy.h), first the pages the tree faults on, then the rest
// in the background, and exits when every page is in. If it cannot serve a page
// (the mount went away with the daemon), gpuckpt's CRIU kills the tree's
// unfinished processes before it exits (tools/criu-patches), so that no
// process ever runs on with memory that did not come from its checkpoint.
//
// Thread-safety: WhyNotLazy is a pure function. LazyServers is safe to call
// from any thread; it owns each adopted server (its process, work dir and
// logs) and one thread per server that waits for its exit.
#ifndef GPUCKPT_CORE_ENGINE_LAZY_RESTORE_H_
#define GPUCKPT_CORE_ENGINE_LAZY_RESTORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/base/mutex.h"
#include "core/criu/criu_runner.h"
#include "core/engine/process_status.h"

namespace gpuckpt {

// What decides whether a tree can be restored lazily.
struct LazyTreeFacts {
  bool mount_serves_images = false;  // EngineOptions::mount_serves_images
  bool own_namespaces = false;       // its own pid or mount namespace
  bool as_root = false;              // CRIU runs as root
};

// "" when a tree with `facts` can be restored lazily; else why not, in
// words for the caller ("a tree with a pid or mount namespace of its own is
// restored eagerly: ..."). A GPU tree is restored lazily too: the driver's
// restore faults in the host copy of its device memory before the tree
// runs, and the rest (its host heap) follows lazily.
std::string WhyNotLazy(const LazyTreeFacts& facts);

class LazyServers {
 public:
  // How a server ended: `exit_code` 0 when every page came in; otherwise
  // its tree's unfinished processes were killed, and `why` says why (the
  // first error line of its log).
  struct Ended {
    std::string id;           // the checkpoint served
    int tree_pid = 0;         // the restored tree's root
    uint32_t caller_uid = 0;  // who asked for the restore
    int exit_code = 0;
    double seconds = 0;           // from the restore's start
    uint64_t expected_bytes = 0;  // the page images' size
    uint64_t copied_bytes = 0;    // what the daemon copied in for it (NoteCopied())
    std::string why;
  };
  using EndedFn = std::function<void(const Ended&)>;

  // `ended` runs on the server's waiting thread, after the server is no
  // longer listed.
  explicit LazyServers(EndedFn ended);
  // Waits for every server: each ends on its own once its tree is resident
  // (or gone).
  ~LazyServers();
  LazyServers(const LazyServers&) = delete;
  LazyServers& operator=(const LazyServers&) = delete;

  // Called once when a server has ended, with whether its tree came in
  // whole (it exited 0): returns why not ("" when it did). What it holds
  // (the server's work dir, its logs) goes after `ended` has run.
  using FinishFn = std::function<std::string(bool resident)>;
  // Takes the server of checkpoint `id`, which restored the tree of
  // `tree_pid` for `caller_uid`, started at `start`, whose page images hold
  // about `expected_bytes`.
  void Adopt(std::string id, int tree_pid, uint32_t caller_uid, uint64_t expected_bytes,
             std::chrono::steady_clock::time_point start, CriuProcess server, FinishFn finish)
      EXCLUDES(mu_);

  // A server started for a restore not yet done: it opens the page images
  // while the restore runs, before Adopt(). Forgotten by Adopt() or by
  // ForgetStarting() when the restore failed. With `through_page_cache`,
  // its reads of the mount are to go through the page cache
  // (BypassesPageCache()).
  void NoteStarting(int server_pid, bool through_page_cache = false) EXCLUDES(mu_);
  void ForgetStarting(int server_pid) EXCLUDES(mu_);

  // Whether `pid` is a running server, adopted or starting.
  bool IsServer(int pid) const EXCLUDES(mu_);
  // Whether `pid` is a server whose reads should bypass the page cache: a
  // CPU tree's, whose pages are each read once, into the tree, so that the
  // cache would only hold them twice. A GPU tree's server reads through
  // it: the driver's restore takes the device memory in page by page, in
  // order, waiting for each, and only the kernel's read-ahead of the mount
  // keeps ahead of it (core/gpu/README.md).
  bool BypassesPageCache(int pid) const EXCLUDES(mu_);

  // Counts `bytes` that the daemon copied into the tree of server
  // `server_pid` at its request (fs/lazy_page_copy.h): its Progress is what
  // it read plus these. False (and ignored) for a pid that is no running
  // server.
  bool NoteCopied(int server_pid, uint64_t bytes) EXCLUDES(mu_);

  // Whether a server still reads checkpoint `id` (it must not be removed).
  bool Serving(const std::string& id) const EXCLUDES(mu_);

  // The lazy part of a restored tree still coming in; `bytes` is what
  // its server has read (its /proc/<pid>/io rchar) and what the daemon
  // copied for it (NoteCopied()).
  using Progress = LazyRestoreProgress;
  std::optional<Progress> ProgressOf(int tree_pid) const EXCLUDES(mu_);
  // How many servers run.
  size_t size() const EXCLUDES(mu_);
  // What each tree's Progress is, for each running server.
  std::vector<Progress> AllProgress() const EXCLUDES(mu_);

 private:
  struct Server {
    std::string id;
    int tree_pid = 0;
    uint32_t caller_uid = 0;
    int server_pid = 0;  // 0 once it has exited
    uint64_t expected_bytes = 0;
    std::chrono::steady_clock::time_point start;
    FinishFn finish;
  };
  void Wait(uint64_t key, CriuProcess server) EXCLUDES(mu_);
  bool IsServerLocked(int pid) const REQUIRES(mu_);
  // The progress of the running servers of `tree_pid`'s tree (0: all).
  std::vector<Progress> Snapshot(int tree_pid) const EXCLUDES(mu_);

  EndedFn ended_;
  mutable Mutex mu_;
  uint64_t next_key_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Server> servers_ GUARDED_BY(mu_);
  // Server pids before Adopt(), and whether each reads through the page
  // cache; after it, those that do.
  std::map<int, bool> starting_ GUARDED_BY(mu_);
  std::set<int> through_page_cache_ GUARDED_BY(mu_);
  // Bytes the daemon copied for each running server, by its pid.
  std::map<int, uint64_t> copied_ GUARDED_BY(mu_);
  std::map<uint64_t, std::thread> threads_ GUARDED_BY(mu_);
  // Of servers that ended: their threads are joined at the next Adopt().
  std::vector<uint64_t> ended_keys_ GUARDED_BY(mu_);
};

// The lazily restored trees still coming in, one file each (<dir>/<pid>,
// root's alone, under the work dir: a reboot forgets it with the trees),
// naming the checkpoint and the server's work dir, so that a daemon started
// after one that died says in its log what became of each tree: its server
// could no longer read the mount and killed it (its log says so), or it
// still runs.
//
// Thread-safe: entries are separate files.
class LazyJournal {
 public:
  explicit LazyJournal(std::string dir) : dir_(std::move(dir)) {}
  struct Entry {
    int tree_pid = 0;
    uint64_t start_time = 0;  // the tree root's, to tell a reused pid
    std::string id;
    std::string work_dir;
  };
  Status Add(const Entry& entry);
  void Remove(int tree_pid);
  // Every entry, and the journal cleared.
  std::vector<Entry> TakeAll();

 private:
  std::string dir_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_LAZY_RESTORE_H_
