// The shared pool's command-line options, the same in gpuckpt and
// gpuckptfs (--pool, --ceph-conf, --ceph-id, --pool-timeout,
// --pool-gc-grace), and the PoolOptions they make.
//
// A PoolCommandLine is filled by CLI11 while the command line is parsed;
// it must outlive the CLI::App it was declared on. Not thread-safe (one
// parser fills it).
#ifndef GPUCKPT_TOOLS_COMMON_POOL_OPTIONS_H_
#define GPUCKPT_TOOLS_COMMON_POOL_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "gpuckpt/store.h"

namespace gpuckpt {

struct PoolCommandLine {
  PoolOptions pool;  // used when pool.pool is set
  double timeout_s = 30;
  unsigned gc_grace_s = 3600;
};

// Declares the options on `app`; `pool_help` says what --pool does for this
// program.
void DeclarePoolOptions(CLI::App& app, const std::string& pool_help, PoolCommandLine* line);

// The store's pool, or nullopt when --pool was not given.
std::optional<PoolOptions> PoolOptionsOf(const PoolCommandLine& line);

}  // namespace gpuckpt

#endif  // GPUCKPT_TOOLS_COMMON_POOL_OPTIONS_H_
