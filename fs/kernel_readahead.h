// Kernel read-ahead of a FUSE mount.
//
// The kernel caps a FUSE mount's read-ahead at its default of 128 KiB
// whatever the filesystem asks for in its INIT reply (it keeps the smaller
// of the two), so a sequential reader of a cold checkpoint gets one or two
// 128 KiB requests in flight and waits on each. The cap lives in the
// mount's backing device info, /sys/class/bdi/<major>:<minor>/read_ahead_kb,
// which root may raise. Stateless; safe from any thread.
#ifndef GPUCKPT_FS_KERNEL_READAHEAD_H_
#define GPUCKPT_FS_KERNEL_READAHEAD_H_

#include <string>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Sets the read-ahead of the FUSE mount at `resolved_mountpoint` (an
// absolute path without symlinks, as /proc/self/mountinfo names it: resolve
// it before mounting) of type `fstype` (e.g. "fuse.gpuckptfs") to `kib`.
// Finds the mount in /proc/self/mountinfo and touches no path inside it:
// the mount's root must not be asked anything before its filesystem serves
// requests. kNotFound when no such mount is there; kIOError or
// kPermissionDenied when sysfs refuses.
Status SetMountReadAhead(const std::string& resolved_mountpoint, const std::string& fstype,
                         unsigned kib);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_KERNEL_READAHEAD_H_
