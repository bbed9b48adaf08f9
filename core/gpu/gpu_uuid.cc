#include "core/gpu/gpu_uuid.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>

#include "core/base/display_text.h"

namespace gpuckpt {
namespace {

constexpr std::string_view kUuidForm = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
constexpr std::string_view kMapForm = "OLD=NEW[,OLD=NEW...]";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsDashPosition(size_t i) { return i == 8 || i == 13 || i == 18 || i == 23; }

}  // namespace

Result<GpuUuid> ParseGpuUuid(std::string_view text) {
  auto invalid = [&] {
    return Status::InvalidArgument(
        fmt::format("invalid GPU UUID {}: expected {} (hex)", QuotedExcerpt(text), kUuidForm));
  };
  std::string_view s = text;
  if (s.size() >= 4 && (s[0] == 'G' || s[0] == 'g') && (s[1] == 'P' || s[1] == 'p') &&
      (s[2] == 'U' || s[2] == 'u') && s[3] == '-') {
    s.remove_prefix(4);
  }
  if (s.size() != 36) return invalid();
  GpuUuid uuid{};
  size_t nibble = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (IsDashPosition(i)) {
      if (s[i] != '-') return invalid();
      continue;
    }
    int v = HexValue(s[i]);
    if (v < 0) return invalid();
    uuid[nibble / 2] = static_cast<uint8_t>(uuid[nibble / 2] | (nibble % 2 == 0 ? v << 4 : v));
    ++nibble;
  }
  return uuid;
}

std::string FormatGpuUuid(const GpuUuid& u) {
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
      "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
      u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
      u[15]);
}

Result<std::vector<GpuUuidPair>> ParseGpuMap(std::string_view text) {
  if (Trim(text).empty()) {
    return Status::InvalidArgument(fmt::format("empty GPU map: expected {}", kMapForm));
  }
  std::vector<GpuUuidPair> map;
  size_t index = 0;
  std::string_view rest = text;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view entry = Trim(rest.substr(0, comma));
    ++index;
    if (entry.empty()) {
      return Status::InvalidArgument(fmt::format("GPU map {}: entry {} is empty; expected {}",
                                                 QuotedExcerpt(text), index, kMapForm));
    }
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos || entry.find('=', eq + 1) != std::string_view::npos) {
      return Status::InvalidArgument(
          fmt::format("GPU map entry {}: expected OLD=NEW (one '=')", QuotedExcerpt(entry)));
    }
    Result<GpuUuid> old_uuid = ParseGpuUuid(Trim(entry.substr(0, eq)));
    if (!old_uuid.ok())
      return old_uuid.status().WithContext(fmt::format("GPU map entry {}", index));
    Result<GpuUuid> new_uuid = ParseGpuUuid(Trim(entry.substr(eq + 1)));
    if (!new_uuid.ok())
      return new_uuid.status().WithContext(fmt::format("GPU map entry {}", index));
    for (const GpuUuidPair& p : map) {
      if (p.old_uuid == *old_uuid) {
        return Status::InvalidArgument(
            fmt::format("GPU map names old GPU {} twice", FormatGpuUuid(*old_uuid)));
      }
      if (p.new_uuid == *new_uuid) {
        return Status::InvalidArgument(
            fmt::format("GPU map moves two GPUs onto new GPU {}", FormatGpuUuid(*new_uuid)));
      }
    }
    map.push_back({*old_uuid, *new_uuid});
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return map;
}

std::string FormatGpuMap(const std::vector<GpuUuidPair>& map) {
  std::string out;
  for (const GpuUuidPair& p : map) {
    if (!out.empty()) out += ',';
    out += FormatGpuUuid(p.old_uuid);
    out += '=';
    out += FormatGpuUuid(p.new_uuid);
  }
  return out;
}

}  // namespace gpuckpt
