// What the engine knows of one process for its `status` and `status.json`
// files, as plain values: the process, its GPU, the operation in flight and
// the last one's outcome, the shared pool. The engine fills a
// ProcessStatusReport (Engine::ProcessStatus); fs/ renders it as text and
// as JSON (fs/status_render.h), so that both files say the same.
//
// Plain values: copies, safe to use on any thread.
#ifndef GPUCKPT_CORE_ENGINE_PROCESS_STATUS_H_
#define GPUCKPT_CORE_ENGINE_PROCESS_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/retention.h"
#include "core/proc/process_info.h"
#include "gpuckpt/gpu_backend.h"

namespace gpuckpt {

// How an operation ended, as `status` and `status.json` show it. The text
// is as recorded (the renderer makes it fit one line of display).
struct OperationOutcome {
  std::string operation;  // "checkpoint", "restore", "command"
  bool ok = false;
  // One line: "checkpoint 4242-2 ok (frozen 0.92 s, ...)" or
  // "checkpoint failed: <the cause>".
  std::string summary;
  // A failure's further lines (CRIU's error lines, a synopsis), each one line.
  std::vector<std::string> detail;
  std::string criu_log;    // the kept CRIU log of a failure, "" if none
  std::string checkpoint;  // the checkpoint made or restored, "" if none
  int64_t started_ns = 0;  // CLOCK_REALTIME, ns since the epoch
  int64_t ended_ns = 0;    // likewise; 0 until the operation ends
};

// The operation in flight on a process.
struct OperationInFlight {
  std::string kind;
  // "starting", "gpu" (device memory to the host), "dump", "store",
  // "restore": StageWords() says each as a user would.
  std::string stage;
  uint64_t bytes = 0;  // read so far
  double elapsed_s = 0;
  int64_t started_ns = 0;  // CLOCK_REALTIME
  // What it should read in all, estimated (a checkpoint: the tree's memory
  // and device memory; a restore: the checkpoint's logical size); 0: not
  // known.
  uint64_t expected_bytes = 0;
  double stage_elapsed_s = 0;  // in the current stage

  // Of expected_bytes, read so far (at most 99 while in flight); nullopt
  // when not known.
  std::optional<int> Percent() const;
  // Seconds left at the current stage's pace, while it reads; nullopt when
  // not known.
  std::optional<double> EtaSeconds() const;
};

// A stage as a user would say it: "copying memory" for "dump".
std::string StageWords(const std::string& stage);

// "copying memory, 812.0 of about 2148.0 MB (37%), 1.9 s, about 3 s left",
// or with no estimate "copying memory, 812.0 MB read, 1.9 s".
std::string ProgressText(const OperationInFlight& op);

// The GPU side of a process, as the engine's GpuBackend sees it.
struct GpuStatus {
  // Why GPU state cannot be checkpointed on this machine; "" when it can.
  std::string unavailable_reason;
  // The process's GPU use; nullopt when not known (no backend, or the
  // backend could not tell).
  std::optional<GpuProcessState> process;
};

// The shared pool (--pool), and where the process's latest checkpoint is.
struct PoolStatus {
  std::string name;
  bool background = false;
  uint64_t pending_checkpoints = 0;  // waiting to be published
  // The checkpoint of the last operation, when it succeeded and made one
  // that still exists: true when it is in the pool, false when it is
  // still waiting to be published there; nullopt otherwise. (The pool's
  // last error is not reported: it may name another user's checkpoint.)
  std::optional<bool> last_checkpoint_published;
};

// Checkpoints on a schedule (`checkpoint --every`).
struct ScheduleStatus {
  int64_t every_s = 0;
  int64_t next_in_s = 0;  // until the next one is due; 0: due now (or running)
  uint64_t runs = 0;      // scheduled checkpoints run so far
  uint64_t failures = 0;  // of those, failed
};

// A lazily restored tree whose memory is still coming in (RestoreRequest::
// lazy), as its lazy-pages server has read it so far.
struct LazyRestoreProgress {
  std::string id;  // the checkpoint it comes from
  // What the server has read (the page images, and the few small images
  // it reads first), with what the daemon copied in for it.
  uint64_t bytes = 0;
  uint64_t expected_bytes = 0;  // about all there is: the page images
  double seconds = 0;           // since the restore began
};

// "412.3 of about 1073.7 MB (38%), 0.4 s, 1030.8 MB/s".
std::string LazyProgressText(const LazyRestoreProgress& progress);

struct ProcessStatusReport {
  ProcessInfo process;
  GpuStatus gpu;
  std::optional<OperationInFlight> operation;  // nullopt: idle
  std::optional<OperationOutcome> last;        // nullopt: none ended yet
  std::optional<PoolStatus> pool;              // only with a shared pool
  std::optional<ScheduleStatus> schedule;      // nullopt: none
  std::optional<LazyRestoreProgress> lazy;     // nullopt: resident, or not lazy
  // What is kept of its checkpoints after each one: its schedule's rule,
  // else the daemon's (EngineOptions::retention); empty: all.
  RetentionRule retention;
  // What is kept of all its owner's checkpoints after each one: its
  // schedule's owner rule, else the daemon's
  // (EngineOptions::owner_retention); empty: all.
  RetentionRule owner_retention;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_PROCESS_STATUS_H_
