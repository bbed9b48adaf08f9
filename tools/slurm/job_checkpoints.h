// A Slurm job's checkpoints, taken, listed, restored and removed through a
// gpuckptfs mount by the job's own user, as any user does it by hand.
//
// A job's checkpoints are named slurm-<job id>-<n>, n counting up from 1
// over the job's life, requeues included; the daemon gives a non-root
// user's name the id <uid>.slurm-<job id>-<n>, so one user's job never
// sees or blocks another's. The mount shows each user only their own
// checkpoints, so whatever is listed here is the caller's.
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
  int number = 0;  // n of slurm-<job id>-<n>
};

class JobCheckpoints {
 public:
  JobCheckpoints(std::string mount, uint32_t job_id) : mount_(std::move(mount)), job_id_(job_id) {}

  // The job's checkpoints, oldest (lowest number) first. kNotFound when
  // `mount` shows no gpuckptfs (no checkpoints/ in it).
  Result<std::vector<JobCheckpoint>> List() const;

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
  Status Remove(const JobCheckpoint& checkpoint) const;

  // The name a checkpoint numbered `number` is given: slurm-<job id>-<n>.
  std::string NameOf(int number) const;

 private:
  // The id the daemon gives NameOf(number) for the caller.
  std::string IdOf(int number) const;

  std::string mount_;
  uint32_t job_id_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_SLURM_JOB_CHECKPOINTS_H_
