// Metrics: the engine's counters, rendered in the Prometheus text format
// (version 0.0.4) for the `metrics` file. One metric per meaning (logical,
// new and stored checkpoint bytes are separate counters, never labels of
// one: their sum means nothing); durations are histograms with buckets
// from 50 ms to an hour; every operation's series are there, at zero, from
// the start, so that rate() and alerts see the first failure.
//
// Thread-safe (one mutex around plain counters; rendering copies them).
#ifndef GPUCKPT_CORE_ENGINE_METRICS_H_
#define GPUCKPT_CORE_ENGINE_METRICS_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/mutex.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

// The lazy restores whose trees are still coming in.
struct LazyRestoreGauges {
  uint64_t trees = 0;
  uint64_t bytes_read = 0;  // by their servers so far
};

class Metrics {
 public:
  // The operations and results every gpuckpt_operations_total series is
  // shown for (at zero until one happens).
  static const std::vector<std::string>& Operations();
  static const std::vector<std::string>& Results();
  // Upper bounds of the duration histograms' buckets, in seconds.
  static const std::vector<double>& DurationBuckets();

  Metrics();

  // `operation` is one of Operations(); `result` "ok" or ResultLabel().
  void CountOperation(const std::string& operation, const std::string& result) EXCLUDES(mu_);
  void AddCheckpointBytes(uint64_t logical, uint64_t added, uint64_t stored) EXCLUDES(mu_);
  // `operation`/`stage`: checkpoint/dump, checkpoint/commit, restore/restore.
  void ObserveStage(const std::string& operation, const std::string& stage, double seconds)
      EXCLUDES(mu_);
  // How long a successful checkpoint kept its job frozen (FrozenTime).
  void ObserveFrozen(double seconds) EXCLUDES(mu_);

  // A lazy restore's server ended: its tree `resident`, or killed; the
  // page images' `bytes`, `seconds` since the restore began.
  void ObserveLazyRestore(bool resident, uint64_t bytes, double seconds) EXCLUDES(mu_);
  // The daemon copied `bytes` into a lazily restored tree, in answer to a
  // page fault of it (`on_fault`) or not (ahead of its faults, or in the
  // background).
  void AddLazyPagesCopied(bool on_fault, uint64_t bytes) EXCLUDES(mu_);
  // ... of which a batch of a background pass's ranges (counted apart too).
  void AddLazyCopyBatch() EXCLUDES(mu_);

  // `store`: the store's totals, where known.
  std::string Render(const CacheStats& cache, const std::optional<StoreStats>& store,
                     const std::optional<PoolStats>& pool, const LazyRestoreGauges& lazy = {}) const
      EXCLUDES(mu_);

 private:
  struct Histogram {
    std::vector<uint64_t> buckets;  // per bound of DurationBuckets(), not cumulative
    double sum = 0;
    uint64_t count = 0;
    void Observe(double seconds);
  };
  static void RenderHistogram(const std::string& name, const std::string& labels,
                              const Histogram& h, std::string* out);

  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> operations_ GUARDED_BY(mu_);
  uint64_t logical_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t new_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t stored_bytes_ GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::string, std::string>, Histogram> stages_ GUARDED_BY(mu_);
  Histogram frozen_ GUARDED_BY(mu_);
  double frozen_last_ GUARDED_BY(mu_) = 0;
  double frozen_max_ GUARDED_BY(mu_) = 0;
  uint64_t lazy_resident_ GUARDED_BY(mu_) = 0;
  uint64_t lazy_killed_ GUARDED_BY(mu_) = 0;
  uint64_t lazy_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t lazy_fault_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t lazy_background_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t lazy_copy_batches_ GUARDED_BY(mu_) = 0;
  Histogram lazy_seconds_ GUARDED_BY(mu_);
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_METRICS_H_
