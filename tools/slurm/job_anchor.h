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
// srun steps: each task of a step runs under an anchor of its own too
// (AnchorOptions::step), which checkpoints its task's tree, in its own
// series (job_checkpoints.h), when the step gets kStepCheckpointSignal,
// and restores it when the requeued job's script starts that step again.
// The batch script itself, which holds the steps' srun (connections to
// Slurm no checkpoint can keep), is not checkpointed while steps run: on
// the checkpoint signal the batch anchor has Slurm send
// kStepCheckpointSignal to every running step, waits for each task's
// answer (a file in the job's directory), and requeues the job once any
// task was checkpointed. The requeued job runs its script from the start;
// steps are known by their number (Slurm counts a job's steps from 0 in
// each run), so a script must start the same steps in the same order. A
// step task that ended on its own left a file saying how, and is not run
// again: it ends at once with that exit status. A step task's anchor that
// checkpointed its tree stays, so that srun does not return and the
// script does not go on, until Slurm ends the job.
//
// Thread-safety: a process's main; single-threaded.
#ifndef GPUCKPT_TOOLS_SLURM_JOB_ANCHOR_H_
#define GPUCKPT_TOOLS_SLURM_JOB_ANCHOR_H_

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpuckpt {

// The signal that has a step task's anchor checkpoint its tree with
// --kill. Slurm signals every process of a step, the user's included, so
// it is one whose default is to be ignored.
constexpr int kStepCheckpointSignal = SIGWINCH;

// A task of an srun step.
struct StepTask {
  uint32_t step_id = 0;
  uint32_t rank = 0;  // SLURM_PROCID
};

struct AnchorOptions {
  std::string mount;                 // gpuckptfs's mount point
  uint32_t job_id = 0;               // SLURM_JOB_ID
  int checkpoint_signal = 0;         // e.g. SIGUSR1
  std::chrono::seconds every{0};     // 0: no periodic checkpoints
  std::string keeper;                // this program's path, to run as the keeper
  std::string job_dir;               // where the job's files go (the batch step's cwd)
  std::optional<StepTask> step;      // nullopt: the batch step
  std::vector<std::string> command;  // the job's script (or step's program), and arguments
};

// Runs the job as above; returns the exit code for the batch step.
int RunAnchor(const AnchorOptions& options);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_SLURM_JOB_ANCHOR_H_
