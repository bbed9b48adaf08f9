// A job's controls on Slurm's side, through libslurm, as scontrol and
// scancel use them: requeueing the job, listing its running steps and
// signalling one. A job's own user may do each (Slurm's rule).
//
// Thread-safety: libslurm is set up once per process (slurm_init); call
// from one thread.
#ifndef GPUCKPT_TOOLS_SLURM_JOB_CONTROL_H_
#define GPUCKPT_TOOLS_SLURM_JOB_CONTROL_H_

#include <cstdint>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Requeues job `job_id`: its processes are ended and it waits in the queue
// to start again. The error carries Slurm's words.
Status RequeueJob(uint32_t job_id);

// One step that `srun` started in a job.
struct RunningStep {
  uint32_t step_id = 0;
  uint32_t tasks = 0;  // its task count, over all its nodes
};

// The job's running srun steps (not its batch or extern step), by id.
Result<std::vector<RunningStep>> RunningSteps(uint32_t job_id);

// Sends `signal` to every process of step `step_id` of the job, on each of
// its nodes (Slurm signals a step's whole process tree).
Status SignalStep(uint32_t job_id, uint32_t step_id, int signal);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_SLURM_JOB_CONTROL_H_
