#include "core/engine/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace gpuckpt {

void Metrics::CountOperation(const std::string& operation, const std::string& result) {
  std::lock_guard lock(mu_);
  ++operations_[{operation, result}];
}

void Metrics::AddCheckpointBytes(uint64_t logical, uint64_t added, uint64_t stored) {
  std::lock_guard lock(mu_);
  logical_bytes_ += logical;
  new_bytes_ += added;
  stored_bytes_ += stored;
}

void Metrics::ObserveStage(const std::string& operation, const std::string& stage, double seconds) {
  std::lock_guard lock(mu_);
  Summary& s = stages_[{operation, stage}];
  s.sum += seconds;
  ++s.count;
}

void Metrics::ObserveFrozen(double seconds) {
  std::lock_guard lock(mu_);
  frozen_.sum += seconds;
  ++frozen_.count;
  frozen_last_ = seconds;
  frozen_max_ = std::max(frozen_max_, seconds);
}

std::string Metrics::Render(const CacheStats& cache) const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP gpuckpt_operations_total Checkpoints, restores and imports by result.\n";
  out += "# TYPE gpuckpt_operations_total counter\n";
  for (const auto& [key, n] : operations_) {
    out += fmt::format("gpuckpt_operations_total{{operation=\"{}\",result=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  out +=
      "# HELP gpuckpt_checkpoint_bytes_total Bytes of successful checkpoints: logical (image "
      "sizes), new (raw bytes of chunks they added), stored (those chunks compressed).\n";
  out += "# TYPE gpuckpt_checkpoint_bytes_total counter\n";
  out += fmt::format("gpuckpt_checkpoint_bytes_total{{kind=\"logical\"}} {}\n", logical_bytes_);
  out += fmt::format("gpuckpt_checkpoint_bytes_total{{kind=\"new\"}} {}\n", new_bytes_);
  out += fmt::format("gpuckpt_checkpoint_bytes_total{{kind=\"stored\"}} {}\n", stored_bytes_);
  out += "# HELP gpuckpt_stage_seconds Time spent in each stage of an operation.\n";
  out += "# TYPE gpuckpt_stage_seconds summary\n";
  for (const auto& [key, s] : stages_) {
    const std::string labels = fmt::format("operation=\"{}\",stage=\"{}\"", key.first, key.second);
    out += fmt::format("gpuckpt_stage_seconds_sum{{{}}} {:.6f}\n", labels, s.sum);
    out += fmt::format("gpuckpt_stage_seconds_count{{{}}} {}\n", labels, s.count);
  }
  out +=
      "# HELP gpuckpt_checkpoint_frozen_seconds How long successful checkpoints kept their job "
      "frozen (GPU processes: GPU lock to unlock; others: CRIU's freeze to resume).\n";
  out += "# TYPE gpuckpt_checkpoint_frozen_seconds summary\n";
  out += fmt::format("gpuckpt_checkpoint_frozen_seconds_sum {:.6f}\n", frozen_.sum);
  out += fmt::format("gpuckpt_checkpoint_frozen_seconds_count {}\n", frozen_.count);
  out += "# HELP gpuckpt_checkpoint_frozen_last_seconds Frozen time of the latest checkpoint.\n";
  out += "# TYPE gpuckpt_checkpoint_frozen_last_seconds gauge\n";
  out += fmt::format("gpuckpt_checkpoint_frozen_last_seconds {:.6f}\n", frozen_last_);
  out += "# HELP gpuckpt_checkpoint_frozen_max_seconds Longest frozen time of any checkpoint.\n";
  out += "# TYPE gpuckpt_checkpoint_frozen_max_seconds gauge\n";
  out += fmt::format("gpuckpt_checkpoint_frozen_max_seconds {:.6f}\n", frozen_max_);
  out += "# HELP gpuckpt_chunk_cache_requests_total Chunk cache lookups by readers.\n";
  out += "# TYPE gpuckpt_chunk_cache_requests_total counter\n";
  out += fmt::format("gpuckpt_chunk_cache_requests_total{{result=\"hit\"}} {}\n", cache.hits);
  out += fmt::format("gpuckpt_chunk_cache_requests_total{{result=\"miss\"}} {}\n", cache.misses);
  out += "# HELP gpuckpt_chunk_cache_capacity_bytes Configured size of the chunk cache.\n";
  out += "# TYPE gpuckpt_chunk_cache_capacity_bytes gauge\n";
  out += fmt::format("gpuckpt_chunk_cache_capacity_bytes {}\n", cache.capacity_bytes);
  return out;
}

std::string ResultLabel(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kBusy:
      return "busy";
    case StatusCode::kPermissionDenied:
      return "denied";
    case StatusCode::kNoSuchProcess:
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kInvalidArgument:
      return "invalid";
    case StatusCode::kNoSpace:
      return "no_space";
    case StatusCode::kNoMemory:
      return "no_memory";
    default:
      return "failed";
  }
}

}  // namespace gpuckpt
