// Metrics: the engine's counters, rendered in the Prometheus text format
// (version 0.0.4) for the `metrics` file.
//
// Thread-safe (one mutex around plain counters; rendering copies them).
#ifndef GPUCKPT_CORE_ENGINE_METRICS_H_
#define GPUCKPT_CORE_ENGINE_METRICS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

class Metrics {
 public:
  // `operation` is "checkpoint", "restore" or "import"; `result` "ok" or an
  // error class ("busy", "denied", "failed", ...).
  void CountOperation(const std::string& operation, const std::string& result);
  void AddCheckpointBytes(uint64_t logical, uint64_t added, uint64_t stored);
  void ObserveStage(const std::string& operation, const std::string& stage, double seconds);
  // How long a successful checkpoint kept its job frozen (FrozenTime).
  void ObserveFrozen(double seconds);

  std::string Render(const CacheStats& cache) const;

 private:
  struct Summary {
    double sum = 0;
    uint64_t count = 0;
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> operations_;
  uint64_t logical_bytes_ = 0;
  uint64_t new_bytes_ = 0;
  uint64_t stored_bytes_ = 0;
  std::map<std::pair<std::string, std::string>, Summary> stages_;
  Summary frozen_;
  double frozen_last_ = 0;
  double frozen_max_ = 0;
};

// The label for a failed operation's Status ("busy", "denied", ...).
std::string ResultLabel(StatusCode code);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_METRICS_H_
