// What an ordinary user's `gpuckpt ls` and `stats` read: their own
// checkpoints, as a gpuckptfs mount shows them to them (the store itself is
// root's alone). Each is the checkpoint's manifest.json as the mount
// serves it: the same object as an entry of root's `gpuckpt ls --json`.
//
// Thread-safety: a free function with no state.
#ifndef GPUCKPT_TOOLS_GPUCKPT_MOUNT_LISTING_H_
#define GPUCKPT_TOOLS_GPUCKPT_MOUNT_LISTING_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// The manifests of the checkpoints listed under <mount>/checkpoints/, in
// the listing's order. kNotFound when `mount` shows no gpuckptfs; a
// checkpoint removed while it is read is left out.
Result<std::vector<nlohmann::json>> CheckpointsInMount(const std::string& mount);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_GPUCKPT_MOUNT_LISTING_H_
