// The anchor: what a --gpuckpt batch job runs in place of its script, as
// the batch step's task, for the job's whole life.
//
// On start it restores the job's latest checkpoint (JobCheckpoints), or,
// where there is none or it cannot be restored (saying why), starts the
// script anew under a keeper (exit_keeper.h). It then waits:
//  - for the checkpoint signal (the job's --signal=B:SIG, which Slurm sends
//    before preemption with PreemptParameters=send_user_signal and before
//    the time limit): it checkpoints the tree with --kill and requeues the
//    job; where that checkpoint fails and an earlier one exists, the job
//    is requeued to go back to that one; otherwise it runs on;
//  - every `every`, when set: a checkpoint that leaves the tree running;
//  - for the tree to end: it removes the job's checkpoints and ends with
//    the script's exit status;
//  - any other signal is passed on to the tree (the batch shell's).
// After each new checkpoint the older ones go. What it does is said on
// stderr (the job's output), one line each, starting "gpuckpt-slurm:".
//
// Thread-safety: a process's main; single-threaded.
#ifndef GPUCKPT_TOOLS_SLURM_JOB_ANCHOR_H_
#define GPUCKPT_TOOLS_SLURM_JOB_ANCHOR_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gpuckpt {

struct AnchorOptions {
  std::string mount;                 // gpuckptfs's mount point
  uint32_t job_id = 0;               // SLURM_JOB_ID
  int checkpoint_signal = 0;         // e.g. SIGUSR1
  std::chrono::seconds every{0};     // 0: no periodic checkpoints
  std::string keeper;                // this program's path, to run as the keeper
  std::string status_file;           // where the keeper records the exit status
  std::vector<std::string> command;  // the job's script and its arguments
};

// Runs the job as above; returns the exit code for the batch step.
int RunAnchor(const AnchorOptions& options);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_SLURM_JOB_ANCHOR_H_
