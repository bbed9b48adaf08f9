#include "core/manifest/checkpoint_manifest.h"

#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace gpuckpt {
namespace {

using nlohmann::json;

// The largest pid Linux hands out (PID_MAX_LIMIT): a range naming a larger
// one names no process of the checkpoint.
constexpr int64_t kMaxPid = 1 << 22;

// Reads the fields of one JSON object, each checked for its type; what does
// not fit is recorded in `dropped` under `prefix` and read as absent.
class FieldReader {
 public:
  FieldReader(const json& object, std::string prefix, std::vector<std::string>* dropped)
      : object_(object), prefix_(std::move(prefix)), dropped_(dropped) {}

  const json* Find(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }

  void Drop(const std::string& key) const { dropped_->push_back(prefix_ + key); }

  template <typename T>
  std::optional<T> Get(const char* key) const {
    const json* j = Find(key);
    if (j == nullptr) return std::nullopt;
    if (std::optional<T> v = As<T>(*j)) return v;
    Drop(key);
    return std::nullopt;
  }

  // An object member, or nullptr (absent, or dropped as not an object).
  const json* Object(const char* key) const {
    const json* j = Find(key);
    if (j == nullptr) return nullptr;
    if (j->is_object()) return j;
    Drop(key);
    return nullptr;
  }

  // An array member, or nullptr (absent, or dropped as not an array).
  const json* Array(const char* key) const {
    const json* j = Find(key);
    if (j == nullptr) return nullptr;
    if (j->is_array()) return j;
    Drop(key);
    return nullptr;
  }

  template <typename T>
  static std::optional<T> As(const json& j) {
    if constexpr (std::is_same_v<T, bool>) {
      if (j.is_boolean()) return j.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (j.is_string()) return j.get<std::string>();
    } else if constexpr (std::is_same_v<T, double>) {
      if (j.is_number()) return j.get<double>();
    } else if constexpr (std::is_signed_v<T>) {
      if (j.is_number_integer()) {
        const int64_t v = j.get<int64_t>();
        if (v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max())
          return static_cast<T>(v);
      }
    } else {
      if (j.is_number_unsigned()) {
        const uint64_t v = j.get<uint64_t>();
        if (v <= std::numeric_limits<T>::max()) return static_cast<T>(v);
      }
    }
    return std::nullopt;
  }

  const std::string& prefix() const { return prefix_; }
  std::vector<std::string>* dropped() const { return dropped_; }

 private:
  const json& object_;
  std::string prefix_;
  std::vector<std::string>* dropped_;
};

std::optional<ManifestIds> ReadIds(const FieldReader& in, const char* key) {
  const json* j = in.Object(key);
  if (j == nullptr) return std::nullopt;
  FieldReader ids(*j, in.prefix() + key + ".", in.dropped());
  auto uid = ids.Get<uint32_t>("uid"), gid = ids.Get<uint32_t>("gid");
  // Half an identity is none: the whole record is dropped.
  if (!uid || !gid) {
    in.Drop(key);
    return std::nullopt;
  }
  return ManifestIds{*uid, *gid};
}

std::optional<ManifestMaker> ReadMaker(const FieldReader& in) {
  std::optional<ManifestIds> ids = ReadIds(in, "made_by");
  if (!ids) return std::nullopt;
  ManifestMaker maker{ids->uid, ids->gid, {}};
  const json& j = *in.Find("made_by");
  FieldReader fields(j, in.prefix() + "made_by.", in.dropped());
  if (const json* groups = fields.Array("groups")) {
    for (size_t i = 0; i < groups->size(); ++i) {
      if (auto g = FieldReader::As<uint32_t>((*groups)[i]))
        maker.groups.push_back(*g);
      else
        fields.Drop(fmt::format("groups[{}]", i));
    }
  }
  return maker;
}

std::vector<ManifestGpu> ReadGpus(const FieldReader& in) {
  std::vector<ManifestGpu> out;
  const json* gpus = in.Array("gpus");
  if (gpus == nullptr) return out;
  for (size_t i = 0; i < gpus->size(); ++i) {
    const json& g = (*gpus)[i];
    const std::string path = fmt::format("gpus[{}]", i);
    if (!g.is_object()) {
      in.Drop(path);
      continue;
    }
    FieldReader fields(g, in.prefix() + path + ".", in.dropped());
    std::optional<std::string> uuid = fields.Get<std::string>("uuid");
    if (!uuid) {
      in.Drop(path);
      continue;
    }
    out.push_back({fields.Get<std::string>("name").value_or(""), *uuid,
                   fields.Get<uint64_t>("memory_bytes")});
  }
  return out;
}

std::vector<ManifestDeviceRange> ReadDeviceRanges(const FieldReader& in) {
  std::vector<ManifestDeviceRange> out;
  const json* device = in.Object("device");
  if (device == nullptr) return out;
  FieldReader device_fields(*device, in.prefix() + "device.", in.dropped());
  const json* ranges = device_fields.Array("cuda_host_ranges");
  if (ranges == nullptr) return out;
  for (size_t i = 0; i < ranges->size(); ++i) {
    const json& r = (*ranges)[i];
    std::optional<int64_t> pid;
    std::optional<uint64_t> start, end;
    if (r.is_object()) {
      if (auto it = r.find("pid"); it != r.end()) pid = FieldReader::As<int64_t>(*it);
      if (auto it = r.find("start"); it != r.end()) start = FieldReader::As<uint64_t>(*it);
      if (auto it = r.find("end"); it != r.end()) end = FieldReader::As<uint64_t>(*it);
    }
    if (!pid || !start || !end || *pid <= 0 || *pid > kMaxPid || *end <= *start) {
      device_fields.Drop(fmt::format("cuda_host_ranges[{}]", i));
      continue;
    }
    out.push_back({static_cast<int>(*pid), *start, *end});
  }
  return out;
}

std::optional<ManifestStages> ReadStages(const FieldReader& in) {
  const json* j = in.Object("stages");
  if (j == nullptr) return std::nullopt;
  FieldReader fields(*j, in.prefix() + "stages.", in.dropped());
  ManifestStages stages;
  stages.dump_s = fields.Get<double>("dump_s").value_or(0);
  stages.frozen_s = fields.Get<double>("frozen_s");
  stages.frozen_by = fields.Get<std::string>("frozen_by").value_or("");
  stages.criu_frozen_s = fields.Get<double>("criu_frozen_s");
  return stages;
}

std::optional<ManifestMountNamespace> ReadMountNamespace(const FieldReader& in) {
  const json* j = in.Object("mount_namespace");
  if (j == nullptr) return std::nullopt;
  FieldReader fields(*j, in.prefix() + "mount_namespace.", in.dropped());
  ManifestMountNamespace ns;
  // null is the recorded "not known"; only another type is malformed.
  if (const json* root = fields.Find("root"); root != nullptr && !root->is_null())
    ns.root = fields.Get<std::string>("root");
  return ns;
}

std::optional<ManifestContainer> ReadContainer(const FieldReader& in) {
  const json* j = in.Object("container");
  if (j == nullptr) return std::nullopt;
  FieldReader fields(*j, in.prefix() + "container.", in.dropped());
  return ManifestContainer{fields.Get<std::string>("name"), fields.Get<std::string>("id"),
                           fields.Get<std::string>("image")};
}

void PutIfSet(json& out, const char* key, const auto& value) {
  if (value) out[key] = *value;
}

}  // namespace

std::string_view CheckpointModeName(CheckpointMode mode) {
  return mode == CheckpointMode::kKill ? "kill" : "leave-running";
}

ManifestMaker CheckpointManifest::MakerOrOwner() const {
  if (made_by) return *made_by;
  const ManifestIds o = OwnerOrRoot();
  return ManifestMaker{o.uid, o.gid, {}};
}

std::string EncodeManifest(const CheckpointManifest& m) {
  json out = json::object();
  out["version"] = kManifestVersion;
  out["pid"] = m.pid;
  PutIfSet(out, "command", m.command);
  if (m.owner) out["owner"] = {{"uid", m.owner->uid}, {"gid", m.owner->gid}};
  if (m.made_by)
    out["made_by"] = {
        {"uid", m.made_by->uid}, {"gid", m.made_by->gid}, {"groups", m.made_by->groups}};
  if (!m.tree.empty()) out["tree"] = m.tree;
  if (m.mode) out["mode"] = CheckpointModeName(*m.mode);
  PutIfSet(out, "shell_job", m.shell_job);
  PutIfSet(out, "criu_version", m.criu_version);
  if (m.gpu_backend) out["gpu_backend"] = GpuStacksName(*m.gpu_backend);
  PutIfSet(out, "driver_version", m.driver_version);
  PutIfSet(out, "lock_timeout_ms", m.lock_timeout_ms);
  if (m.mount_namespace)
    out["mount_namespace"] = {
        {"root", m.mount_namespace->root ? json(*m.mount_namespace->root) : json()}};
  json gpus = json::array();
  for (const auto& g : m.gpus) {
    json gpu = {{"name", g.name}, {"uuid", g.uuid}};
    if (g.memory_bytes) gpu["memory_bytes"] = *g.memory_bytes;
    gpus.push_back(std::move(gpu));
  }
  out["gpus"] = std::move(gpus);
  PutIfSet(out, "device_memory_bytes", m.device_memory_bytes);
  PutIfSet(out, "parent", m.parent);
  if (!m.cuda_host_ranges.empty()) {
    json ranges = json::array();
    for (const auto& r : m.cuda_host_ranges)
      ranges.push_back({{"pid", r.pid}, {"start", r.start}, {"end", r.end}});
    out["device"] = {{"cuda_host_ranges", std::move(ranges)}};
  }
  PutIfSet(out, "device_error", m.device_error);
  if (m.stages) {
    json stages = {{"dump_s", m.stages->dump_s}};
    if (m.stages->frozen_s) {
      stages["frozen_s"] = *m.stages->frozen_s;
      stages["frozen_by"] = m.stages->frozen_by;
    }
    PutIfSet(stages, "criu_frozen_s", m.stages->criu_frozen_s);
    out["stages"] = std::move(stages);
  }
  PutIfSet(out, "staging_memory_bytes", m.staging_memory_bytes);
  PutIfSet(out, "imported_from", m.imported_from);
  if (m.imported_by_restore) out["imported_by_restore"] = true;
  if (!m.import_dropped.empty()) out["import_dropped"] = m.import_dropped;
  if (m.container) {
    json c = json::object();
    PutIfSet(c, "name", m.container->name);
    PutIfSet(c, "id", m.container->id);
    PutIfSet(c, "image", m.container->image);
    out["container"] = std::move(c);
  }
  return out.dump();
}

Result<CheckpointManifest> DecodeManifest(std::string_view text) {
  CheckpointManifest m;
  if (text.empty()) {
    m.version = 1;
    return m;
  }
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Corruption("the checkpoint manifest is not a JSON object");
  const FieldReader in(j, "", &m.dropped);
  m.version = in.Get<int>("version").value_or(1);
  if (m.version > kManifestVersion)
    return Status::Unavailable(fmt::format(
        "the checkpoint manifest is of version {}, newer than this gpuckpt reads (up to {})",
        m.version, kManifestVersion));
  m.pid = in.Get<int>("pid").value_or(0);
  m.command = in.Get<std::string>("command");
  m.owner = ReadIds(in, "owner");
  m.made_by = ReadMaker(in);
  if (const json* tree = in.Array("tree")) {
    for (size_t i = 0; i < tree->size(); ++i) {
      if (auto pid = FieldReader::As<int>((*tree)[i]))
        m.tree.push_back(*pid);
      else
        in.Drop(fmt::format("tree[{}]", i));
    }
  }
  if (auto mode = in.Get<std::string>("mode")) {
    if (*mode == "kill")
      m.mode = CheckpointMode::kKill;
    else if (*mode == "leave-running")
      m.mode = CheckpointMode::kLeaveRunning;
    else
      in.Drop("mode");
  }
  m.shell_job = in.Get<bool>("shell_job");
  m.criu_version = in.Get<std::string>("criu_version");
  if (auto backend = in.Get<std::string>("gpu_backend")) {
    m.gpu_backend = ParseGpuStacks(*backend);
    if (!m.gpu_backend) in.Drop("gpu_backend");
  }
  m.driver_version = in.Get<std::string>("driver_version");
  m.lock_timeout_ms = in.Get<uint32_t>("lock_timeout_ms");
  m.mount_namespace = ReadMountNamespace(in);
  m.gpus = ReadGpus(in);
  m.device_memory_bytes = in.Get<uint64_t>("device_memory_bytes");
  m.parent = in.Get<std::string>("parent");
  m.cuda_host_ranges = ReadDeviceRanges(in);
  m.device_error = in.Get<std::string>("device_error");
  m.stages = ReadStages(in);
  m.staging_memory_bytes = in.Get<uint64_t>("staging_memory_bytes");
  m.imported_from = in.Get<std::string>("imported_from");
  m.imported_by_restore = in.Get<bool>("imported_by_restore").value_or(false);
  if (const json* paths = in.Array("import_dropped")) {
    for (size_t i = 0; i < paths->size(); ++i) {
      if (auto path = FieldReader::As<std::string>((*paths)[i]))
        m.import_dropped.push_back(std::move(*path));
      else
        in.Drop(fmt::format("import_dropped[{}]", i));
    }
  }
  m.container = ReadContainer(in);
  return m;
}

CheckpointManifest ManifestOrEmpty(std::string_view json_text) {
  Result<CheckpointManifest> m = DecodeManifest(json_text);
  if (m.ok()) return std::move(m).value();
  CheckpointManifest nobody;
  // Not known to be gpuckpt's own dump: nothing is granted on its word.
  nobody.imported_from = "";
  return nobody;
}

}  // namespace gpuckpt
