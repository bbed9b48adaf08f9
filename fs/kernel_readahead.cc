#include "fs/kernel_readahead.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/base/unique_fd.h"

namespace gpuckpt {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string digits = field.substr(i + 1, 3);
      if (digits.find_first_not_of("01234567") == std::string::npos) {
        out.push_back(static_cast<char>(std::strtol(digits.c_str(), nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

}  // namespace

Status SetMountReadAhead(const std::string& resolved_mountpoint, const std::string& fstype,
                         unsigned kib) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  if (!mountinfo) return Status::IOError("cannot read /proc/self/mountinfo");
  // The last match: a mount stacked on an older one at the same place.
  std::string device;
  for (std::string line; std::getline(mountinfo, line);) {
    std::istringstream fields(line);
    std::vector<std::string> before_dash;
    std::string f;
    while (fields >> f && f != "-") before_dash.push_back(f);
    std::string type;
    fields >> type;
    if (before_dash.size() < 5 || type != fstype) continue;
    if (Unescape(before_dash[4]) == resolved_mountpoint) device = before_dash[2];
  }
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
