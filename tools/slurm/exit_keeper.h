// The keeper: the root of the process tree that a job's checkpoints hold.
//
// A restored tree is not the child of the job that restores it (the
// daemon's CRIU made it), so no process of the new job can wait for it
// and learn how it ended. The keeper can: it runs the job's program as
// its child, is checkpointed and restored with it, and when the program
// ends writes how (its exit status or signal) to a status file in the
// job's working directory, which the job reads (ReadKeptStatus) once the
// keeper is gone. Signals sent to the keeper are passed on to the
// program, as a batch shell's would reach its script.
//
// Thread-safety: a process's main; single-threaded.
#ifndef GPUCKPT_TOOLS_SLURM_EXIT_KEEPER_H_
#define GPUCKPT_TOOLS_SLURM_EXIT_KEEPER_H_

#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Runs `command` (its first word a path, as execv takes it) as a child,
// waits for it, records how it ended in `status_file` (written whole, by
// rename, or not at all) and returns the exit code to end with: the
// program's, or 128 + its signal.
int RunKeeper(const std::string& status_file, const std::vector<std::string>& command);

// Writes `text` to `path` whole, by rename, or not at all: the keeper's
// status file, and the anchors' files beside it (job_anchor.h).
Status WriteFileWhole(const std::string& path, const std::string& text);

// Records exit code `code` in `status_file` as the keeper does, for
// ReadKeptStatus.
Status WriteKeptStatus(const std::string& status_file, int code);

// The exit code `status_file` records: the program's code, or 128 + the
// signal that ended it. kNotFound when there is none (the keeper was
// killed before its program ended).
Result<int> ReadKeptStatus(const std::string& status_file);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_SLURM_EXIT_KEEPER_H_
