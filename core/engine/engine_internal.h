// What the engine's own files (core/engine/*.cc) share beyond the Engine
// API: CRIU's logs of one run, the failure built from them, frozen times,
// who made a checkpoint, checkpoint names. Not for callers of the engine,
// which use engine.h; tests of these pieces include it too.
//
// Thread-safety: free functions are reentrant; a CriuLogs belongs to the
// one operation that made it.
#ifndef GPUCKPT_CORE_ENGINE_ENGINE_INTERNAL_H_
#define GPUCKPT_CORE_ENGINE_ENGINE_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/criu/criu_runner.h"
#include "core/criu/images.h"
#include "core/engine/engine.h"
#include "core/manifest/checkpoint_manifest.h"
#include "core/proc/caller.h"
#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

// How long a checkpoint kept the job from running.
struct FrozenTime {
  // For a tree with GPU processes, from the first lock to the last unlock
  // of their GPU work (to the end of the dump when the tree is not unlocked:
  // --kill); otherwise CRIU's own measure, from frozen to resumed (or left
  // stopped). Absent when neither was recorded.
  std::optional<double> seconds;
  std::string how;  // "gpu lock to unlock", "criu freeze to resume", ...
  // CRIU's frozen time, when CRIU reported it.
  std::optional<double> criu_seconds;
};
// `gpu`: the lock span (CLOCK_MONOTONIC ns); `dump_end_ns`: when CRIU
// exited, on the same clock; `criu`: CRIU's stats-dump, if any.
FrozenTime MeasureFrozenTime(const GpuBackend::LockSpan& gpu, int64_t dump_end_ns,
                             const std::optional<CriuDumpStats>& criu);
// The frozen time recorded in a checkpoint's manifest (extra.stages.frozen_s).
std::optional<double> FrozenSecondsOf(const SnapshotInfo& info);

// CRIU's log and stderr for one run, made by the daemon in the run's work
// directory before CRIU starts (given to `owner` when CRIU runs as a user)
// and read back through the descriptors it keeps: the work directory is
// the user's, and whatever they put at those names later (a symlink to a
// root-only file, a FIFO) is never opened by the daemon.
class CriuLogs {
 public:
  // `log_name` is what CRIU is told with -o (relative to the work dir);
  // its stderr goes to `stderr_name` there.
  static Result<std::unique_ptr<CriuLogs>> Create(const std::string& work,
                                                  const std::string& log_name,
                                                  std::optional<uint32_t> owner_uid,
                                                  uint32_t owner_gid,
                                                  const std::string& stderr_name = "criu.stderr");
  ~CriuLogs();
  CriuLogs(const CriuLogs&) = delete;
  CriuLogs& operator=(const CriuLogs&) = delete;
  int stderr_fd() const { return stderr_fd_; }
  const std::string& log_path() const { return log_path_; }
  // The lines that say why CRIU failed: of its log, or of its stderr when
  // the log holds none (CRIU reports what happens before it opens its log
  // there only).
  std::string Summary() const;
  // The log, then CRIU's stderr, through the held descriptors: at most the
  // last `max_bytes` of each.
  std::string Contents(size_t max_bytes) const;

 private:
  CriuLogs(int log_fd, int stderr_fd, std::string log_path)
      : log_fd_(log_fd), stderr_fd_(stderr_fd), log_path_(std::move(log_path)) {}
  int log_fd_;
  int stderr_fd_;
  std::string log_path_;
};

// The error for a failed CRIU run, in one line: `what` failed, and the line
// of its log (or stderr) that says why (CriuFailureCause); classed kNoSpace
// when the disk filled, kBusy when a port a restored socket binds is taken
// (ClassifyCriuFailure), else kIOError. `detail` (if not null) gets the lines
// of the log that say more.
Status CriuFailure(const std::string& what, const CriuLogs& logs, const Status& served,
                   Result<int>& exit, std::vector<std::string>* detail = nullptr);

// Gives the memory an operation freed back to the system: the read blocks
// and chunk buffers of a large checkpoint would otherwise stay in malloc's
// arenas, and the daemon's RSS would show its largest operation forever.
void ReleaseFreeMemory();

// Gives the GPU state of `pids` back (GpuBackend::Release); a failure is
// logged (with `when`: which operation let go), since nobody else waits for
// its result.
void ReleaseGpusOrLog(GpuBackend& gpu, const std::vector<int>& pids, const std::string& when);

// Hands the paths (work dirs, sockets) to a user's CRIU.
Status GiveTo(uint32_t uid, uint32_t gid, const std::vector<std::string>& paths);

// Who made a checkpoint: the user who asked for it (through <pid>/ctl) or
// imported it, recorded in the manifest's "extra" as "made_by". A restore
// never gives the restored tasks more than this user had, whoever asks for
// it. Snapshots that predate the record count as made by their owner (the
// least that the record could have said); CLI imports, by root.
struct SnapshotMaker {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
};
SnapshotMaker MakerOf(const SnapshotInfo& info);
// A snapshot's owner and maker, and whether gpuckpt itself dumped it (not
// an import), from one read of its manifest.
struct Provenance {
  SnapshotOwner owner;
  SnapshotMaker maker;
  bool own_dump = true;
};
Provenance ProvenanceOf(const SnapshotInfo& info);
// IsCheckpointOfProcess() of a snapshot of provenance `p`.
bool CountsForProcess(const Provenance& p, int pid, uint32_t owner_uid);
// The manifest's made_by record of `caller`.
ManifestMaker MakerRecordOf(const Caller& caller);

// Who the processes of a tree to checkpoint are, read once before anything
// is locked: their start times tell them from later processes with a reused
// pid, and their owners decide whose checkpoint it is and whom CRIU runs as.
struct TreeIdentity {
  std::vector<uint64_t> start_times;  // 0 for a process that exited meanwhile
  // The user whose tree it wholly is (every real, effective and saved uid
  // of every process theirs, and not root), with the root process's gid and
  // groups; nullopt for a tree that holds root's or several users'
  // processes.
  std::optional<Caller> user;
};
// `root` is the tree's root process, `tree` its pids (the root first).
TreeIdentity IdentifyTree(const ProcessInfo& root, const std::vector<int>& tree);

// kCancelled when `caller` gave up on their request (interrupted their
// write) before `what` began, so that nothing more is done for it.
Status CheckNotCancelled(const Caller& caller, const std::string& what);

// A name given with `checkpoint --name` or `import PATH NAME` must not have
// the form "<digits>-<digits>" that the automatic names ("<pid>-<n>") take;
// the store checks the rest (letters, digits, '.', '_', '-'; 1 to 128).
Status CheckCheckpointName(const std::string& name);
// The id a checkpoint named `name` by `maker` gets: the name itself for
// root, "<uid>.<name>" for anyone else, so that one user's names never
// collide with, or block, another's. Root's names may not take that form
// (kInvalidArgument).
Result<std::string> CheckpointIdForName(const std::string& name, const Caller& maker);
// Whether `name` has the form "<digits>.<rest>" of users' checkpoint ids.
bool HasUserIdForm(const std::string& name);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_ENGINE_INTERNAL_H_
