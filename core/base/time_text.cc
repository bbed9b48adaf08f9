#include "core/base/time_text.h"

#include <time.h>

#include <cstdio>

namespace gpuckpt {

std::string Rfc3339Utc(int64_t unix_ns, bool with_nanoseconds) {
  // Floor division, so that times before the epoch keep a positive fraction.
  int64_t seconds = unix_ns / 1000000000;
  int64_t nanos = unix_ns % 1000000000;
  if (nanos < 0) {
    nanos += 1000000000;
    --seconds;
  }
  const time_t t = static_cast<time_t>(seconds);
  struct tm tm {};
  if (gmtime_r(&t, &tm) == nullptr) return "";
  char buf[64];
  if (with_nanoseconds) {
    std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long long>(nanos));
  } else {
    std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  }
  return buf;
}

std::optional<int64_t> ParseRfc3339Utc(std::string_view text) {
  // YYYY-MM-DDTHH:MM:SS[.F{1,9}]Z
  auto digits = [&](size_t at, size_t n) -> std::optional<int> {
    if (at + n > text.size()) return std::nullopt;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (text[i] < '0' || text[i] > '9') return std::nullopt;
      v = v * 10 + (text[i] - '0');
    }
    return v;
  };
  auto is = [&](size_t at, char c) { return at < text.size() && text[at] == c; };
  const auto year = digits(0, 4), month = digits(5, 2), day = digits(8, 2), hour = digits(11, 2),
             minute = digits(14, 2), second = digits(17, 2);
  if (!year || !month || !day || !hour || !minute || !second || !is(4, '-') || !is(7, '-') ||
      !is(10, 'T') || !is(13, ':') || !is(16, ':'))
    return std::nullopt;
  if (*month < 1 || *month > 12 || *day < 1 || *day > 31 || *hour > 23 || *minute > 59 ||
      *second > 60)
    return std::nullopt;
  size_t at = 19;
  int64_t nanos = 0;
  if (is(at, '.')) {
    ++at;
    size_t n = 0;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9' && n < 9) {
      nanos = nanos * 10 + (text[at] - '0');
      ++at;
      ++n;
    }
    if (n == 0) return std::nullopt;
    for (; n < 9; ++n) nanos *= 10;
  }
  if (!is(at, 'Z') || at + 1 != text.size()) return std::nullopt;
  struct tm tm {};
  tm.tm_year = *year - 1900;
  tm.tm_mon = *month - 1;
  tm.tm_mday = *day;
  tm.tm_hour = *hour;
  tm.tm_min = *minute;
  tm.tm_sec = *second;
  const time_t t = timegm(&tm);
  return int64_t{t} * 1000000000 + nanos;
}

int64_t UnixNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace gpuckpt
