// Engine: checkpoints processes into the Store and restores them, with CRIU
// and a GpuBackend; what gpuckptfs's control files call.
//
// Checkpoint: CRIU dumps the process tree with --stream; the images go from
// CRIU's pipes into a SnapshotWriter's staging memory (no copy on disk) as
// fast as CRIU writes them, so the tree is frozen only while CRIU copies
// its state; they are stored behind, and the snapshot becomes visible only
// when complete and durable. Restore: the images are
// served to `criu restore --stream` from the store. Every request carries
// its Caller, and the engine enforces who may do what ("Who may do what"
// in restore.cc; checkpoint.cc for checkpoints): a user checkpoints only processes that are wholly
// theirs, reads and restores only their own checkpoints, and an image
// handed in from outside is read only from files they own.
//
// Thread-safe: any number of operations run at once, at most one per
// process. Borrows the Store, which must outlive it; owns the backend.
#ifndef GPUCKPT_CORE_ENGINE_ENGINE_H_
#define GPUCKPT_CORE_ENGINE_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/engine/process_status.h"
#include "core/engine/retention.h"
#include "core/proc/caller.h"
#include "core/proc/process_table.h"
#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

struct EngineOptions {
  // Where per-operation directories (CRIU's sockets and logs) are made,
  // private to root. Default: /run/gpuckpt.
  std::string work_dir = "/run/gpuckpt";
  // The criu binary; empty: /usr/local/sbin/criu, else PATH. Default: "".
  std::string criu_path;
  // Where the filesystem is mounted, to recognise restore paths inside it.
  std::string mountpoint = "/mnt/gpuckpt";
  // Show every process the caller may checkpoint, not only GPU processes.
  bool all_processes = false;
  // How long a /proc scan is reused. Default: 1 s.
  std::chrono::milliseconds process_cache_ttl{1000};
  // What must survive the daemon's restarts, private to root (0700, made
  // if missing): the CRIU logs of failed operations (`criu-logs/`, the
  // newest 32 per store). systemd's StateDirectory=gpuckptfs gives this
  // path. Default: /var/lib/gpuckptfs.
  std::string state_dir = "/var/lib/gpuckptfs";
  // Keep each operation's work directory (CRIU's log, its sockets' files)
  // in work_dir, after success and failure alike; otherwise it is removed
  // when the operation ends, a failure's CRIU log kept under state_dir.
  // Default: false.
  bool keep_logs = false;
  // How long the GPU driver may take to lock a process for a checkpoint
  // (its GPU work in flight must finish); past it the checkpoint fails with
  // kAborted (EAGAIN) and the process runs on. A request may set its own.
  // Default: 10 s, CRIU's own default timeout.
  uint32_t lock_timeout_ms = 10000;
  // Staging memory, shared by all checkpoints in flight: the images CRIU
  // writes wait there to be hashed, compressed and written, so that CRIU
  // (and the frozen tree) never waits on that while there is room. A
  // larger image still succeeds: CRIU then waits for room. Only what a
  // checkpoint needs is taken, and it is given back when the checkpoint
  // ends. 0: DefaultStagingMemory(). Default: 0.
  uint64_t staging_memory_bytes = 0;
  // Deduplicate chunks across owners (the whole store), not only among one
  // owner's checkpoints. Saves space where users run the same code and
  // data, but what a checkpoint reports as new (and how long it takes)
  // then tells its user whether another user's checkpoints hold the same
  // bytes. Default: false (one dedup domain per owner).
  bool shared_dedup = false;
  // The most of the store one user's checkpoints may hold: the stored size
  // of the distinct chunks they name, however they got there (quota.h). A
  // checkpoint or import of theirs that could go beyond it, with every
  // operation of theirs in flight counted at its worst, is refused (ENOSPC)
  // before anything is frozen or read. Requests of root (whose checkpoints
  // of users' jobs and imports of users' copies are charged to those users)
  // are counted but never refused. 0: no limit. Default: 0.
  uint64_t user_quota_bytes = 0;
  // Whether a checkpoint's images are made durable raw first and chunked
  // behind (SnapshotWriterOptions::spool; only a process's first
  // checkpoint, or any with kAlways): kAlways, kNever, or kAuto, which
  // spools on machines with fewer than kSpoolBelowCpus online CPUs, where
  // hashing and compression cannot keep pace with a disk (measured in
  // tests/bench/README.md), when the store's disk has room for twice the
  // image and the request checks space. Ignored with a shared pool.
  // Default: kAuto.
  enum class Spool { kAuto, kAlways, kNever };
  Spool spool = Spool::kAuto;
  static constexpr unsigned kSpoolBelowCpus = 8;
  // What is kept of a process's checkpoints after each of its checkpoints,
  // where the request sets no rule of its own (retention.h). Default: all.
  RetentionRule retention;
  // What is kept of all of an owner's checkpoints, across their processes,
  // after each checkpoint of theirs, where the request sets no owner rule
  // of its own (retention.h). Default: all.
  RetentionRule owner_retention;
  // The daemon's mount at `mountpoint` serves every checkpoint's images as
  // files read from the store on demand (gpuckptfs sets it): what a lazy
  // restore's page server reads. Default: false (no lazy restore).
  bool mount_serves_images = false;
  // Restore lazily where a request does not say (RestoreRequest::lazy).
  // Default: false.
  bool lazy_restore = false;
  // A lazy restore's server (of a tree without GPUs) asks the daemon for
  // the ranges of a background transfer in batches of up to this many MiB,
  // which the daemon reads and copies side by side
  // (tools/criu-patches/0009): that large once the tree has gone 100 ms
  // without a fault, smaller before, so that its faults do not wait
  // behind them; 0: one range at a time. At most 64. Default:
  // kLazyCopyBatchMib on machines of kLazyCopyBatchFromCpus online CPUs or
  // more, else 0: on 2 cores, where the tree at work holds one of them,
  // batches brought it in later than single ranges (tests/bench/README.md,
  // "A background pass in batches").
  static constexpr uint32_t kLazyCopyBatchMib = 32;
  static constexpr unsigned kLazyCopyBatchFromCpus = 4;
  uint32_t lazy_copy_batch_mib =
      std::thread::hardware_concurrency() >= kLazyCopyBatchFromCpus ? kLazyCopyBatchMib : 0;
};

// Makes EngineOptions::state_dir (one level: its parent must exist) owned by
// the daemon's user with mode 0700, or checks that it is; the daemon
// calls it before its log (which may go there) is set up.
Status PrepareStateDir(const std::string& dir);

// A quarter of the machine's physical memory, at least 256 MiB: room for
// the images of a process holding that much host and device memory, while
// the machine keeps three quarters for its jobs.
uint64_t DefaultStagingMemory();

struct CheckpointRequest {
  int pid = 0;
  bool kill = false;             // stop the process after a successful checkpoint
  std::string name;              // empty: "<pid>-<n>"
  uint32_t lock_timeout_ms = 0;  // 0: EngineOptions::lock_timeout_ms
  // Refuse at once when the store's disk could not hold the tree's memory
  // and device memory all new. Off for a caller who expects dedup (a
  // process checkpointed before): a disk that fills during the dump then
  // fails the checkpoint (kNoSpace) and the process runs on.
  bool check_space = true;
  // Applied to the process's checkpoints once this one is made
  // (retention.h); empty: EngineOptions::retention.
  RetentionRule retention;
  // Applied to all the checkpoints of this one's owner once it is made
  // (retention.h); empty: EngineOptions::owner_retention.
  RetentionRule owner_retention;
  // Not zero: this checkpoint, and then one every `every` (the same
  // request, rule included) until the process ends or StopSchedule().
  // Refused with kill or a name.
  std::chrono::seconds every{0};
  Caller caller;
};

struct RestoreRequest {
  std::string path;     // a checkpoint dir in the mount, a copy of one, or a CRIU image dir
  std::string gpu_map;  // "OLD_UUID=NEW_UUID,...": restore onto other GPUs
  // For a tree with a mount namespace of its own: the directory that becomes
  // its "/" (root only). "": the one the checkpoint recorded.
  std::string root;
  // The tree joins the cgroups of the process that asked for the restore
  // instead of cgroups of its own below them (cgroup_placement.h): a batch
  // scheduler then treats it as that job's.
  bool join_cgroup = false;
  // Lazily: the tree runs as soon as CRIU has restored everything but its
  // private anonymous memory, whose pages CRIU's lazy-pages server then
  // brings in from the store (userfaultfd; a tree without GPUs has the
  // daemon copy them in at its request), first those the tree touches,
  // then the rest, until the tree is resident and the server ends. A tree
  // that cannot be restored lazily (lazy_restore.h says which) is restored
  // eagerly, and the result says why. Unset: EngineOptions::lazy_restore.
  std::optional<bool> lazy;
  Caller caller;
};

// Who a checkpoint belongs to: its process's owner, recorded in the
// manifest's "extra"; root for snapshots made without one (CLI imports).
struct SnapshotOwner {
  uint32_t uid = 0;
  uint32_t gid = 0;
  int pid = 0;  // the checkpointed process, 0 if none
};
SnapshotOwner OwnerOf(const SnapshotInfo& info);

// Whether `info` is listed under <pid>/checkpoints for the process `pid`
// owned by `owner_uid`: a checkpoint of that pid, owned by that user, and
// made by that user or by root. A checkpoint somebody else made (an import
// claiming the pid of another user's job) is never among them.
bool IsCheckpointOfProcess(const SnapshotInfo& info, int pid, uint32_t owner_uid);

class EngineImpl;  // engine_impl.h

// The control files that show each caller their own last result.
enum class ResultFile { kRestore, kCtl };

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(Store* store, std::unique_ptr<GpuBackend> gpu,
                                                EngineOptions options);
  ~Engine();

  // The processes the mount shows (<pid>/), read through the engine's cache.
  ProcessTable& processes();

  // Checkpoints the tree of request.pid; returns the new snapshot.
  Result<SnapshotInfo> Checkpoint(const CheckpointRequest& request);
  // Restores; returns the pid of the restored process (the tree's root).
  Result<int> Restore(const RestoreRequest& request);
  // Imports what `path` names as a checkpoint of its own: a directory of
  // images (a copy of a checkpoint, or CRIU's files), or a container
  // checkpoint archive or its directory (import.cc).
  Result<SnapshotInfo> Import(const std::string& path, const std::string& name,
                              const Caller& caller);
  Status Track(int pid, const Caller& caller);
  // Ends the periodic checkpoints of `pid` (CheckpointRequest::every), for
  // whoever may checkpoint it; kNotFound when it has none.
  Status StopSchedule(int pid, const Caller& caller);
  Result<GcReport> Gc(const Caller& caller);

  // What <pid>/status and <pid>/status.json show of `process` (fs/
  // renders them, fs/status_render.h): its GPU, the operation in flight,
  // the last one's outcome, the shared pool.
  ProcessStatusReport ProcessStatus(const ProcessInfo& process);
  // The text of `file` for `uid`, each caller's own last result: of
  // `restore`, "pid N" or "error: ..."; of `ctl`, the command and how it
  // ended ("gc: freed 21.9 MB in 1517 chunks"); "none" before the first.
  std::string LastResult(ResultFile file, uint32_t uid) const;
  // When that text last changed (CLOCK_REALTIME ns): the daemon's start
  // when it never did.
  int64_t LastResultTime(ResultFile file, uint32_t uid) const;
  void SetLastResult(ResultFile file, uint32_t uid, std::string text);
  // The `metrics` file. The store's totals in it (StoreStats, a scan of the
  // chunk index) are computed again only at the first call after the store
  // changed (an operation ended, NoteStoreChanged(), a spooled checkpoint
  // settled); else the last ones are shown.
  std::string MetricsText();
  // Says that the store changed outside the engine (NoteRemoved() says so
  // of a checkpoint removed).
  void NoteStoreChanged();
  // Says that checkpoint `id` of key `key` (SnapshotInfo::key) was removed
  // outside the engine (through the mount); what NoteStoreChanged() says
  // besides.
  void NoteRemoved(const std::string& id, uint64_t key);
  // kBusy while a lazily restored tree's memory still comes from
  // checkpoint `id` (RestoreRequest::lazy): it may not be removed until
  // the tree is resident.
  Status CheckRemovable(const std::string& id) const;
  // How many lazily restored trees are still coming in: their servers read
  // the mount, which must serve until they are resident.
  size_t LazyRestoresInFlight() const;
  // Whether `pid` is a lazy restore's server whose reads of the mount
  // should bypass the page cache (LazyServers::BypassesPageCache()).
  bool LazyServerBypassesPageCache(int pid) const;
  // Counts bytes the daemon copied into the tree of lazy restore server
  // `server_pid` at its request, `on_fault` or not: for the tree's progress
  // (LazyServers::NoteCopied()) and the metrics.
  void NoteLazyPagesCopied(int server_pid, uint64_t bytes, bool on_fault);
  // The same for a batch of ranges of its background pass, read and copied
  // side by side (fs/lazy_page_copy.h), counted as a batch too.
  void NoteLazyPagesCopiedInBatch(int server_pid, uint64_t bytes);
  // When this engine started (CLOCK_REALTIME ns).
  int64_t started_ns() const;
  // Records a failed request in status, metrics and the log (e.g. a bad
  // command).
  void RecordFailure(int pid, const std::string& operation, const Status& status,
                     const Caller& caller);

 private:
  explicit Engine(std::unique_ptr<EngineImpl> impl);
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_ENGINE_H_
