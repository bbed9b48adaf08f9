#include "core/gpu/kfd_topology.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "core/base/display_text.h"
#include "core/base/small_file.h"

namespace gpuckpt {
namespace {

// sysfs hands out at most one page per attribute; 64 KiB is the largest page
// size Linux runs with (arm64, ppc64). More than that is not KFD.
constexpr size_t kMaxFileBytes = 64 * 1024;

// HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC / _PRIVATE (hsakmttypes.h): device-local
// memory, host-visible through the BAR or not. 0 is system memory.
constexpr uint64_t kHeapTypeFbPublic = 1;
constexpr uint64_t kHeapTypeFbPrivate = 2;

constexpr uint32_t kAmdPciVendorId = 0x1002;

// The whole of a sysfs attribute. NotFound / PermissionDenied come from
// StatusFromErrno and let callers decide to skip a node.
Result<std::string> ReadBounded(const std::string& path) {
  return ReadSmallFileNoFollowAt(AT_FDCWD, path, SmallFileRead(path, kMaxFileBytes));
}

bool IsSkippable(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kPermissionDenied;
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// A name read from sysfs as it will be shown: its first line, trailing
// whitespace dropped, bytes that are not printable ASCII replaced, so a
// hostile file cannot put terminal escapes into `gpuckpt status`.
std::string CleanName(std::string_view raw) {
  raw = raw.substr(0, raw.find('\n'));
  raw = TrimRight(raw);
  std::string out(raw);
  for (char& c : out) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  return out;
}

bool ParseDecimal(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Numbers in the topology: directory names "0", "1", ...; anything else in
// nodes/ or mem_banks/ is not ours to read.
std::vector<int> ListNumberedEntries(DIR* dir) {
  std::vector<int> numbers;
  while (struct dirent* e = ::readdir(dir)) {
    std::string_view name(e->d_name);
    if (name.empty() || name.size() > 9) continue;
    if (!std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    int n = 0;
    std::from_chars(name.data(), name.data() + name.size(), n);
    numbers.push_back(n);
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

class DirCloser {
 public:
  explicit DirCloser(DIR* d) : d_(d) {}
  ~DirCloser() {
    if (d_ != nullptr) ::closedir(d_);
  }
  DirCloser(const DirCloser&) = delete;
  DirCloser& operator=(const DirCloser&) = delete;

 private:
  DIR* d_;
};

// A property that KFD writes with %u: values above 2^32 mean the file is not
// what it claims to be.
Result<uint32_t> Get32(const std::map<std::string, uint64_t>& props, const std::string& key,
                       const std::string& path) {
  auto it = props.find(key);
  if (it == props.end()) return uint32_t{0};
  if (it->second > std::numeric_limits<uint32_t>::max()) {
    return Status::Corruption(path + ": " + key + " " + std::to_string(it->second) +
                              " does not fit in 32 bits");
  }
  return static_cast<uint32_t>(it->second);
}

uint64_t Get64(const std::map<std::string, uint64_t>& props, const std::string& key) {
  auto it = props.find(key);
  return it == props.end() ? 0 : it->second;
}

Result<std::map<std::string, uint64_t>> ReadProperties(const std::string& path) {
  GPUCKPT_ASSIGN_OR_RETURN(std::string text, ReadBounded(path));
  auto props = ParseKfdProperties(text);
  if (!props.ok()) return Status::Corruption(path + ": " + props.status().message());
  return props;
}

// gfx_target_version is major * 10000 + minor * 100 + stepping (90010 for
// gfx90a); LLVM writes minor and stepping as one hex digit each.
std::string GfxTargetName(uint32_t version) {
  if (version == 0) return "";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "gfx%u%x%x", version / 10000, (version / 100) % 100,
                version % 100);
  return buf;
}

// Sum of the frame-buffer banks under node_dir/mem_banks. A bank whose
// properties vanished is skipped (hot-unplug race); nullopt when the node
// became unreadable to us.
Result<std::optional<uint64_t>> ReadVram(const std::string& node_dir) {
  const std::string banks_dir = node_dir + "/mem_banks";
  DIR* dir = ::opendir(banks_dir.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return std::optional<uint64_t>(0);
    Status s = StatusFromErrno(errno, "opendir " + banks_dir);
    if (s.code() == StatusCode::kPermissionDenied) return std::optional<uint64_t>();
    return s;
  }
  DirCloser closer(dir);
  uint64_t total = 0;
  for (int bank : ListNumberedEntries(dir)) {
    const std::string path = banks_dir + "/" + std::to_string(bank) + "/properties";
    auto props = ReadProperties(path);
    if (!props.ok()) {
      if (props.status().code() == StatusCode::kNotFound) continue;
      if (props.status().code() == StatusCode::kPermissionDenied) return std::optional<uint64_t>();
      return props.status();
    }
    uint64_t heap = Get64(*props, "heap_type");
    if (heap != kHeapTypeFbPublic && heap != kHeapTypeFbPrivate) continue;
    uint64_t size = Get64(*props, "size_in_bytes");
    if (size > std::numeric_limits<uint64_t>::max() - total) {
      return Status::Corruption(banks_dir + ": frame buffer banks add up to more than 2^64 bytes");
    }
    total += size;
  }
  return std::optional<uint64_t>(total);
}

// One node; nullopt for a CPU node or one we must skip (see the header).
Result<std::optional<KfdGpu>> ReadNode(const std::string& sysfs_root, const std::string& nodes_dir,
                                       int node) {
  const std::string dir = nodes_dir + "/" + std::to_string(node);
  KfdGpu gpu;
  gpu.node = node;

  const std::string gpu_id_path = dir + "/gpu_id";
  auto gpu_id_text = ReadBounded(gpu_id_path);
  if (!gpu_id_text.ok()) {
    if (IsSkippable(gpu_id_text.status())) return std::optional<KfdGpu>();
    return gpu_id_text.status();
  }
  uint64_t gpu_id = 0;
  std::string_view id_text = TrimRight(*gpu_id_text);
  if (!ParseDecimal(id_text, &gpu_id) || gpu_id > std::numeric_limits<uint32_t>::max()) {
    return Status::Corruption(gpu_id_path + ": " + QuotedExcerpt(id_text) +
                              " is not a decimal 32-bit gpu id");
  }
  // CPU nodes have gpu_id 0. Their properties are not read at all: nothing
  // in them is needed, so nothing in them can fail a GPU checkpoint.
  if (gpu_id == 0) return std::optional<KfdGpu>();
  gpu.gpu_id = static_cast<uint32_t>(gpu_id);

  const std::string props_path = dir + "/properties";
  auto props = ReadProperties(props_path);
  if (!props.ok()) {
    if (IsSkippable(props.status())) return std::optional<KfdGpu>();
    return props.status();
  }
  GPUCKPT_ASSIGN_OR_RETURN(gpu.vendor_id, Get32(*props, "vendor_id", props_path));
  GPUCKPT_ASSIGN_OR_RETURN(gpu.device_id, Get32(*props, "device_id", props_path));
  GPUCKPT_ASSIGN_OR_RETURN(gpu.drm_render_minor, Get32(*props, "drm_render_minor", props_path));
  GPUCKPT_ASSIGN_OR_RETURN(uint32_t gfx_version, Get32(*props, "gfx_target_version", props_path));
  gpu.gfx_target = GfxTargetName(gfx_version);
  if (uint64_t unique_id = Get64(*props, "unique_id"); unique_id != 0) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "GPU-%016" PRIx64, unique_id);
    gpu.uuid = buf;
  }

  auto name = ReadBounded(dir + "/name");
  if (name.ok()) {
    gpu.kfd_name = CleanName(*name);
  } else if (name.status().code() == StatusCode::kPermissionDenied) {
    return std::optional<KfdGpu>();
  } else if (name.status().code() != StatusCode::kNotFound) {
    return name.status();
  }

  GPUCKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> vram, ReadVram(dir));
  if (!vram.has_value()) return std::optional<KfdGpu>();
  gpu.vram_bytes = *vram;

  // Decoration only: a board without a FRU EEPROM, or a DRM tree we cannot
  // read, leaves the marketing name empty and fails nothing.
  if (gpu.drm_render_minor != 0) {
    auto product = ReadBounded(sysfs_root + "/class/drm/renderD" +
                               std::to_string(gpu.drm_render_minor) + "/device/product_name");
    if (product.ok()) gpu.marketing_name = CleanName(*product);
  }
  gpu.name = gpu.marketing_name.empty() ? gpu.kfd_name : gpu.marketing_name;
  return std::optional<KfdGpu>(std::move(gpu));
}

}  // namespace

Result<std::map<std::string, uint64_t>> ParseKfdProperties(std::string_view text) {
  std::map<std::string, uint64_t> props;
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);

    line = TrimRight(line);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty()) continue;

    const std::string where = "line " + std::to_string(line_no) + ": ";
    size_t sep = line.find_first_of(" \t");
    if (sep == std::string_view::npos) {
      return Status::InvalidArgument(where + "expected \"key value\", got " + QuotedExcerpt(line));
    }
    std::string_view key = line.substr(0, sep);
    std::string_view value = line.substr(sep);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
      value.remove_prefix(1);
    }
    if (!std::all_of(key.begin(), key.end(), IsKeyChar)) {
      return Status::InvalidArgument(where + "key " + QuotedExcerpt(key) +
                                     " has characters other than [A-Za-z0-9_]");
    }
    if (value.find_first_of(" \t") != std::string_view::npos) {
      return Status::InvalidArgument(where + "expected \"key value\", got " + QuotedExcerpt(line));
    }
    if (!std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return Status::InvalidArgument(where + "value " + QuotedExcerpt(value) + " of " +
                                     QuotedExcerpt(key) + " is not a decimal number");
    }
    uint64_t v = 0;
    if (!ParseDecimal(value, &v)) {
      return Status::InvalidArgument(where + "value " + QuotedExcerpt(value) + " of " +
                                     QuotedExcerpt(key) + " does not fit in 64 bits");
    }
    if (!props.emplace(std::string(key), v).second) {
      return Status::InvalidArgument(where + QuotedExcerpt(key) + " appears twice");
    }
  }
  return props;
}

Result<std::vector<KfdGpu>> ReadKfdTopology(const std::string& sysfs_root) {
  const std::string nodes_dir = sysfs_root + "/class/kfd/kfd/topology/nodes";
  DIR* dir = ::opendir(nodes_dir.c_str());
  if (dir == nullptr) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return Status::NotFound("no KFD topology at " + nodes_dir +
                              " (amdgpu driver not loaded, or no AMD GPU)");
    }
    return StatusFromErrno(err, "opendir " + nodes_dir);
  }
  std::vector<int> nodes;
  {
    DirCloser closer(dir);
    nodes = ListNumberedEntries(dir);
  }
  std::vector<KfdGpu> gpus;
  for (int node : nodes) {
    GPUCKPT_ASSIGN_OR_RETURN(std::optional<KfdGpu> gpu, ReadNode(sysfs_root, nodes_dir, node));
    if (gpu.has_value()) gpus.push_back(std::move(*gpu));
  }
  return gpus;
}

std::string KfdGpuDisplayName(const KfdGpu& gpu) {
  std::string arch = !gpu.gfx_target.empty() ? gpu.gfx_target
                     : !gpu.kfd_name.empty() ? gpu.kfd_name
                                             : std::string("AMD GPU");
  char ids[32];
  std::snprintf(ids, sizeof(ids), "%04x:%04x", gpu.vendor_id, gpu.device_id);
  if (!gpu.marketing_name.empty()) return gpu.marketing_name + " (" + arch + ", " + ids + ")";
  return arch + " (" + (gpu.vendor_id == kAmdPciVendorId ? "AMD " : "") + ids + ")";
}

}  // namespace gpuckpt
