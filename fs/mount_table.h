// The mounts this process sees, from /proc/self/mountinfo: where gpuckptfs
// checks that nothing is mounted where it would mount, and finds its own
// mount's device (kernel_readahead).
//
// Stateless; safe from any thread.
#ifndef GPUCKPT_FS_MOUNT_TABLE_H_
#define GPUCKPT_FS_MOUNT_TABLE_H_

#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

struct MountEntry {
  std::string device;      // "major:minor"
  std::string mountpoint;  // unescaped: an absolute path without symlinks
  std::string type;        // e.g. "fuse.gpuckpt"
  std::string source;      // unescaped
};

// Every mount, in mountinfo's order (a mount stacked on an older one at the
// same place comes after it). kIOError when the file cannot be read.
Result<std::vector<MountEntry>> ReadMountTable(const std::string& path = "/proc/self/mountinfo");

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_MOUNT_TABLE_H_
