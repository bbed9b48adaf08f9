// The one clock that every process of a machine shares and that never
// jumps: CLOCK_MONOTONIC, in nanoseconds. Used where times taken by
// different processes are compared (a helper's GPU lock, the daemon's end
// of a dump). Thread-safe.
#ifndef GPUCKPT_CORE_BASE_MONO_CLOCK_H_
#define GPUCKPT_CORE_BASE_MONO_CLOCK_H_

#include <time.h>

#include <cstdint>

namespace gpuckpt {

inline int64_t MonotonicNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_MONO_CLOCK_H_
