#include "core/proc/mount_table.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

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

Result<std::vector<MountEntry>> ReadMountTable(const std::string& path) {
  std::ifstream mountinfo(path);
  if (!mountinfo) return Status::IOError("cannot read " + path);
  std::vector<MountEntry> mounts;
  // Fields: id parent major:minor root MOUNTPOINT options... - TYPE SOURCE SUPER_OPTIONS
  for (std::string line; std::getline(mountinfo, line);) {
    std::istringstream fields(line);
    std::vector<std::string> before_dash;
    std::string f;
    while (fields >> f && f != "-") before_dash.push_back(f);
    if (before_dash.size() < 6) continue;
    MountEntry m;
    m.device = before_dash[2];
    m.root = Unescape(before_dash[3]);
    m.mountpoint = Unescape(before_dash[4]);
    m.options = before_dash[5];
    std::string source;
    fields >> m.type >> source >> m.super_options;
    m.source = Unescape(source);
    mounts.push_back(std::move(m));
  }
  return mounts;
}

}  // namespace gpuckpt
