#include "tools/common/pool_options.h"

#include <chrono>

namespace gpuckpt {

void DeclarePoolOptions(CLI::App& app, const std::string& pool_help, PoolCommandLine* line) {
  app.add_option("--pool", line->pool.pool, pool_help);
  app.add_option("--ceph-conf", line->pool.ceph_conf,
                 "The ceph.conf of the pool's cluster (default: librados's search, "
                 "/etc/ceph/ceph.conf)");
  app.add_option("--ceph-id", line->pool.ceph_id,
                 "The Ceph user (without client.) whose key gives access to the pool "
                 "(default: admin)");
  app.add_option("--pool-timeout", line->timeout_s,
                 "Seconds one pool operation may take before it fails with ETIMEDOUT")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--pool-gc-grace", line->gc_grace_s,
                 "Seconds a chunk of the pool that no checkpoint names stays marked before gc "
                 "deletes it, and how old an unneeded object must be before it goes: longer "
                 "than any checkpoint takes to publish (machines' clocks must agree to well "
                 "within it)")
      ->check(CLI::Range(1u, 30u * 24 * 3600))
      ->capture_default_str();
}

std::optional<PoolOptions> PoolOptionsOf(const PoolCommandLine& line) {
  if (line.pool.pool.empty()) return std::nullopt;
  PoolOptions pool = line.pool;
  pool.op_timeout = std::chrono::milliseconds(static_cast<int64_t>(line.timeout_s * 1000));
  pool.gc_grace = std::chrono::seconds(line.gc_grace_s);
  return pool;
}

}  // namespace gpuckpt
