#include "tools/gpuckpt/mount_listing.h"

#include "core/base/small_file.h"
#include "tools/common/mount_checkpoints.h"

namespace gpuckpt {
namespace {

// A manifest is a few KB; a bound all the same.
constexpr size_t kMaxManifestBytes = 1 << 20;

}  // namespace

Result<std::vector<nlohmann::json>> CheckpointsInMount(const std::string& mount) {
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<std::string> ids, CheckpointIdsInMount(mount));
  const std::string dir_path = mount + "/checkpoints";
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
