// Retention: which of a process's checkpoints are kept after each new one
// (CheckpointRequest::retention, EngineOptions::retention). A plain value
// and a pure function over a process's series; the engine removes what it
// says (their chunks go at the next gc).
//
// The series is the process's checkpoints the engine named itself
// ("<pid>-<n>": its checkpoints, and the copies a restore imported for
// it). A checkpoint someone named (`--name`) is never removed by a rule:
// it was kept on purpose. The newest of the series is always kept.
// A rule of both kinds keeps what either keeps (as restic's `forget`).
#ifndef GPUCKPT_CORE_ENGINE_RETENTION_H_
#define GPUCKPT_CORE_ENGINE_RETENTION_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpuckpt {

struct RetentionRule {
  // Keep the newest this many (at least 1).
  std::optional<uint32_t> keep_last;
  // Keep those made at most this long ago.
  std::optional<std::chrono::seconds> keep_within;

  bool empty() const { return !keep_last && !keep_within; }
  // "keep last 3, within 1d", or "keep all".
  std::string ToString() const;
};

// One checkpoint of a series.
struct SeriesMember {
  std::string id;
  int64_t created_ns = 0;  // CLOCK_REALTIME
};

// "<P>-<N>", a name the engine gave, as (P, N); nullopt for any other id.
// Only the engine makes names of this form (CheckCheckpointName), so N
// stays far below 2^64.
std::optional<std::pair<std::string, uint64_t>> NumberedName(const std::string& id);

// Whether `id` is one the engine named itself for process `pid`: a member
// of its series.
bool IsSeriesName(const std::string& id, int pid);

// The ids of `series` (oldest first) that `rule` does not keep, as of
// `now_ns`; oldest first. Nothing for an empty rule.
std::vector<std::string> NotKept(const std::vector<SeriesMember>& series, const RetentionRule& rule,
                                 int64_t now_ns);

// "30s", "15m", "2h", "1d", "90m": the largest unit that divides `s`.
std::string DurationText(std::chrono::seconds s);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_RETENTION_H_
