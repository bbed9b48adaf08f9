#include "core/proc/memory_headroom.h"

#include <algorithm>
#include <charconv>
#include <cstddef>

#include "core/base/small_file.h"

namespace gpuckpt {
namespace {

// Bounds on what is read: a number file holds one line; memory.stat a few
// dozen; mountinfo one line per mount (thousands in a busy container).
constexpr size_t kMaxValueFileBytes = 4096;
constexpr size_t kMaxStatFileBytes = 64 * 1024;
constexpr size_t kMaxProcCgroupBytes = 64 * 1024;
constexpr size_t kMaxMountinfoBytes = 4 << 20;
constexpr size_t kMaxCgroupPathBytes = 4096;
// cgroup v1 shows "no limit" as the largest page counter in bytes (2^63
// less a page on x86-64); no machine has an exabyte of memory.
constexpr uint64_t kV1Unlimited = uint64_t{1} << 60;

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// A whole decimal number (surrounding white space allowed); nullopt when
// `s` is anything else or does not fit 64 bits.
std::optional<uint64_t> ParseNumber(std::string_view s) {
  s = Trim(s);
  if (s.empty()) return std::nullopt;
  uint64_t value = 0;
  const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (err != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

// Calls `fn(line)` for every line of `text`.
template <typename Fn>
void ForEachLine(std::string_view text, Fn fn) {
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    fn(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    const size_t at = s.find(sep);
    parts.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

// mountinfo writes space, tab, newline and backslash in paths as "\ooo".
std::string DecodeMountinfoPath(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string_view digits = s.substr(i + 1, 3);
      if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out.push_back(
            static_cast<char>((digits[0] - '0') * 64 + (digits[1] - '0') * 8 + (digits[2] - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

// The value of `key` in memory.stat text ("key value" lines).
std::optional<uint64_t> StatValue(std::string_view stat, std::string_view key) {
  std::optional<uint64_t> found;
  ForEachLine(stat, [&](std::string_view line) {
    if (found || line.size() <= key.size() || line.substr(0, key.size()) != key ||
        line[key.size()] != ' ') {
      return;
    }
    found = ParseNumber(line.substr(key.size() + 1));
  });
  return found;
}

std::optional<uint64_t> ReadNumberFile(const std::string& path) {
  auto text = ReadSmallFileNoFollow(path, kMaxValueFileBytes);
  if (!text.ok()) return std::nullopt;
  return ParseNumber(*text);
}

// The limit of the cgroup in `dir`, or nullopt for none (or none readable).
std::optional<uint64_t> ReadLimit(const std::string& dir, MemoryCgroup::Version version) {
  if (version == MemoryCgroup::Version::kV2) {
    auto text = ReadSmallFileNoFollow(dir + "/memory.max", kMaxValueFileBytes);
    if (!text.ok() || Trim(*text) == "max") return std::nullopt;
    return ParseNumber(*text);
  }
  auto limit = ReadNumberFile(dir + "/memory.limit_in_bytes");
  if (!limit || *limit >= kV1Unlimited) return std::nullopt;
  return limit;
}

// What the cgroup in `dir` holds, less its inactive page cache.
uint64_t ReadUsed(const std::string& dir, MemoryCgroup::Version version) {
  const bool v2 = version == MemoryCgroup::Version::kV2;
  const uint64_t usage =
      ReadNumberFile(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes")).value_or(0);
  uint64_t inactive_file = 0;
  if (auto stat = ReadSmallFileNoFollow(dir + "/memory.stat", kMaxStatFileBytes); stat.ok()) {
    // v1's memory.stat has the cgroup's own counts and, as total_*, those
    // of its subtree, which is what usage_in_bytes counts; v2's are the
    // subtree's.
    inactive_file = StatValue(*stat, v2 ? "inactive_file" : "total_inactive_file").value_or(0);
  }
  return usage - std::min(usage, inactive_file);
}

}  // namespace

Result<uint64_t> ParseMemAvailable(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  std::optional<std::string_view> field;
  ForEachLine(meminfo, [&](std::string_view line) {
    if (!field && line.substr(0, kKey.size()) == kKey) field = Trim(line.substr(kKey.size()));
  });
  if (!field) return Status::NotFound("/proc/meminfo has no MemAvailable line");
  std::string_view number = *field;
  uint64_t unit = 1;
  if (number.size() >= 2 && number.substr(number.size() - 2) == "kB") {
    unit = 1024;
    number.remove_suffix(2);
  }
  const std::optional<uint64_t> value = ParseNumber(number);
  if (!value || *value > UINT64_MAX / unit) {
    return Status::IOError("/proc/meminfo: MemAvailable does not parse: '" + std::string(*field) +
                           "'");
  }
  return *value * unit;
}

Result<uint64_t> ReadMemAvailable(const std::string& proc_root) {
  constexpr size_t kMaxMeminfoBytes = 64 * 1024;
  GPUCKPT_ASSIGN_OR_RETURN(std::string text,
                           ReadSmallFileNoFollow(proc_root + "/meminfo", kMaxMeminfoBytes));
  return ParseMemAvailable(text);
}

CgroupMounts ParseCgroupMounts(std::string_view mountinfo) {
  CgroupMounts mounts;
  ForEachLine(mountinfo, [&](std::string_view line) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    const std::vector<std::string_view> f = Split(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (dash - f.begin() < 6 || f.end() - dash < 4) return;
    const std::string_view fstype = dash[1];
    if (fstype == "cgroup2" && mounts.v2_dir.empty()) {
      mounts.v2_dir = DecodeMountinfoPath(f[4]);
      mounts.v2_root = DecodeMountinfoPath(f[3]);
    } else if (fstype == "cgroup" && mounts.v1_memory_dir.empty()) {
      const auto options = Split(dash[3], ',');
      if (std::find(options.begin(), options.end(), "memory") == options.end()) return;
      mounts.v1_memory_dir = DecodeMountinfoPath(f[4]);
      mounts.v1_memory_root = DecodeMountinfoPath(f[3]);
    }
  });
  return mounts;
}

CgroupMounts FindCgroupMounts(const std::string& proc_root) {
  auto text = ReadSmallFileNoFollow(proc_root + "/self/mountinfo", kMaxMountinfoBytes);
  if (!text.ok()) return CgroupMounts{};
  return ParseCgroupMounts(*text);
}

bool IsSafeCgroupPath(std::string_view path) {
  if (path.empty() || path.front() != '/' || path.size() > kMaxCgroupPathBytes) return false;
  if (path.find('\0') != std::string_view::npos) return false;
  if (path == "/") return true;
  for (std::string_view part : Split(path.substr(1), '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

std::optional<MemoryCgroup> ParseMemoryCgroup(std::string_view proc_cgroup,
                                              const CgroupMounts& mounts) {
  std::optional<std::string_view> v1_path, v2_path;
  ForEachLine(proc_cgroup, [&](std::string_view line) {
    // ID:CONTROLLERS:PATH; the path may hold ':' itself.
    const size_t first = line.find(':');
    if (first == std::string_view::npos) return;
    const size_t second = line.find(':', first + 1);
    if (second == std::string_view::npos) return;
    const std::string_view id = line.substr(0, first);
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string_view path = line.substr(second + 1);
    if (id == "0" && controllers.empty()) {
      if (!v2_path) v2_path = path;
      return;
    }
    const auto names = Split(controllers, ',');
    if (!v1_path && std::find(names.begin(), names.end(), "memory") != names.end()) v1_path = path;
  });
  MemoryCgroup cgroup;
  if (!mounts.v1_memory_dir.empty() && v1_path) {
    cgroup.version = MemoryCgroup::Version::kV1;
    cgroup.path = std::string(*v1_path);
  } else if (!mounts.v2_dir.empty() && v2_path) {
    cgroup.version = MemoryCgroup::Version::kV2;
    cgroup.path = std::string(*v2_path);
  } else {
    return std::nullopt;
  }
  if (!IsSafeCgroupPath(cgroup.path)) return std::nullopt;
  return cgroup;
}

std::optional<uint64_t> HeadroomOf(const CgroupLimits& limits) {
  std::optional<uint64_t> least;
  for (const auto& l : limits) least = std::min(least.value_or(UINT64_MAX), l.headroom_bytes());
  return least;
}

CgroupLimits ReadCgroupLimits(const CgroupMounts& mounts, const MemoryCgroup& cgroup) {
  const bool v2 = cgroup.version == MemoryCgroup::Version::kV2;
  const std::string& dir = v2 ? mounts.v2_dir : mounts.v1_memory_dir;
  const std::string& root = v2 ? mounts.v2_root : mounts.v1_memory_root;
  if (dir.empty() || !IsSafeCgroupPath(cgroup.path) || !IsSafeCgroupPath(root)) return {};
  // The part of the path below the mount's top; a cgroup outside the
  // mounted subtree cannot be seen.
  std::string below = cgroup.path;
  if (root != "/") {
    if (cgroup.path == root) {
      // (assign, not = "/": GCC 12 at -O3 warns of a memcpy overlap that
      // cannot happen, -Wrestrict, its bug 105329)
      below.assign(1, '/');
    } else if (cgroup.path.size() > root.size() && cgroup.path.starts_with(root) &&
               cgroup.path[root.size()] == '/') {
      below = cgroup.path.substr(root.size());
    } else {
      return {};
    }
  }
  CgroupLimits limits;
  while (true) {
    const std::string level_dir = below == "/" ? dir : dir + below;
    if (auto limit = ReadLimit(level_dir, cgroup.version)) {
      const std::string name = root == "/" ? below : below == "/" ? root : root + below;
      limits.push_back({name, *limit, ReadUsed(level_dir, cgroup.version)});
    }
    if (below == "/") break;
    const size_t slash = below.rfind('/');
    below = slash == 0 ? "/" : below.substr(0, slash);
  }
  return limits;
}

CgroupLimits ReadProcessMemoryLimits(const std::string& pid, const MemoryReadOptions& options) {
  if (pid != "self" && (pid.empty() || !std::all_of(pid.begin(), pid.end(),
                                                    [](char c) { return c >= '0' && c <= '9'; }))) {
    return {};
  }
  const CgroupMounts mounts =
      options.cgroup_mounts ? *options.cgroup_mounts : FindCgroupMounts(options.proc_root);
  auto text = ReadSmallFileNoFollow(options.proc_root + "/" + pid + "/cgroup", kMaxProcCgroupBytes);
  if (!text.ok()) return {};
  const std::optional<MemoryCgroup> cgroup = ParseMemoryCgroup(*text, mounts);
  if (!cgroup) return {};
  return ReadCgroupLimits(mounts, *cgroup);
}

}  // namespace gpuckpt
