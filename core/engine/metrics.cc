#include "core/engine/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>

#include "gpuckpt/version.h"

namespace gpuckpt {

const std::vector<std::string>& Metrics::Operations() {
  static const std::vector<std::string> kOperations = {"checkpoint", "restore", "import", "gc",
                                                       "command"};
  return kOperations;
}

const std::vector<std::string>& Metrics::Results() {
  static const std::vector<std::string> kResults = {"ok",        "busy",      "denied",
                                                    "not_found", "invalid",   "no_space",
                                                    "no_memory", "cancelled", "failed"};
  return kResults;
}

const std::vector<double>& Metrics::DurationBuckets() {
  // Frozen times of small processes are tens of milliseconds; checkpoints
  // of large GPU jobs take minutes, and a restore of one from a cold store
  // can take most of an hour.
  static const std::vector<double> kBuckets = {0.05, 0.1, 0.25, 0.5, 1,   2.5,  5,    10,
                                               30,   60,  120,  300, 600, 1200, 1800, 3600};
  return kBuckets;
}

void Metrics::Histogram::Observe(double seconds) {
  if (buckets.empty()) buckets.assign(DurationBuckets().size(), 0);
  const auto& bounds = DurationBuckets();
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), seconds);
  if (it != bounds.end()) ++buckets[static_cast<size_t>(it - bounds.begin())];
  sum += seconds;
  ++count;
}

Metrics::Metrics() {
  for (const auto& operation : Operations())
    for (const auto& result : Results()) operations_[{operation, result}] = 0;
  for (const auto& key : {std::pair<std::string, std::string>{"checkpoint", "dump"},
                          {"checkpoint", "commit"},
                          {"restore", "restore"}})
    stages_[key] = Histogram{};
}

void Metrics::CountOperation(const std::string& operation, const std::string& result) {
  MutexLock lock(&mu_);
  ++operations_[{operation, result}];
}

void Metrics::AddCheckpointBytes(uint64_t logical, uint64_t added, uint64_t stored) {
  MutexLock lock(&mu_);
  logical_bytes_ += logical;
  new_bytes_ += added;
  stored_bytes_ += stored;
}

void Metrics::ObserveStage(const std::string& operation, const std::string& stage, double seconds) {
  MutexLock lock(&mu_);
  stages_[{operation, stage}].Observe(seconds);
}

void Metrics::ObserveFrozen(double seconds) {
  MutexLock lock(&mu_);
  frozen_.Observe(seconds);
  frozen_last_ = seconds;
  frozen_max_ = std::max(frozen_max_, seconds);
}

void Metrics::RenderHistogram(const std::string& name, const std::string& labels,
                              const Histogram& h, std::string* out) {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  const auto& bounds = DurationBuckets();
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += h.buckets.empty() ? 0 : h.buckets[i];
    *out +=
        fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, bounds[i], cumulative);
  }
  *out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, h.count);
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  *out += fmt::format("{}_sum{} {:.6f}\n", name, braces, h.sum);
  *out += fmt::format("{}_count{} {}\n", name, braces, h.count);
}

namespace {

void Header(std::string* out, const char* name, const char* type, const char* help) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// A metric of one unlabelled series: its header and its value.
template <typename Value>
void Single(std::string* out, const char* name, const char* type, const char* help, Value value) {
  Header(out, name, type, help);
  if constexpr (std::is_floating_point_v<Value>) {
    *out += fmt::format("{} {:.6f}\n", name, value);
  } else {
    *out += fmt::format("{} {}\n", name, value);
  }
}

}  // namespace

namespace {

// The shared pool's counters (PoolStats), when the store has a pool.
void RenderPool(const PoolStats& pool, std::string* out) {
  Header(out, "gpuckpt_pool_pushes_total", "counter",
         "Checkpoints published in the shared pool, by result.");
  *out += fmt::format("gpuckpt_pool_pushes_total{{pool=\"{}\",result=\"ok\"}} {}\n", pool.pool,
                      pool.pushes);
  *out += fmt::format("gpuckpt_pool_pushes_total{{pool=\"{}\",result=\"failed\"}} {}\n", pool.pool,
                      pool.push_failures);
  Header(out, "gpuckpt_pool_pulls_total", "counter",
         "Checkpoints fetched from the shared pool into this store, by result.");
  *out += fmt::format("gpuckpt_pool_pulls_total{{pool=\"{}\",result=\"ok\"}} {}\n", pool.pool,
                      pool.pulls);
  *out += fmt::format("gpuckpt_pool_pulls_total{{pool=\"{}\",result=\"failed\"}} {}\n", pool.pool,
                      pool.pull_failures);
  auto single = [&](const char* name, const char* type, const char* help, uint64_t v) {
    Header(out, name, type, help);
    *out += fmt::format("{}{{pool=\"{}\"}} {}\n", name, pool.pool, v);
  };
  single("gpuckpt_pool_uploaded_chunks_total", "counter",
         "Chunks sent to the pool (those it lacked).", pool.uploaded_chunks);
  single("gpuckpt_pool_uploaded_bytes_total", "counter",
         "Stored (compressed) bytes of the chunks sent to the pool.", pool.uploaded_bytes);
  single("gpuckpt_pool_reused_chunks_total", "counter",
         "Chunks of published checkpoints that the pool had already.", pool.reused_chunks);
  single("gpuckpt_pool_fetched_chunks_total", "counter",
         "Chunks fetched from the pool (those this store lacked).", pool.fetched_chunks);
  single("gpuckpt_pool_fetched_bytes_total", "counter",
         "Stored (compressed) bytes of the chunks fetched from the pool.", pool.fetched_bytes);
  single("gpuckpt_pool_pending_checkpoints", "gauge",
         "Checkpoints durable here and waiting to be published in the pool (--pool-background).",
         pool.pending);
}

}  // namespace

void Metrics::ObserveLazyRestore(bool resident, uint64_t bytes, double seconds) {
  MutexLock lock(&mu_);
  if (resident) {
    ++lazy_resident_;
    lazy_bytes_ += bytes;
    lazy_seconds_.Observe(seconds);
  } else {
    ++lazy_killed_;
  }
}

void Metrics::AddLazyPagesCopied(bool on_fault, uint64_t bytes) {
  MutexLock lock(&mu_);
  (on_fault ? lazy_fault_bytes_ : lazy_background_bytes_) += bytes;
}

void Metrics::AddLazyCopyBatch() {
  MutexLock lock(&mu_);
  ++lazy_copy_batches_;
}

std::string Metrics::Render(const CacheStats& cache, const std::optional<StoreStats>& store,
                            const std::optional<PoolStats>& pool,
                            const LazyRestoreGauges& lazy) const {
  MutexLock lock(&mu_);
  std::string out;
  Header(&out, "gpuckpt_build_info", "gauge",
         "The running gpuckptfs: 1, labelled with its version and the commit it was built from.");
  out += fmt::format("gpuckpt_build_info{{version=\"{}\",commit=\"{}\"}} 1\n", GPUCKPT_VERSION,
                     GPUCKPT_COMMIT);
  Header(&out, "gpuckpt_operations_total", "counter",
         "Operations (checkpoint, restore, import, gc, command) by result.");
  for (const auto& [key, n] : operations_) {
    out += fmt::format("gpuckpt_operations_total{{operation=\"{}\",result=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  Single(&out, "gpuckpt_checkpoint_logical_bytes_total", "counter",
         "Logical bytes (image sizes) of successful checkpoints.", logical_bytes_);
  Single(&out, "gpuckpt_checkpoint_new_bytes_total", "counter",
         "Raw bytes of the chunks successful checkpoints added to the store.", new_bytes_);
  Single(&out, "gpuckpt_checkpoint_stored_bytes_total", "counter",
         "Stored (compressed) bytes of the chunks successful checkpoints added to the store.",
         stored_bytes_);
  Header(&out, "gpuckpt_stage_duration_seconds", "histogram",
         "Time spent in each stage of an operation (checkpoint: dump, commit; restore: restore).");
  for (const auto& [key, h] : stages_) {
    RenderHistogram("gpuckpt_stage_duration_seconds",
                    fmt::format("operation=\"{}\",stage=\"{}\"", key.first, key.second), h, &out);
  }
  Header(&out, "gpuckpt_checkpoint_frozen_seconds", "histogram",
         "How long successful checkpoints kept their job frozen (GPU processes: GPU lock to "
         "unlock; others: CRIU's freeze to resume).");
  RenderHistogram("gpuckpt_checkpoint_frozen_seconds", "", frozen_, &out);
  Single(&out, "gpuckpt_checkpoint_frozen_last_seconds", "gauge",
         "Frozen time of the latest checkpoint.", frozen_last_);
  Single(&out, "gpuckpt_checkpoint_frozen_max_seconds", "gauge",
         "Longest frozen time of any checkpoint.", frozen_max_);
  Header(&out, "gpuckpt_lazy_restores_total", "counter",
         "Lazy restores whose memory came in whole (resident), or whose trees were killed "
         "because it could not (killed).");
  out += fmt::format("gpuckpt_lazy_restores_total{{result=\"resident\"}} {}\n", lazy_resident_);
  out += fmt::format("gpuckpt_lazy_restores_total{{result=\"killed\"}} {}\n", lazy_killed_);
  Single(&out, "gpuckpt_lazy_restore_bytes_total", "counter",
         "Page-image bytes brought in by lazy restores whose trees became resident.", lazy_bytes_);
  Header(&out, "gpuckpt_lazy_restore_resident_seconds", "histogram",
         "Time from a lazy restore's start until its tree was resident.");
  RenderHistogram("gpuckpt_lazy_restore_resident_seconds", "", lazy_seconds_, &out);
  Header(&out, "gpuckpt_lazy_restore_copied_bytes_total", "counter",
         "Memory the daemon copied into lazily restored trees without GPUs, in answer to "
         "their page faults or ahead of them and in the background.");
  out += fmt::format("gpuckpt_lazy_restore_copied_bytes_total{{served=\"fault\"}} {}\n",
                     lazy_fault_bytes_);
  out += fmt::format("gpuckpt_lazy_restore_copied_bytes_total{{served=\"background\"}} {}\n",
                     lazy_background_bytes_);
  Single(&out, "gpuckpt_lazy_restore_copy_batches_total", "counter",
         "Batches of a background pass's ranges the daemon read and copied side by side, "
         "at the server's request.",
         lazy_copy_batches_);
  Single(&out, "gpuckpt_lazy_restores_in_flight", "gauge",
         "Lazily restored trees whose memory is still coming in.", lazy.trees);
  Single(&out, "gpuckpt_lazy_restore_in_flight_bytes", "gauge",
         "What the servers of those trees have read so far.", lazy.bytes_read);
  if (store) {
    Single(&out, "gpuckpt_store_snapshots", "gauge", "Checkpoints in the store.",
           store->snapshot_count);
    Single(&out, "gpuckpt_store_logical_bytes", "gauge",
           "Sum of the logical sizes of the checkpoints in the store.", store->logical_bytes);
    Single(&out, "gpuckpt_store_chunks", "gauge", "Unique chunks in the store.",
           store->chunk_count);
    Single(&out, "gpuckpt_store_unique_bytes", "gauge", "Raw bytes of the unique chunks.",
           store->unique_bytes);
    Single(&out, "gpuckpt_store_stored_bytes", "gauge",
           "Stored (compressed) bytes of the unique chunks.", store->stored_bytes);
    Single(&out, "gpuckpt_store_disk_bytes", "gauge",
           "What the store's directory takes on disk (packs, index, garbage not yet collected).",
           store->disk_bytes);
    Single(&out, "gpuckpt_store_spooled_bytes", "gauge",
           "Bytes of checkpoints made durable raw and not yet deduplicated and compressed "
           "(0 once the store has settled them).",
           store->spooled_bytes);
  }
  if (pool) RenderPool(*pool, &out);
  Header(&out, "gpuckpt_chunk_cache_requests_total", "counter", "Chunk cache lookups by readers.");
  out += fmt::format("gpuckpt_chunk_cache_requests_total{{result=\"hit\"}} {}\n", cache.hits);
  out += fmt::format("gpuckpt_chunk_cache_requests_total{{result=\"miss\"}} {}\n", cache.misses);
  Single(&out, "gpuckpt_chunk_cache_capacity_bytes", "gauge", "Configured size of the chunk cache.",
         cache.capacity_bytes);
  return out;
}

}  // namespace gpuckpt
