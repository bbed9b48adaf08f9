// A Slurm job's checkpoints, taken, listed, restored and removed through a
// gpuckptfs mount by the job's own user, as any user does it by hand.
//
// A job's checkpoints come in series: its batch step's, slurm-<job id>,
// and one for each task of each srun step, slurm-<job id>.<step>.<rank>.
// Each checkpoint is named <series>-<n>, n counting up from 1 over the
// job's life, requeues included; the daemon gives a non-root user's name
// the id <uid>.<name>, so one user's job never sees or blocks another's.
// The mount shows each user only their own checkpoints, so whatever is
// listed here is the caller's.
//
// Thread-safety: stateless beyond its two constants; calls may run
// concurrently, though two checkpoints of one job at once would race for
// a number (the daemon refuses the second name: kAlreadyExists).
#ifndef GPUCKPT_TOOLS_SLURM_JOB_CHECKPOINTS_H_
#define GPUCKPT_TOOLS_SLURM_JOB_CHECKPOINTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

struct JobCheckpoint {
  std::string id;  // its directory's name under <mount>/checkpoints/
  int number = 0;  // n of <series>-<n>
};

// The series of a job's batch step, and of task `rank` of its step `step`.
std::string BatchSeries(uint32_t job_id);
std::string StepSeries(uint32_t job_id, uint32_t step, uint32_t rank);

class JobCheckpoints {
 public:
  // The checkpoints of `series` (BatchSeries, StepSeries).
  JobCheckpoints(std::string mount, std::string series)
      : mount_(std::move(mount)), series_(std::move(series)) {}

  // The series' checkpoints, oldest (lowest number) first. kNotFound when
  // `mount` shows no gpuckptfs (no checkpoints/ in it).
  Result<std::vector<JobCheckpoint>> List() const;

  // Every checkpoint of job `job_id`'s steps' series (not the batch's):
  // what a job that ended needs no more.
  static Result<std::vector<JobCheckpoint>> ListSteps(const std::string& mount, uint32_t job_id);

  // Checkpoints the tree of process `pid` as number `number`, through
  // <mount>/<pid>/ctl; with `kill` the tree is ended once the checkpoint
  // is stored. Blocks until the daemon is done. The error says why, in the
  // daemon's words where it gave some.
  Result<JobCheckpoint> Take(int pid, int number, bool kill) const;

  // Restores `checkpoint` into the caller's own cgroups (restore
  // --join-cgroup), so that the restored tree is the caller's job's;
  // returns the restored root's pid.
  Result<int> Restore(const JobCheckpoint& checkpoint) const;

  // Removes `checkpoint` (its chunks go at the daemon's next gc).
  Status Remove(const JobCheckpoint& checkpoint) const { return RemoveFrom(mount_, checkpoint); }
  static Status RemoveFrom(const std::string& mount, const JobCheckpoint& checkpoint);

  // The name a checkpoint numbered `number` is given: <series>-<n>.
  std::string NameOf(int number) const;

 private:
  // The id the daemon gives NameOf(number) for the caller.
  std::string IdOf(int number) const;

  std::string mount_;
  std::string series_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_SLURM_JOB_CHECKPOINTS_H_
