#include "tools/common/mount_checkpoints.h"

#include <dirent.h>

#include <cerrno>

namespace gpuckpt {

Result<std::vector<std::string>> CheckpointIdsInMount(const std::string& mount) {
  const std::string dir_path = mount + "/checkpoints";
  DIR* dir = opendir(dir_path.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT || errno == ENOTDIR)
      return Status::NotFound("no gpuckptfs mount at " + mount + " (no " + dir_path + ")");
    return StatusFromErrno(errno, "listing " + dir_path);
  }
  std::vector<std::string> ids;
  errno = 0;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") ids.push_back(name);
  }
  const int read_error = errno;
  closedir(dir);
  if (read_error != 0) return StatusFromErrno(read_error, "listing " + dir_path);
  return ids;
}

}  // namespace gpuckpt
