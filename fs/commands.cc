#include "fs/commands.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string_view>
#include <vector>

#include "core/base/display_text.h"
#include "core/base/log.h"
#include "fs/duration_option.h"

namespace gpuckpt {
namespace {

// Commands are one line; longer writes are not commands.
constexpr size_t kMaxCommand = 4096;

// Splits into words as a POSIX shell would, without expansions: blanks
// separate words; '...' keeps everything as written; "..." too, except
// that a backslash escapes " \ $ and `; elsewhere a backslash escapes the
// next character. So --name="x y", --name 'x y' and --name x\ y are one
// word each (CLI11's own splitter cuts the first in two). An unterminated
// quote or a final backslash is refused, as a shell does.
Result<std::vector<std::string>> Words(const std::string& line) {
  if (line.size() > kMaxCommand) return Status::InvalidArgument("command too long");
  for (char c : line) {
    if (c == '\0' || c == '\n') return Status::InvalidArgument("a command is one line of text");
  }
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;  // "" and '' are words, empty ones
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (i + 1 == line.size())
        return Status::InvalidArgument("the command ends with a backslash (nothing to escape)");
      word += line[++i];
    } else if (c == '\'' || c == '"') {
      for (++i; i < line.size() && line[i] != c; ++i) {
        if (c == '"' && line[i] == '\\' && i + 1 < line.size() &&
            std::string_view("\"\\$`").find(line[i + 1]) != std::string_view::npos)
          ++i;
        word += line[i];
      }
      if (i == line.size())
        return Status::InvalidArgument(std::string("unterminated quote (") + c +
                                       ") in the command");
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

// What a usage error says first.
constexpr char kUsage[] = "usage: ";

constexpr char kCheckpointSynopsis[] =
    "checkpoint [--kill] [--name NAME] [--lock-timeout MS] [--no-space-check] [--every "
    "DURATION|off] "
    "[--keep-last N] [--keep-within DURATION] [--owner-keep-last N] [--owner-keep-within "
    "DURATION] (--kill: stop the "
    "process once checkpointed; --name: what to call the checkpoint (letters, digits, '.', '_', "
    "'-'); --lock-timeout: milliseconds the GPU driver may take to lock the process; "
    "--no-space-check: go ahead even if the store's disk could not hold all of the process's "
    "memory as new bytes; --every: this checkpoint and then one every DURATION (30s, 15m, 2h, "
    "1d) until the process ends, or off: no more; --keep-last, --keep-within: afterwards keep "
    "only the newest N of the process's checkpoints, or those made within DURATION (either "
    "keeps); --owner-keep-last, --owner-keep-within: the same over all of the owner's "
    "checkpoints, of every process; checkpoints given a --name are always kept)";
constexpr char kRestoreSynopsis[] =
    "PATH [--gpu-map OLD_UUID=NEW_UUID,...] [--root DIR] [--join-cgroup] [--lazy | --eager] "
    "(--gpu-map: restore the "
    "checkpoint's GPUs onto these; --root: the directory a process with a mount namespace of its "
    "own gets as its root, instead of the one it had; --join-cgroup: the tree joins the cgroups "
    "of the process that writes this, as a batch scheduler's job, instead of new ones below "
    "them; --lazy: the tree runs at once and its memory follows from the store; --eager: all "
    "of its memory is in before it runs; without either, the daemon's --lazy-restore decides)";

// Parses `args` (without the command word) with `app`. --help is answered
// with the synopsis, as an error: what is written to a control file is a
// command, and its only answer besides the errno is the `last:` line (or
// `cat restore`), where the synopsis then is.
Status Parse(CLI::App& app, std::vector<std::string> args, const std::string& synopsis) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    return Status::InvalidArgument(std::string(kUsage) + synopsis);
  } catch (const CLI::CallForAllHelp&) {
    return Status::InvalidArgument(std::string(kUsage) + synopsis);
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(std::string(kUsage) + app.get_name() + ": " + e.what() +
                                   "; expected " + synopsis);
  }
  return Status::Ok();
}

// The request a `checkpoint ...` line (split into words) asks for; with
// `--every off`, *stop_schedule and no checkpoint.
Result<CheckpointRequest> ParseCheckpoint(int pid, const std::vector<std::string>& words,
                                          const Caller& caller, bool* stop_schedule) {
  CheckpointRequest request;
  request.pid = pid;
  request.caller = caller;
  CLI::App app{"checkpoint", "checkpoint"};
  app.add_flag("--kill", request.kill);
  app.add_option("--name", request.name);
  bool no_space_check = false;
  app.add_flag("--no-space-check", no_space_check);
  // Up to an hour: the driver waits this long for the GPU work in flight.
  app.add_option("--lock-timeout", request.lock_timeout_ms,
                 "milliseconds the GPU driver may take to lock the process")
      ->check(CLI::Range(1u, 3600u * 1000u));
  // At most a year; "off" ends a schedule.
  constexpr uint64_t kLongest = 366ull * 86400;
  std::string every;
  app.add_option("--every", every)
      ->check(CLI::Validator(
          [](std::string value) -> std::string {
            if (value == "off") return "";
            if (std::string error = DurationUnits()(value); !error.empty()) return error;
            return CLI::Range(uint64_t{1}, kLongest)(value);
          },
          "DURATION|off"));
  std::optional<uint32_t> keep_last;
  app.add_option("--keep-last", keep_last)->check(CLI::Range(1u, 1000000u));
  std::string keep_within;
  app.add_option("--keep-within", keep_within)
      ->check(DurationUnits() & CLI::Range(uint64_t{1}, 100 * kLongest));
  std::optional<uint32_t> owner_keep_last;
  app.add_option("--owner-keep-last", owner_keep_last)->check(CLI::Range(1u, 1000000u));
  std::string owner_keep_within;
  app.add_option("--owner-keep-within", owner_keep_within)
      ->check(DurationUnits() & CLI::Range(uint64_t{1}, 100 * kLongest));
  GPUCKPT_RETURN_IF_ERROR(Parse(app, {words.begin() + 1, words.end()}, kCheckpointSynopsis));
  request.check_space = !no_space_check;
  request.retention.keep_last = keep_last;
  // The checks above passed: what remains is a count of seconds.
  auto seconds = [](std::string text) {
    DurationUnits()(text);
    return std::chrono::seconds(std::stoull(text));
  };
  if (!keep_within.empty()) request.retention.keep_within = seconds(keep_within);
  request.owner_retention.keep_last = owner_keep_last;
  if (!owner_keep_within.empty()) request.owner_retention.keep_within = seconds(owner_keep_within);
  *stop_schedule = every == "off";
  if (!every.empty() && every != "off") request.every = seconds(every);
  if (*stop_schedule && (request.kill || !request.name.empty() || !request.retention.empty() ||
                         !request.owner_retention.empty()))
    return Status::InvalidArgument(std::string(kUsage) +
                                   "checkpoint --every off takes no other option; expected " +
                                   kCheckpointSynopsis);
  return request;
}

Status ProcessCommand(Engine& engine, int pid, const std::string& line, const Caller& caller) {
  auto words = Words(line);
  Result<CheckpointRequest> request =
      Status::InvalidArgument("unknown command '" + line +
                              "': expected checkpoint [--kill] [--name NAME] [--lock-timeout MS] "
                              "[--no-space-check] [--every DURATION|off] [--keep-last N] "
                              "[--keep-within DURATION] [--owner-keep-last N] "
                              "[--owner-keep-within DURATION]");
  if (!words.ok()) {
    request = words.status();
  } else if (!words->empty() && (*words)[0] == "checkpoint") {
    bool stop_schedule = false;
    request = ParseCheckpoint(pid, *words, caller, &stop_schedule);
    if (request.ok() && stop_schedule) {
      Status stopped = engine.StopSchedule(pid, caller);
      if (!stopped.ok()) engine.RecordFailure(pid, "command", stopped, caller);
      return stopped;
    }
  }
  // The engine records what it ran; a line that never became a request is
  // recorded here.
  if (!request.ok()) {
    engine.RecordFailure(pid, "command", request.status(), caller);
    return request.status();
  }
  return engine.Checkpoint(*request).status();
}

// Runs a `ctl` command; what it did, in a line, for `cat ctl`.
Result<std::string> RunGlobalCommand(Engine& engine, const std::string& line,
                                     const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(auto words, Words(line));
  const std::string verb = words.empty() ? "" : words[0];
  if (verb == "track" && words.size() == 2) {
    char* end = nullptr;
    const long pid = std::strtol(words[1].c_str(), &end, 10);
    if (*end != '\0' || pid <= 0 || pid > (1 << 22))
      return Status::InvalidArgument("track: '" + words[1] + "' is not a pid");
    GPUCKPT_RETURN_IF_ERROR(engine.Track(static_cast<int>(pid), caller));
    return fmt::format("ok, {}/ is listed", pid);
  }
  if (verb == "import" && (words.size() == 2 || words.size() == 3)) {
    GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo made,
                             engine.Import(words[1], words.size() == 3 ? words[2] : "", caller));
    return fmt::format("ok, checkpoint {} ({:.1f} MB logical, {:.1f} MB new)", made.id,
                       made.logical_bytes / 1e6, made.new_bytes / 1e6);
  }
  if (verb == "gc" && words.size() == 1) {
    GPUCKPT_ASSIGN_OR_RETURN(GcReport report, engine.Gc(caller));
    return fmt::format("freed {:.1f} MB in {} chunks", report.bytes_deleted / 1e6,
                       report.chunks_deleted);
  }
  return Status::InvalidArgument("unknown command '" + line +
                                 "': expected track PID | import PATH [NAME] | gc");
}

// The line `cat ctl` shows for `line` and how it ended.
std::string CtlResultLine(const std::string& line, const Status& status, const std::string& did) {
  return DisplayText(line) + ": " + (status.ok() ? did : "error: " + status.message());
}

Status GlobalCommand(Engine& engine, const std::string& line, const Caller& caller) {
  Result<std::string> did = RunGlobalCommand(engine, line, caller);
  engine.SetLastResult(ResultFile::kCtl, caller.uid,
                       CtlResultLine(line, did.status(), did.ok() ? *did : ""));
  return did.status();
}

// `PATH` alone is taken as it is (spaces and all); `PATH --option ...` is
// split like a command line, so a path with spaces is then quoted.
Status RestoreCommand(Engine& engine, const std::string& line, const Caller& caller) {
  auto refuse = [&](Status s) {
    engine.SetLastResult(ResultFile::kRestore, caller.uid, "error: " + s.message());
    return s;
  };
  if (line.empty() || line.size() > kMaxCommand || line.find('\0') != std::string::npos)
    return refuse(Status::InvalidArgument("write the absolute path of a checkpoint to restore"));
  RestoreRequest request;
  request.path = line;
  request.caller = caller;
  if (line.find(" --") != std::string::npos) {
    auto words = Words(line);
    if (!words.ok()) return refuse(words.status());
    CLI::App app{"restore", "restore"};
    std::string path;
    app.add_option("path", path)->required();
    app.add_option("--gpu-map", request.gpu_map,
                   "OLD_UUID=NEW_UUID,...: restore the checkpoint's GPUs onto these");
    app.add_option("--root", request.root,
                   "the root directory of a process with a mount namespace of its own");
    app.add_flag("--join-cgroup", request.join_cgroup,
                 "the restored tree joins the writer's cgroups instead of new ones below them");
    bool lazy = false;
    bool eager = false;
    auto* lazy_flag = app.add_flag("--lazy", lazy, "the tree runs at once; its memory follows");
    app.add_flag("--eager", eager, "all of the tree's memory is in before it runs")
        ->excludes(lazy_flag);
    Status parsed = Parse(app, *words, std::string("restore ") + kRestoreSynopsis);
    if (!parsed.ok()) return refuse(parsed);
    request.path = path;
    if (lazy || eager) request.lazy = lazy;
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

void RecordRefusedCommand(Engine& engine, NodeKind file, int pid, const Status& refusal,
                          const Caller& caller) {
  switch (file) {
    case NodeKind::kPidCtl:
      engine.RecordFailure(pid, "command", refusal, caller);
      return;
    case NodeKind::kRestore:
      engine.SetLastResult(ResultFile::kRestore, caller.uid, "error: " + refusal.message());
      break;
    case NodeKind::kCtl:
      engine.SetLastResult(ResultFile::kCtl, caller.uid, "error: " + refusal.message());
      break;
    default:
      break;
  }
  LogOperationEnd(refusal, "command uid={} result={} error={}", caller.uid,
                  ResultLabel(refusal.code()), LogValue(refusal.message()));
}

}  // namespace gpuckpt
