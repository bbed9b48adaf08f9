// The checkpoints a gpuckptfs mount lists to its caller, read as any user
// reads them: the ids under <mount>/checkpoints/. For the tools that work
// through the mount as the user who runs them (gpuckpt's ls for ordinary
// users, gpuckpt-slurm).
//
// Thread-safety: a free function with no state.
#ifndef GPUCKPT_TOOLS_COMMON_MOUNT_CHECKPOINTS_H_
#define GPUCKPT_TOOLS_COMMON_MOUNT_CHECKPOINTS_H_

#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// The ids listed under <mount>/checkpoints/, in the listing's order.
// kNotFound, saying so, when `mount` shows no gpuckptfs.
Result<std::vector<std::string>> CheckpointIdsInMount(const std::string& mount);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_COMMON_MOUNT_CHECKPOINTS_H_
