#include "fs/kernel_readahead.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "core/base/unique_fd.h"
#include "core/proc/mount_table.h"

namespace gpuckpt {

Status SetMountReadAhead(const std::string& resolved_mountpoint, const std::string& fstype,
                         unsigned kib) {
  GPUCKPT_ASSIGN_OR_RETURN(auto mounts, ReadMountTable());
  // The last match: a mount stacked on an older one at the same place.
  std::string device;
  for (const auto& m : mounts)
    if (m.type == fstype && m.mountpoint == resolved_mountpoint) device = m.device;
  if (device.empty()) {
    return Status::NotFound("no " + fstype + " mount at " + resolved_mountpoint);
  }
  if (device.find_first_not_of("0123456789:") != std::string::npos) {
    return Status::Internal("unexpected device '" + device + "' in /proc/self/mountinfo");
  }
  const std::string path = "/sys/class/bdi/" + device + "/read_ahead_kb";
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return StatusFromErrno(errno, "opening " + path);
  const std::string value = std::to_string(kib) + "\n";
  if (write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size())) {
    return StatusFromErrno(errno, "writing " + path);
  }
  return Status::Ok();
}

}  // namespace gpuckpt
