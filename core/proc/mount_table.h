// The mounts a process sees, from /proc/PID/mountinfo: where gpuckptfs
// checks that nothing is mounted where it would mount and finds its own
// mount's device, and which of a checkpointed process's mounts CRIU must
// leave out (gpuckpt's own FUSE mounts, which no dump can take).
//
// Stateless; safe from any thread.
#ifndef GPUCKPT_CORE_PROC_MOUNT_TABLE_H_
#define GPUCKPT_CORE_PROC_MOUNT_TABLE_H_

#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// The type of gpuckptfs's mounts in mountinfo ("fuse." and its subtype).
inline constexpr char kGpuckptMountType[] = "fuse.gpuckptfs";

struct MountEntry {
  std::string device;      // "major:minor"
  std::string root;        // unescaped: the directory of the filesystem mounted here
  std::string mountpoint;  // unescaped: an absolute path without symlinks
  std::string options;     // this mount's own options, e.g. "rw,nosuid,relatime"
  std::string type;        // e.g. "fuse.gpuckptfs"
  std::string source;      // unescaped
  // The filesystem's own options, e.g. "rw,memory" (a cgroup v1 hierarchy
  // names its controllers here).
  std::string super_options;
};

// Every mount, in mountinfo's order (a mount stacked on an older one at the
// same place comes after it). kIOError when the file cannot be read.
Result<std::vector<MountEntry>> ReadMountTable(const std::string& path = "/proc/self/mountinfo");

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_MOUNT_TABLE_H_
