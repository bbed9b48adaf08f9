#include "core/base/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace gpuckpt {
namespace {

// A rotated log: enough for weeks of operations, bounded on disk.
constexpr size_t kLogFileBytes = 10 << 20;
constexpr size_t kLogFilesKept = 3;

// Time (UTC, RFC 3339 with milliseconds), level, message.
constexpr char kLinePattern[] = "%Y-%m-%dT%H:%M:%S.%eZ %l %v";

}  // namespace

LogSink ChooseLogSink(bool foreground) {
  // systemd sets JOURNAL_STREAM=DEV:INODE when it connects stdout or
  // stderr to the journal; a child that inherited the variable but not the
  // descriptor (or one redirected elsewhere) does not match.
  if (const char* stream = std::getenv("JOURNAL_STREAM")) {
    unsigned long long dev = 0, ino = 0;
    struct stat st {};
    if (std::sscanf(stream, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
        st.st_dev == dev && st.st_ino == ino)
      return LogSink::kJournal;
  }
  return foreground ? LogSink::kStderr : LogSink::kFile;
}

Result<spdlog::level::level_enum> ParseLogLevel(const std::string& name) {
  if (name == "debug") return spdlog::level::debug;
  if (name == "info") return spdlog::level::info;
  if (name == "warning" || name == "warn") return spdlog::level::warn;
  if (name == "error") return spdlog::level::err;
  return Status::InvalidArgument("unknown log level '" + name + "' (debug, info, warning, error)");
}

Status SetUpLogging(const LogOptions& options) {
  spdlog::sink_ptr sink;
  try {
    switch (options.sink) {
      case LogSink::kJournal:
        sink = std::make_shared<spdlog::sinks::systemd_sink_mt>("gpuckptfs");
        break;
      case LogSink::kStderr:
        sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
        sink->set_formatter(std::make_unique<spdlog::pattern_formatter>(
            kLinePattern, spdlog::pattern_time_type::utc));
        break;
      case LogSink::kFile:
        sink = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(options.file, kLogFileBytes,
                                                                      kLogFilesKept);
        sink->set_formatter(std::make_unique<spdlog::pattern_formatter>(
            kLinePattern, spdlog::pattern_time_type::utc));
        break;
    }
  } catch (const spdlog::spdlog_ex& e) {
    return Status::IOError(std::string("log: ") + e.what());
  }
  auto logger = std::make_shared<spdlog::logger>("gpuckptfs", std::move(sink));
  logger->set_level(options.level);
  // Every line is written out at once: a few lines per operation, and a
  // daemon that crashes must not take its last lines with it.
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
  return Status::Ok();
}

spdlog::level::level_enum OperationLogLevel(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return spdlog::level::info;
    case StatusCode::kBusy:
    case StatusCode::kPermissionDenied:
    case StatusCode::kNotFound:
    case StatusCode::kNoSuchProcess:
    case StatusCode::kInvalidArgument:
    case StatusCode::kNoSpace:
    case StatusCode::kNoMemory:
    case StatusCode::kAborted:
    case StatusCode::kUnavailable:
    case StatusCode::kTimedOut:
    case StatusCode::kCancelled:
      return spdlog::level::warn;
    default:
      return spdlog::level::err;
  }
}

std::string ResultLabel(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kBusy:
      return "busy";
    case StatusCode::kPermissionDenied:
      return "denied";
    case StatusCode::kNoSuchProcess:
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kInvalidArgument:
      return "invalid";
    case StatusCode::kNoSpace:
      return "no_space";
    case StatusCode::kNoMemory:
      return "no_memory";
    case StatusCode::kCancelled:
      return "cancelled";
    default:
      return "failed";
  }
}

std::string LogValue(std::string_view text) {
  bool plain = !text.empty();
  for (unsigned char c : text)
    if (c <= ' ' || c == '"' || c == '\\' || c == '=' || c == 0x7f) plain = false;
  if (plain) return std::string(text);
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < ' ' || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace gpuckpt
