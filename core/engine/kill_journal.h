// KillJournal: the processes a checkpoint may leave stopped or with their
// GPUs locked if the daemon dies during it (the tree of a `checkpoint
// --kill`, stopped from CRIU's dump until it is killed; a tree of several
// processes, whose GPU processes the backend locks before CRIU runs), one
// empty file each (<dir>/<pid>-<start time>), so that the next daemon
// repairs them: ResumeAll() sends SIGCONT to each that still exists (same
// pid and start time; SIGCONT to a running process changes nothing) and
// says which, for the caller to release their GPUs. The directory lives
// under the work dir (tmpfs /run): a reboot forgets it with the processes.
//
// Thread-safe: entries are separate files.
#ifndef GPUCKPT_CORE_ENGINE_KILL_JOURNAL_H_
#define GPUCKPT_CORE_ENGINE_KILL_JOURNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

class KillJournal {
 public:
  explicit KillJournal(std::string dir) : dir_(std::move(dir)) {}

  // Records that the tree `pids` (start times alongside) is about to be stopped.
  Status Add(const std::vector<int>& pids, const std::vector<uint64_t>& start_times);
  // Forgets them (killed or resumed).
  void Remove(const std::vector<int>& pids, const std::vector<uint64_t>& start_times);
  // Resumes every recorded process that still exists and is stopped, and
  // clears the journal. Returns the pids resumed (their GPU state, if any,
  // is still to be brought back: GpuBackend::Release).
  std::vector<int> ResumeAll();

 private:
  std::string Entry(int pid, uint64_t start_time) const;
  std::string dir_;
};

// The journal directory of the store in `store_dir` under `work_dir`: one
// per store, since daemons of different stores may share a work dir and
// must not resume (or forget) each other's stopped processes.
std::string KillJournalDir(const std::string& work_dir, const std::string& store_dir);

// 16 hex digits naming the store in `store_dir` among the stores whose
// daemons share a directory (the work dir, the state dir).
std::string StoreDirKey(const std::string& store_dir);

// SIGCONT to each of `pids` whose start time still matches.
// Sends SIGCONT to each of `pids` still alive with its recorded start time;
// returns those.
std::vector<int> ResumeProcesses(const std::vector<int>& pids,
                                 const std::vector<uint64_t>& start_times);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_KILL_JOURNAL_H_
