#include "fs/commands.h"

#include <CLI/CLI.hpp>
#include <vector>

namespace gpuckpt {
namespace {

// Commands are one line; longer writes are not commands.
constexpr size_t kMaxCommand = 4096;

// Splits like a shell would (quotes, backslashes), via CLI11's own splitter.
Result<std::vector<std::string>> Words(const std::string& line) {
  if (line.size() > kMaxCommand) return Status::InvalidArgument("command too long");
  for (char c : line) {
    if (c == '\0' || c == '\n') return Status::InvalidArgument("a command is one line of text");
  }
  // CLI11's splitter takes an unterminated quote to the end of the line; a
  // shell refuses it, and so do we.
  char open_quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '\\' && open_quote != '\'') {
      ++i;  // an escaped character
    } else if (open_quote != 0) {
      if (c == open_quote) open_quote = 0;
    } else if (c == '\'' || c == '"' || c == '`') {
      open_quote = c;
    }
  }
  if (open_quote != 0)
    return Status::InvalidArgument(std::string("unterminated quote (") + open_quote +
                                   ") in the command");
  try {
    return CLI::detail::split_up(line);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("cannot parse the command: ") + e.what());
  }
}

// Usage errors carry this prefix, so that they can be told from the
// engine's own kInvalidArgument (which it records itself).
constexpr char kUsage[] = "usage: ";
bool IsUsageError(const Status& s) { return s.message().rfind(kUsage, 0) == 0; }

// Parses `args` (without the command word) with `app`.
Status Parse(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(std::string(kUsage) + app.get_name() + ": " + e.what());
  }
  return Status::Ok();
}

Status Checkpoint(Engine& engine, int pid, const std::vector<std::string>& words,
                  const Caller& caller) {
  CheckpointRequest request;
  request.pid = pid;
  request.caller = caller;
  CLI::App app{"checkpoint", "checkpoint"};
  app.add_flag("--kill", request.kill);
  app.add_option("--name", request.name);
  // Up to an hour: the driver waits this long for the GPU work in flight.
  app.add_option("--lock-timeout", request.lock_timeout_ms,
                 "milliseconds the GPU driver may take to lock the process")
      ->check(CLI::Range(1u, 3600u * 1000u));
  GPUCKPT_RETURN_IF_ERROR(Parse(app, {words.begin() + 1, words.end()}));
  return engine.Checkpoint(request).status();
}

Status ProcessCommand(Engine& engine, int pid, const std::string& line, const Caller& caller) {
  auto words = Words(line);
  Status s;
  if (!words.ok()) {
    s = words.status();
  } else if (words->empty() || (*words)[0] != "checkpoint") {
    s = Status::InvalidArgument(
        "unknown command '" + line +
        "': expected checkpoint [--kill] [--name NAME] [--lock-timeout MS]");
  } else {
    s = Checkpoint(engine, pid, *words, caller);
    // The engine records what it ran; a line it never got is recorded here.
    if (s.ok() || s.code() != StatusCode::kInvalidArgument || !IsUsageError(s)) return s;
  }
  engine.RecordFailure(pid, "command", s);
  return s;
}

Status GlobalCommand(Engine& engine, const std::string& line, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(auto words, Words(line));
  const std::string verb = words.empty() ? "" : words[0];
  if (verb == "track" && words.size() == 2) {
    char* end = nullptr;
    const long pid = std::strtol(words[1].c_str(), &end, 10);
    if (*end != '\0' || pid <= 0 || pid > (1 << 22))
      return Status::InvalidArgument("track: '" + words[1] + "' is not a pid");
    return engine.Track(static_cast<int>(pid), caller);
  }
  if (verb == "import" && (words.size() == 2 || words.size() == 3)) {
    return engine.Import(words[1], words.size() == 3 ? words[2] : "", caller).status();
  }
  if (verb == "gc" && words.size() == 1) return engine.Gc(caller).status();
  return Status::InvalidArgument("unknown command '" + line +
                                 "': expected track PID | import DIR [NAME] | gc");
}

// `PATH` alone is taken as it is (spaces and all); `PATH --option ...` is
// split like a command line, so a path with spaces is then quoted.
Status RestoreCommand(Engine& engine, const std::string& line, const Caller& caller) {
  auto refuse = [&](Status s) {
    engine.SetRestoreResult(caller.uid, "error: " + s.message());
    return s;
  };
  if (line.empty() || line.size() > kMaxCommand || line.find('\0') != std::string::npos)
    return refuse(Status::InvalidArgument("write the absolute path of a checkpoint to restore"));
  RestoreRequest request{line, "", caller};
  if (line.find(" --") != std::string::npos) {
    auto words = Words(line);
    if (!words.ok()) return refuse(words.status());
    CLI::App app{"restore", "restore"};
    std::string path;
    app.add_option("path", path)->required();
    app.add_option("--gpu-map", request.gpu_map,
                   "OLD_UUID=NEW_UUID,...: restore the checkpoint's GPUs onto these");
    Status parsed = Parse(app, *words);
    if (!parsed.ok())
      return refuse(Status::InvalidArgument(parsed.message() +
                                            " (expected: PATH [--gpu-map OLD_UUID=NEW_UUID,...])"));
    request.path = path;
  }
  return engine.Restore(request).status();
}

}  // namespace

Status RunCommand(Engine& engine, NodeKind file, int pid, const std::string& line,
                  const Caller& caller) {
  switch (file) {
    case NodeKind::kPidCtl:
      return ProcessCommand(engine, pid, line, caller);
    case NodeKind::kCtl:
      return GlobalCommand(engine, line, caller);
    case NodeKind::kRestore:
      return RestoreCommand(engine, line, caller);
    default:
      return Status::InvalidArgument("not a control file");
  }
}

}  // namespace gpuckpt
