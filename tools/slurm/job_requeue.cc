#include "tools/slurm/job_requeue.h"

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include <string>

namespace gpuckpt {

Status RequeueJob(uint32_t job_id) {
  static const bool initialized = [] {
    slurm_init(nullptr);  // reads SLURM_CONF, or Slurm's default slurm.conf
    return true;
  }();
  (void)initialized;
  if (slurm_requeue(job_id, 0) != SLURM_SUCCESS) {
    const int error = slurm_get_errno();
    return Status::Unavailable("Slurm did not requeue job " + std::to_string(job_id) + ": " +
                               slurm_strerror(error));
  }
  return Status::Ok();
}

}  // namespace gpuckpt
