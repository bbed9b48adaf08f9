#include "tools/slurm/job_control.h"

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include <algorithm>
#include <string>

namespace gpuckpt {
namespace {

void InitSlurmOnce() {
  static const bool initialized = [] {
    slurm_init(nullptr);  // reads SLURM_CONF, or Slurm's default slurm.conf
    return true;
  }();
  (void)initialized;
}

std::string SlurmError() { return slurm_strerror(slurm_get_errno()); }

}  // namespace

Status RequeueJob(uint32_t job_id) {
  InitSlurmOnce();
  if (slurm_requeue(job_id, 0) != SLURM_SUCCESS)
    return Status::Unavailable("Slurm did not requeue job " + std::to_string(job_id) + ": " +
                               SlurmError());
  return Status::Ok();
}

Result<std::vector<RunningStep>> RunningSteps(uint32_t job_id) {
  InitSlurmOnce();
  job_step_info_response_msg_t* response = nullptr;
  if (slurm_get_job_steps(0, job_id, NO_VAL, &response, SHOW_ALL) != SLURM_SUCCESS)
    return Status::Unavailable("Slurm did not list the steps of job " + std::to_string(job_id) +
                               ": " + SlurmError());
  std::vector<RunningStep> steps;
  for (uint32_t i = 0; i < response->job_step_count; ++i) {
    const job_step_info_t& step = response->job_steps[i];
    // The batch, extern and interactive steps have ids above these.
    if (step.step_id.step_id > SLURM_MAX_NORMAL_STEP_ID) continue;
    if (step.state != JOB_RUNNING) continue;
    steps.push_back({step.step_id.step_id, step.num_tasks});
  }
  slurm_free_job_step_info_response_msg(response);
  std::sort(steps.begin(), steps.end(),
            [](const RunningStep& a, const RunningStep& b) { return a.step_id < b.step_id; });
  return steps;
}

Status SignalStep(uint32_t job_id, uint32_t step_id, int signal) {
  InitSlurmOnce();
  if (slurm_signal_job_step(job_id, step_id, static_cast<uint32_t>(signal)) != SLURM_SUCCESS)
    return Status::Unavailable("Slurm did not signal step " + std::to_string(job_id) + "." +
                               std::to_string(step_id) + ": " + SlurmError());
  return Status::Ok();
}

}  // namespace gpuckpt
