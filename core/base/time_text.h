// Times as people and JSON readers get them: RFC 3339 in UTC
// ("2026-12-01T20:41:24Z", or with nanoseconds "...24.123456789Z"), so that
// no reader has to keep a 19-digit integer exactly (jq and JavaScript read
// JSON numbers as IEEE doubles, exact only below 2^53).
//
// Pure functions; thread-safe.
#ifndef GPUCKPT_CORE_BASE_TIME_TEXT_H_
#define GPUCKPT_CORE_BASE_TIME_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpuckpt {

// `unix_ns` (nanoseconds since the epoch, CLOCK_REALTIME) as RFC 3339 UTC:
// whole seconds ("2026-12-01T20:41:24Z"), or with all nine digits of the
// nanoseconds when `with_nanoseconds`.
std::string Rfc3339Utc(int64_t unix_ns, bool with_nanoseconds = false);
// The inverse, for what Rfc3339Utc writes (with or without a fraction of
// 1 to 9 digits, "Z" only); nullopt for anything else.
std::optional<int64_t> ParseRfc3339Utc(std::string_view text);
// CLOCK_REALTIME now, in nanoseconds since the epoch.
int64_t UnixNowNs();

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_TIME_TEXT_H_
