#include "tools/gpuckpt/mount_listing.h"

#include <dirent.h>

#include <cerrno>

#include "core/base/small_file.h"

namespace gpuckpt {
namespace {

// A manifest is a few KB; a bound all the same.
constexpr size_t kMaxManifestBytes = 1 << 20;

}  // namespace

Result<std::vector<nlohmann::json>> CheckpointsInMount(const std::string& mount) {
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
  std::vector<nlohmann::json> manifests;
  for (const std::string& id : ids) {
    const std::string path = dir_path + "/" + id + "/manifest.json";
    auto text = ReadSmallFileNoFollow(path, kMaxManifestBytes);
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
      return text.status();
    }
    nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!manifest.is_object()) return Status::Corruption(path + " is not a JSON object");
    manifests.push_back(std::move(manifest));
  }
  return manifests;
}

}  // namespace gpuckpt
