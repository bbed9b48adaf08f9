// Requeueing a batch job through libslurm, as `scontrol requeue` does: the
// job's processes are ended and it waits in the queue to start again.
// A job's own user may requeue it (Slurm's rule).
//
// Thread-safety: libslurm's calls are made once per process (slurm_init);
// call from one thread.
#ifndef GPUCKPT_TOOLS_SLURM_JOB_REQUEUE_H_
#define GPUCKPT_TOOLS_SLURM_JOB_REQUEUE_H_

#include <cstdint>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Requeues job `job_id`; the error carries Slurm's words.
Status RequeueJob(uint32_t job_id);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_SLURM_JOB_REQUEUE_H_
