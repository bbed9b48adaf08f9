// A duration as the control files' commands and the daemon's options take
// it: a number and a unit, s, m, h or d ("90s", "15m", "1d"). CLI11's
// transform of such a word into its number of seconds; stateless.
#ifndef GPUCKPT_FS_DURATION_OPTION_H_
#define GPUCKPT_FS_DURATION_OPTION_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>

namespace gpuckpt {

inline CLI::AsNumberWithUnit DurationUnits() {
  return CLI::AsNumberWithUnit(
      std::map<std::string, uint64_t>{{"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}},
      CLI::AsNumberWithUnit::UNIT_REQUIRED, "DURATION");
}

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_DURATION_OPTION_H_
