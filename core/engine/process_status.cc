#include "core/engine/process_status.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace gpuckpt {

std::optional<int> OperationInFlight::Percent() const {
  if (expected_bytes == 0) return std::nullopt;
  const double share = 100.0 * static_cast<double>(bytes) / static_cast<double>(expected_bytes);
  return std::min(99, static_cast<int>(share));
}

std::optional<double> OperationInFlight::EtaSeconds() const {
  // Only the stages that read the bytes counted have a pace to go by.
  if (stage != "dump" && stage != "restore") return std::nullopt;
  if (expected_bytes == 0 || bytes == 0 || bytes >= expected_bytes) return std::nullopt;
  return stage_elapsed_s * static_cast<double>(expected_bytes - bytes) / static_cast<double>(bytes);
}

std::string StageWords(const std::string& stage) {
  if (stage == "starting") return "preparing";
  if (stage == "gpu") return "moving device memory to the host";
  if (stage == "dump") return "copying memory";
  if (stage == "store") return "making it durable";
  if (stage == "restore") return "restoring memory";
  return stage;
}

std::string ProgressText(const OperationInFlight& op) {
  const double mb = static_cast<double>(op.bytes) / 1e6;
  std::string out = StageWords(op.stage) + ", ";
  if (auto percent = op.Percent(); percent)
    out += fmt::format("{:.1f} of about {:.1f} MB ({}%)", mb,
                       static_cast<double>(op.expected_bytes) / 1e6, *percent);
  else
    out += fmt::format("{:.1f} MB read", mb);
  out += fmt::format(", {:.1f} s", op.elapsed_s);
  if (auto eta = op.EtaSeconds(); eta) out += fmt::format(", about {:.0f} s left", std::ceil(*eta));
  return out;
}

std::string LazyProgressText(const LazyRestoreProgress& progress) {
  const uint64_t expected = std::max(progress.expected_bytes, uint64_t{1});
  const uint64_t done = std::min(progress.bytes, expected);
  return fmt::format("{:.1f} of about {:.1f} MB ({}%), {:.1f} s, {:.1f} MB/s", done / 1e6,
                     progress.expected_bytes / 1e6, done * 100 / expected, progress.seconds,
                     progress.seconds > 0 ? done / 1e6 / progress.seconds : 0.0);
}

}  // namespace gpuckpt
