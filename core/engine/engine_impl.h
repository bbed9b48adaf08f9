// EngineImpl: the engine's inside, behind Engine (engine.h): the state
// an Engine owns (the CRIU binary, the process table, the operation board,
// metrics, the quota ledger, the staging budget) and the steps of its
// operations, defined in the engine's files (engine.cc, checkpoint.cc,
// checkpoint_resources.cc, restore.cc, restore_source.cc, import.cc).
// Included by nothing outside core/engine/ but its tests; callers use
// engine.h, whose comments say what each request does.
//
// Thread-safe as Engine is: any number of operations at once, at most one
// per process (OperationBoard).
#ifndef GPUCKPT_CORE_ENGINE_ENGINE_IMPL_H_
#define GPUCKPT_CORE_ENGINE_ENGINE_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/base/mutex.h"
#include "core/criu/criu_runner.h"
#include "core/criu/images.h"
#include "core/engine/checkpoint_catalog.h"
#include "core/engine/checkpoint_schedule.h"
#include "core/engine/engine.h"
#include "core/engine/engine_internal.h"
#include "core/engine/lazy_restore.h"
#include "core/engine/metrics.h"
#include "core/engine/operation_board.h"
#include "core/engine/quota.h"
#include "core/manifest/checkpoint_manifest.h"
#include "core/proc/caller.h"
#include "core/proc/process_table.h"
#include "gpuckpt/byte_budget.h"
#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class EngineImpl {
 public:
  // Engine's calls, each as engine.h says.
  static Result<std::unique_ptr<EngineImpl>> Create(Store* store, std::unique_ptr<GpuBackend> gpu,
                                                    EngineOptions options);
  ~EngineImpl();
  ProcessTable& processes() { return *processes_; }
  Result<SnapshotInfo> Checkpoint(const CheckpointRequest& request);
  Result<int> Restore(const RestoreRequest& request);
  Result<SnapshotInfo> Import(const std::string& path, const std::string& name,
                              const Caller& caller);
  Status Track(int pid, const Caller& caller);
  Status StopSchedule(int pid, const Caller& caller);
  Result<GcReport> Gc(const Caller& caller);
  ProcessStatusReport ProcessStatus(const ProcessInfo& process);
  std::string LastResult(ResultFile file, uint32_t uid) const EXCLUDES(mu_);
  int64_t LastResultTime(ResultFile file, uint32_t uid) const EXCLUDES(mu_);
  // `lazy_pid`: of a restore's result, its tree still coming in lazily:
  // LastResult adds how far it is, until LazyRestoreEnded says how it ended.
  void SetLastResult(ResultFile file, uint32_t uid, std::string text, int lazy_pid = 0)
      EXCLUDES(mu_);
  // Has LastResult(kRestore, uid) show the restore of `id` in flight on the
  // board under `pid`, until ForgetRestoreInFlight(uid, pid).
  void NoteRestoreInFlight(uint32_t uid, int pid, const std::string& id) EXCLUDES(mu_);
  void ForgetRestoreInFlight(uint32_t uid, int pid) EXCLUDES(mu_);
  std::string MetricsText() EXCLUDES(stats_mu_);
  void NoteStoreChanged() {
    store_changed_.store(true, std::memory_order_relaxed);
    quota_.NoteStoreChanged();
  }
  void NoteRemoved(const std::string& id, uint64_t key) {
    catalog_.Remove(id, key);
    NoteStoreChanged();
  }
  size_t LazyRestoresInFlight() const { return lazy_servers_.size(); }
  bool LazyServerBypassesPageCache(int pid) const { return lazy_servers_.BypassesPageCache(pid); }
  void NoteLazyPagesCopied(int server_pid, uint64_t bytes, bool on_fault) {
    if (lazy_servers_.NoteCopied(server_pid, bytes)) metrics_.AddLazyPagesCopied(on_fault, bytes);
  }
  void NoteLazyPagesCopiedInBatch(int server_pid, uint64_t bytes) {
    if (!lazy_servers_.NoteCopied(server_pid, bytes)) return;
    metrics_.AddLazyPagesCopied(/*on_fault=*/false, bytes);
    metrics_.AddLazyCopyBatch();
  }
  Status CheckRemovable(const std::string& id) const {
    if (!lazy_servers_.Serving(id)) return Status::Ok();
    return Status::Busy("checkpoint " + id +
                        " is being restored lazily: it can be removed once the restored tree is "
                        "resident (cat restore, or the tree's status)");
  }
  int64_t started_ns() const { return started_ns_; }
  void RecordFailure(int pid, const std::string& operation, const Status& status,
                     const Caller& caller);

 private:
  EngineImpl(Store* store, std::unique_ptr<GpuBackend> gpu, EngineOptions options, Criu criu);
  // A directory for one operation (CRIU's sockets and logs); on
  // destruction removed, or kept for its log if the operation failed.
  class WorkDir {
   public:
    WorkDir(EngineImpl* engine, std::string path) : engine_(engine), path_(std::move(path)) {}
    ~WorkDir() { engine_->FinishWorkDir(path_, succeeded_); }
    WorkDir(const WorkDir&) = delete;
    WorkDir& operator=(const WorkDir&) = delete;
    const std::string& path() const { return path_; }
    void MarkSucceeded() { succeeded_ = true; }

   private:
    EngineImpl* engine_;
    std::string path_;
    bool succeeded_ = false;
  };
  Result<std::unique_ptr<WorkDir>> MakeWorkDir(const std::string& label);
  void FinishWorkDir(const std::string& dir, bool ok) EXCLUDES(mu_);
  // The shared pool's state, and where the checkpoint of the process's
  // last operation (`last`) is.
  PoolStatus PoolStatusOf(const PoolStats& pool, const std::optional<OperationOutcome>& last);
  Result<std::string> NextCheckpointName(int pid);
  // What a checkpoint of `tree` may take, read once for the quota and the
  // room checks: its processes' memory and its GPU processes' device memory.
  struct TreeFootprint {
    uint64_t rss_bytes = 0;
    uint64_t device_memory_bytes = 0;
    std::vector<std::pair<int, uint64_t>> device_memory;  // (pid, bytes) of its GPU processes
  };
  TreeFootprint MeasureTree(const std::vector<int>& tree);
  // Refuses a checkpoint of the tree of `pid` that could not fit, before
  // anything is locked or frozen, for every caller: kNoMemory when the
  // device memory the driver moves into host memory and the staging the
  // writer faults in exceed the host's available memory or a memory
  // cgroup's headroom, kNoSpace when the tree's memory and device memory,
  // all new, could not fit on the store's disk (checkpoint_resources.h).
  // `check_space` false leaves the store's disk unchecked (memory always is).
  Status CheckRoomForCheckpoint(int pid, const TreeFootprint& footprint, bool check_space);
  // The dedup domain of a checkpoint owned by `owner_uid`.
  std::optional<uint32_t> DedupDomainFor(uint32_t owner_uid) const;
  // The tree of request.pid, refused where the caller (not root) does not
  // own all of it or where CRIU could not dump it (io_uring).
  Result<std::vector<int>> CheckpointableTree(const CheckpointRequest& request);
  // A checkpoint's outcome in metrics and the log; a refusal before its
  // ticket began (`on_board` false) is shown in status too.
  void RecordCheckpointEnd(const CheckpointRequest& request, const Result<SnapshotInfo>& result,
                           bool on_board, const std::string& kept_log);
  // A checkpoint's steps (checkpoint.cc): DumpAndStore runs CRIU into a
  // snapshot and publishes it; it undoes whatever it did on every way out
  // that does not publish.
  Result<SnapshotInfo> DumpAndStore(const CheckpointRequest& request, const ProcessInfo& process,
                                    const std::vector<int>& tree, const TreeFootprint& footprint,
                                    OperationBoard::Ticket* ticket, std::string* kept_log);
  // The manifest's fields known before the dump: the process, its owner
  // and maker, its GPUs.
  CheckpointManifest DescribeCheckpoint(const CheckpointRequest& request,
                                        const ProcessInfo& process, const std::vector<int>& tree,
                                        const TreeIdentity& identity, const CriuGpuSetup& gpu,
                                        const GpuCheckpointOptions& gpu_options);
  // Names the checkpoint, finds the one it follows (manifest->parent, the
  // base of its chunks) and begins its snapshot, staged in the background.
  // Whether a checkpoint of `footprint` may be spooled (EngineOptions::spool
  // on this machine, and the room it needs).
  bool ShouldSpool(const TreeFootprint& footprint, bool check_space) const;
  Result<std::unique_ptr<SnapshotWriter>> BeginCheckpointSnapshot(const CheckpointRequest& request,
                                                                  const ProcessInfo& process,
                                                                  const TreeFootprint& footprint,
                                                                  CheckpointManifest* manifest);
  // `criu dump --stream` of the tree into `images`, with the GPU setup's
  // plugins, path and environment.
  CriuCommand DumpCommand(const CheckpointRequest& request, const ProcessInfo& process,
                          const std::vector<int>& tree, const CriuGpuSetup& gpu,
                          const std::string& work, const std::string& images) const;
  // A failed dump's error, its log kept and shown on the ticket; a GPU
  // lock that timed out is kAborted (try again), not CRIU's failure.
  Status DumpFailure(int pid, const CriuLogs& logs, const Status& served, Result<int>& exit,
                     const GpuCheckpointOptions& gpu_options, OperationBoard::Ticket* ticket,
                     std::string* kept_log);
  // What only the finished dump tells the manifest: the device memory
  // cuda-checkpoint found, how long the tree was frozen, the stages' times.
  // `held_locks`: the span of the locks the backend took before CRIU ran.
  void RecordDumpResults(const GpuCheckpointOptions& gpu_options,
                         const GpuBackend::LockSpan& held_locks, int64_t dump_end_ns, double dump_s,
                         const std::string& work, CheckpointManifest* manifest);
  // Begins the snapshot of `spec`, named as the request says (the next
  // "<pid>-<n>" when it names none).
  Result<std::unique_ptr<SnapshotWriter>> BeginNamedSnapshot(const CheckpointRequest& request,
                                                             SnapshotSpec spec,
                                                             const SnapshotWriterOptions& options);
  // Writes the manifest and publishes the snapshot.
  Result<SnapshotInfo> CommitCheckpoint(SnapshotWriter& writer, const CheckpointManifest& manifest,
                                        OperationBoard::Ticket* ticket);
  // The id of the checkpoint a restore names; *imported when it was
  // imported from outside the mount for this restore.
  Result<std::string> ResolveRestoreSource(const RestoreRequest& request, bool* imported);
  // Imports what `path` names (import.cc): a directory of images, a copy
  // of a checkpoint, a container checkpoint archive or its directory.
  // `for_restore`: a restore's import of a copy (the manifest says so).
  Result<SnapshotInfo> ImportFrom(const std::string& path, const std::string& name,
                                  const Caller& caller, bool for_restore = false);
  struct ImportSource {
    std::string path;   // as given
    std::string shown;  // for messages
    std::string name;   // the caller's NAME, or ""
    Caller caller;      // who asked
    // Whose checkpoint the import becomes (its owner: the owner of its
    // files, every one of which must be theirs; names, dedup domain and
    // quota are theirs), and who made it (the owner; for a checkpoint of
    // this mount, its own maker).
    Caller owner;
    ManifestMaker made_by;
    bool for_restore = false;  // see ImportFrom()
  };
  // Who an import from `path` (open as `top_fd`, owned by `file_uid`) is
  // attributed to (the fields above), or why it may not be imported.
  Result<ImportSource> AttributeImport(int top_fd, uint32_t file_uid, const std::string& path,
                                       const std::string& name, const Caller& caller);
  // Where `fd`, opened from `path`, lies in this daemon's mount: its path
  // relative to the mount ("checkpoints/ID"); nullopt when it is not in
  // the mount. kInvalidArgument for the mount reached through another
  // mount point (a bind mount), whose paths are not the mount's.
  Result<std::optional<std::string>> MountRelativePath(int fd, const std::string& path) const;
  // The checkpoint a path relative to the mount names for `caller`
  // (checkpoints/ID[/images], archives/ID.tar, PID/checkpoints/N|latest);
  // `path` is what the caller wrote, for messages.
  Result<std::string> CheckpointAt(const std::string& relative, const std::string& path,
                                   const Caller& caller);
  // The checkpoint `which` ("latest" or "1", "2", ...) of process `pid`, as
  // its <pid>/checkpoints/ lists them (restore_source.cc).
  Result<std::string> CheckpointOfProcess(int pid, const std::string& which, const Caller& caller);
  Result<SnapshotInfo> ImportDirectory(int top_fd, const ImportSource& source);
  Result<SnapshotInfo> ImportContainerArchive(int fd, const ImportSource& source);
  // Refuses an import whose data (`worst_case_bytes`, all of it new at
  // worst) its owner's quota has no room for, before anything is read
  // (kNoSpace); else reserves that much of the quota for it. (The store's
  // disk is not asked: most of a copy is usually there already, and a disk
  // that fills fails the import cleanly.)
  Result<std::unique_ptr<QuotaLedger::Reservation>> ReserveForImport(const ImportSource& source,
                                                                     uint64_t worst_case_bytes);
  // The manifest of an import of the tree with root `pid`.
  CheckpointManifest ImportManifest(const ImportSource& source, int pid) const;
  // Adds an import's files to `writer`; may complete `manifest`.
  using ImportFill = std::function<Status(SnapshotWriter* writer, CheckpointManifest* manifest)>;
  // Stores one import under the caller's NAME, else `auto_name` (then
  // "-2", "-3", ... while taken), else the next "<pid>-<n>"; removes it
  // again when it took the caller beyond their quota.
  Result<SnapshotInfo> CommitImport(const ImportSource& source, const std::string& auto_name,
                                    int pid, CheckpointManifest manifest, const ImportFill& fill);
  // What CRIU must know of the tree beyond its images: --shell-job (its
  // session or group leader was outside it), and the directory that becomes
  // "/" of its own mount namespace (--root; "" when it had none), and
  // whether the tree joins its restorer's cgroups (RestoreRequest).
  struct TreeSetup {
    bool shell_job = false;
    std::string root_dir;
    bool join_cgroup = false;
    bool lazy = false;  // restore lazily (RestoreRequest::lazy), as checked
  };
  // What a restore found out on its way, for its record (RecordRestoreEnd).
  struct RestoreNotes {
    std::string id;         // the checkpoint restored
    bool imported = false;  // imported for this restore (and removed if it failed)
    std::string kept_log;   // the CRIU log of a failed restore
    std::string lazy_note;  // "lazy: yes", "lazy: no (why)", or "" when not asked
    // When CRIU's restore exited: the rest of a restore's time is the
    // daemon's own, after it. Unset where CRIU never ran.
    std::optional<std::chrono::steady_clock::time_point> criu_exited;
  };
  // Restores as `as` (CRIU runs with their credentials unless root), in
  // cgroups below those of the process `restorer_pid` that asked for it,
  // or in those (setup.join_cgroup) (the request's Caller::pid; 0,
  // unknown, is refused); the tree's root
  // comes back as `root_pid` (1: in a new pid namespace, with a new pid
  // here).
  // A lazy restore's server reports its end to `caller_uid`'s `restore`.
  // Sets notes->kept_log and notes->criu_exited.
  Result<int> RestoreSnapshot(const std::string& id, const TreeSetup& setup,
                              const CriuGpuSetup& gpu, const Caller& as, int restorer_pid,
                              int root_pid, uint32_t caller_uid, OperationBoard::Ticket* ticket,
                              RestoreNotes* notes);
  // Restore's steps (restore.cc): the checkpoint `request` names, checked
  // and restored; what it found out on the way in *notes.
  Result<int> ResolveAndRestore(const RestoreRequest& request, RestoreNotes* notes);
  // Starts `criu lazy-pages` for a lazy `restore` (as it runs, in its
  // cgroups, with its plugins: `gpu`'s) on `images_dir`, and waits until it
  // listens in `work`.
  Result<CriuProcess> StartLazyServer(const CriuCommand& restore, const CriuGpuSetup& gpu,
                                      const std::string& images_dir, const std::string& work,
                                      const CriuLogs& logs);
  // Kills a lazy-pages server whose restore failed, and waits for it.
  void StopLazyServer(CriuProcess& server);
  // A restore's outcome in metrics, the log and the caller's restore file.
  void RecordRestoreEnd(const RestoreRequest& request, const RestoreNotes& notes,
                        const Result<int>& pid, std::chrono::steady_clock::time_point start);
  // `criu restore --stream` of checkpoint `id` (whose image files are
  // `images`) from `images_dir`, as `as`, with the GPU setup's plugins,
  // path and environment.
  Result<CriuCommand> RestoreCommand(const std::string& id, const std::set<std::string>& images,
                                     const TreeSetup& setup, const CriuGpuSetup& gpu,
                                     const Caller& as, const std::string& work,
                                     const std::string& images_dir, const std::string& pidfile);
  // The error of a failed CRIU run (`what`), its log kept (as `label`) into
  // *kept_log and both shown on the ticket.
  Status RecordCriuFailure(const std::string& what, const std::string& label, const CriuLogs& logs,
                           const Status& served, Result<int>& exit, OperationBoard::Ticket* ticket,
                           std::string* kept_log);
  void RecoverInterruptedKills();
  // Says in the log what became of the lazy restores a previous daemon
  // left coming in (LazyJournal).
  void RecoverInterruptedLazyRestores();
  std::string LazyJournalDir() const;
  // A lazy restore's server ended: the log, the metrics.
  void LazyRestoreEnded(const LazyServers::Ended& ended);
  std::string JournalDir() const;
  // Checkpoints on a schedule and retention (schedule.cc).
  // Checkpoint()'s checks of `every`, and what it sets up once the first
  // checkpoint is made: the schedule.
  Status CheckScheduleRequest(const CheckpointRequest& request) const;
  void StartSchedule(const CheckpointRequest& request);
  // The schedule's RunFn (checkpoint_schedule.h).
  bool RunScheduled(const CheckpointRequest& request, uint64_t start_time, bool* ok);
  // After checkpoint `made` of request.pid: removes what the request's rule
  // (or the daemon's) does not keep of the process's series, then what the
  // owner rule does not keep of all the owner's engine-named checkpoints;
  // `made` itself always stays.
  void ApplyRetention(const CheckpointRequest& request, const SnapshotInfo& made);
  // Removes those of `ids` that `rule` does not keep but `made_id`; what
  // it removed. `scope` names the rule in the log ("pid=12", "owner").
  std::vector<std::string> RemoveNotKept(const std::vector<std::string>& ids,
                                         const RetentionRule& rule, const std::string& made_id,
                                         const std::string& scope);
  // Copies the log of a failed CRIU run into state_dir's criu-logs/ (the
  // newest kKeptCriuLogs per store are kept) and returns its path; "" when
  // it could not be kept (logged).
  std::string KeepCriuLog(const CriuLogs& logs, const std::string& label);
  // The kept logs of this store.
  std::string CriuLogDir() const;

  Store* store_;
  std::unique_ptr<GpuBackend> gpu_;
  EngineOptions options_;
  Criu criu_;
  std::unique_ptr<ProcessTable> processes_;
  OperationBoard board_;
  Metrics metrics_;
  // What every checkpoint is, without reading the store (before quota_,
  // which asks it).
  CheckpointCatalog catalog_;
  QuotaLedger quota_;
  std::string empty_plugin_dir_;
  // CRIU's --libdir for `gpu`: its plugins, or an empty directory, so that
  // CRIU loads none of its own.
  const std::string& PluginDirFor(const CriuGpuSetup& gpu) const {
    return gpu.plugin_dir.empty() ? empty_plugin_dir_ : gpu.plugin_dir;
  }
  std::shared_ptr<ByteBudget> staging_;  // shared by the checkpoints' writers

  const int64_t started_ns_;

  // The store's totals for `metrics`. stats_mu_ is held through a scan (the
  // store's I/O), so that concurrent scrapes wait for one scan rather than
  // each running one; only scrapes take it, so it blocks nothing else.
  Mutex stats_mu_;
  std::optional<StoreStats> store_stats_ GUARDED_BY(stats_mu_);
  uint64_t stats_settled_ GUARDED_BY(stats_mu_) = 0;  // Store::settled_snapshots() at the scan
  std::atomic<bool> store_changed_{true};

  struct ResultText {
    std::string text;
    int64_t set_ns = 0;
    int lazy_pid = 0;  // a lazily restored tree still coming in
  };
  mutable Mutex mu_;
  std::map<std::pair<ResultFile, uint32_t>, ResultText> last_results_ GUARDED_BY(mu_);  // by uid
  struct RestoreInFlight {
    int pid = 0;  // on the board
    std::string id;
  };
  std::map<uint32_t, RestoreInFlight> restores_in_flight_ GUARDED_BY(mu_);  // by uid
  // --keep-logs: the newest work dirs
  std::vector<std::string> kept_work_dirs_ GUARDED_BY(mu_);

  // The lazy restores' servers, until their trees are resident. Destroyed
  // (waiting for them) before everything their end touches.
  LazyServers lazy_servers_{[this](const LazyServers::Ended& ended) { LazyRestoreEnded(ended); }};

  // Last, so that it is destroyed first: its thread runs checkpoints
  // through everything above.
  CheckpointSchedule schedule_{[this](const CheckpointRequest& request, uint64_t start_time,
                                      bool* ok) { return RunScheduled(request, start_time, ok); }};
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_ENGINE_IMPL_H_
