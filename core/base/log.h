// The daemon's log: where it goes and from which level on. Everything else
// logs through spdlog's default logger (spdlog::info(...), ...), which
// SetUpLogging() replaces; until then (tools, tests) spdlog's own default
// writes to stderr.
//
// Where the log goes (ChooseLogSink): to the systemd journal when the
// daemon's stderr is the journal's stream (systemd says so in
// $JOURNAL_STREAM), with each line's level as its priority; to stderr in the
// foreground otherwise; and to a file when the daemon backgrounds itself
// outside systemd (its stderr is /dev/null then): `<state dir>/gpuckptfs.log`,
// rotated at 10 MiB, three old files kept.
//
// SetUpLogging() is called once, before the daemon's threads start; the
// logger itself is thread-safe.
#ifndef GPUCKPT_CORE_BASE_LOG_H_
#define GPUCKPT_CORE_BASE_LOG_H_

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>
#include <utility>

#include "gpuckpt/status.h"

namespace gpuckpt {

enum class LogSink {
  kStderr,   // lines with a UTC time and the level
  kJournal,  // sd_journal_send: the level as PRIORITY, no time (the journal has it)
  kFile,     // as kStderr, into a rotated file
};

struct LogOptions {
  LogSink sink = LogSink::kStderr;
  // kFile: the file (its directory must exist). Default: "".
  std::string file;
  // Lines below this level are dropped. Default: info.
  spdlog::level::level_enum level = spdlog::level::info;
};

// kJournal when stderr is the journal's stream ($JOURNAL_STREAM names
// stderr's device and inode), else kStderr in the foreground and kFile when
// the daemon will detach.
LogSink ChooseLogSink(bool foreground);
// "debug", "info", "warning" (or "warn"), "error"; kInvalidArgument otherwise.
Result<spdlog::level::level_enum> ParseLogLevel(const std::string& name);
// Makes the default logger write to `options.sink`.
Status SetUpLogging(const LogOptions& options);

// The level of an operation's log line: info when it succeeded, error when
// it failed for a reason that is not the caller's (CRIU, the disk, the
// store, the GPU driver), warning for a refusal (busy, denied, not found,
// bad input, no room).
spdlog::level::level_enum OperationLogLevel(const Status& status);
// The word for how an operation ended, in its log line's result= and in
// the metrics' result label: "ok", or for a failure "busy", "denied",
// "not_found", "invalid", "no_space", "no_memory", "cancelled", "failed"
// (core/engine/metrics.h's Metrics::Results() lists the same words).
std::string ResultLabel(StatusCode code);
// One operation's line at OperationLogLevel(status).
template <typename... Args>
void LogOperationEnd(const Status& status, fmt::format_string<Args...> format, Args&&... args) {
  spdlog::log(OperationLogLevel(status), format, std::forward<Args>(args)...);
}

// `text` as one value of a log line: as it is when it is a plain word,
// else in double quotes with `"`, `\` and control bytes escaped, so that
// one line stays one line and its fields can be told apart.
std::string LogValue(std::string_view text);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_LOG_H_
