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

#include <cstddef>
#include <string>

#include "gpuckpt/status.h"

namespace gpuckpt {

// The whole of `path`: kNotFound when absent, kInvalidArgument when it is a
// symlink or not a regular file, kCorruption when larger than `max_bytes`.
Result<std::string> ReadSmallFileNoFollow(const std::string& path, size_t max_bytes);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_SMALL_FILE_H_
