// Reading a small file that someone else may have written, as the daemon
// (root) does with what CRIU and cuda-checkpoint leave in a work directory
// that a user's CRIU could write to.
//
// The last path component is never followed (a planted symlink cannot
// redirect the read), the file is opened non-blocking and must be a regular
// file (a planted FIFO cannot block the daemon), and no more than the
// limit is read. The directories above must not be writable by others.
//
// Thread-safe (a free function).
#ifndef GPUCKPT_CORE_BASE_SMALL_FILE_H_
#define GPUCKPT_CORE_BASE_SMALL_FILE_H_

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "gpuckpt/status.h"

namespace gpuckpt {

// The whole of `path`: kNotFound when absent, kInvalidArgument when it is a
// symlink or not a regular file, kCorruption when larger than `max_bytes`.
Result<std::string> ReadSmallFileNoFollow(const std::string& path, size_t max_bytes);

struct SmallFileRead {
  SmallFileRead(std::string shown, size_t max_bytes)
      : shown(std::move(shown)), max_bytes(max_bytes) {}

  // The file as errors name it (a path as the user gave it).
  std::string shown;
  // Read no more; a larger file is refused with `too_large`. The size
  // fstat() reports is checked first, and the read stops there too, since
  // some files (sysfs) report a size that is not theirs.
  size_t max_bytes = 0;
  // kCorruption for a file a program wrote (CRIU's, sysfs), and
  // kInvalidArgument for one a user handed in.
  StatusCode too_large = StatusCode::kCorruption;
  // When set, the file must belong to this uid (kPermissionDenied).
  std::optional<uint32_t> owner;
};

// The whole of `name` in the directory `dir_fd` (AT_FDCWD: `name` is a
// path), under the same rules as ReadSmallFileNoFollow.
Result<std::string> ReadSmallFileNoFollowAt(int dir_fd, const std::string& name,
                                            const SmallFileRead& how);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_SMALL_FILE_H_
