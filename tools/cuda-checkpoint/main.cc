// cuda-checkpoint: gpuckpt's own implementation of the command CRIU's
// cuda_plugin runs (found on PATH) to drive the CUDA driver's checkpoint API
// for one process:
//
//   cuda-checkpoint --get-state --pid P          prints running|locked|checkpointed|failed
//   cuda-checkpoint --get-restore-tid --pid P    prints the driver's restore thread id
//   cuda-checkpoint --action lock|checkpoint|restore|unlock --pid P
//                   [--timeout MS] [--device-map OLD=NEW,...]
//   cuda-checkpoint --toggle --pid P             running <-> checkpointed
//
// The plugin reads stdout and stderr together into 128 bytes, matches the
// start of --get-state's output, atoi()s --get-restore-tid's and takes any
// non-zero exit of --get-restore-tid to mean "no CUDA in this process". So
// successes print exactly the value and a newline, and errors are one line
// with the pid and the essential words first.
//
// Exit status: 0 done; 1 the driver or the process failed it; 2 bad usage.
// The environment that gpuckptfs sets for CRIU is in kEnvironmentHelp.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/gpu/cuda_driver.h"
#include "core/gpu/device_ranges.h"
#include "core/gpu/gpu_uuid.h"
#include "core/gpu/lock_events.h"
#include "gpuckpt/status.h"
#include "gpuckpt/version.h"

namespace gpuckpt {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr const char* kEnvLockTimeout = "GPUCKPT_LOCK_TIMEOUT_MS";
constexpr const char* kEnvGpuMap = "GPUCKPT_GPU_MAP";
constexpr const char* kEnvRangesDir = "GPUCKPT_DEVICE_RANGES_DIR";

constexpr const char* kEnvironmentHelp = R"(
Environment (gpuckptfs sets these when it runs CRIU):
  GPUCKPT_LOCK_TIMEOUT_MS=MS  lock timeout in ms; wins over --timeout, which
                              CRIU always passes from its own default
  GPUCKPT_GPU_MAP=OLD=NEW,... device map for restore when --device-map is
                              not given
  GPUCKPT_DEVICE_RANGES_DIR=D checkpoint also writes D/cuda-ranges-PID.json:
                              the memory the driver filled with GPU contents;
                              lock and unlock record when they happened there
                              (D/gpu-lock-PID, D/gpu-unlock-PID), a lock
                              that timed out too (D/gpu-lock-timeout-PID)
  GPUCKPT_LIBCUDA=FILE        the CUDA driver library (default libcuda.so.1)
Exit status: 0 done; 1 the driver or the process failed; 2 bad usage.
)";

enum class Mode { kGetState, kGetRestoreTid, kLock, kCheckpoint, kRestore, kUnlock, kToggle };

// What the command line and the environment asked for, validated.
struct Request {
  Mode mode = Mode::kGetState;
  int pid = 0;
  unsigned timeout_ms = 0;  // 0: no limit
  std::vector<GpuUuidPair> gpu_map;
  std::string ranges_dir;  // "" : do not record device ranges
};

int Fail(const Status& s) {
  std::fprintf(stderr, "cuda-checkpoint: %s\n", s.message().c_str());
  return kExitFailure;
}

// Exit status for the outcome of an operation that prints nothing on success.
int Finish(const Status& s) { return s.ok() ? 0 : Fail(s); }

int UsageError(std::string_view message) {
  std::fprintf(stderr, "cuda-checkpoint: %.*s (see cuda-checkpoint -h)\n",
               static_cast<int>(message.size()), message.data());
  return kExitUsage;
}

// A decimal number in [min, max], nothing else (no sign, no blanks).
std::optional<uint64_t> ParseDecimal(std::string_view s, uint64_t min, uint64_t max) {
  uint64_t v = 0;
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) return {};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < min || v > max) return {};
  return v;
}

// The value of environment variable `name`; unset and "" are the same.
std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return std::nullopt;
  return std::string(v);
}

// Checkpoint, recording which memory the driver filled with the GPU's
// contents when `ranges_dir` is set. The maps are read before the call, so a
// failure to read them leaves the process as it was.
Status CheckpointRecordingRanges(const CudaDriver& driver, int pid, const std::string& ranges_dir) {
  if (ranges_dir.empty()) return driver.Checkpoint(pid);
  Result<std::vector<Mapping>> before = ReadMappings(pid);
  if (!before.ok()) return before.status();
  GPUCKPT_RETURN_IF_ERROR(driver.Checkpoint(pid));
  // From here the process is checkpointed: a failure says so, and CRIU's
  // plugin then restores and unlocks it.
  Result<std::vector<Mapping>> after = ReadMappings(pid);
  if (!after.ok()) {
    return after.status().WithContext(
        fmt::format("pid {}: checkpointed, but device ranges not recorded", pid));
  }
  DeviceRanges ranges{pid, NewMappings(before.value(), after.value())};
  Status s = WriteDeviceRangesFile(ranges_dir + "/" + DeviceRangesFileName(pid), ranges);
  if (!s.ok()) {
    return s.WithContext(fmt::format("pid {}: checkpointed, but device ranges not recorded", pid));
  }
  return Status::Ok();
}

// Tells gpuckptfs when the process's GPU work stopped or went on (it
// reports how long the job stood still), or that it could not be stopped in
// time (then the dump failed for a reason the user can simply retry). Best effort: a checkpoint
// does not fail for want of a report.
void RecordForGpuckpt(const Request& r, LockEvent event) {
  if (r.ranges_dir.empty()) return;
  Status s = RecordLockEvent(r.ranges_dir, event, r.pid);
  if (!s.ok()) std::fprintf(stderr, "cuda-checkpoint: warning: %s\n", s.message().c_str());
}

// running -> checkpointed, or checkpointed -> running, as NVIDIA's
// cuda-checkpoint --toggle does.
Status Toggle(const CudaDriver& driver, const Request& r) {
  GPUCKPT_ASSIGN_OR_RETURN(CudaProcessState state, driver.GetState(r.pid));
  switch (state) {
    case CudaProcessState::kRunning: {
      Status locked = driver.Lock(r.pid, r.timeout_ms);
      if (locked.code() == StatusCode::kAborted) RecordForGpuckpt(r, LockEvent::kLockTimedOut);
      GPUCKPT_RETURN_IF_ERROR(locked);
      RecordForGpuckpt(r, LockEvent::kLock);
      Status s = CheckpointRecordingRanges(driver, r.pid, r.ranges_dir);
      if (s.ok()) return s;
      // Leave the process as we found it, if the driver lets us.
      Status unlocked = driver.Unlock(r.pid);
      if (unlocked.ok()) return Status(s.code(), s.message() + "; unlocked again");
      return Status(s.code(), s.message() + "; unlock failed too: " + unlocked.message());
    }
    case CudaProcessState::kCheckpointed: {
      GPUCKPT_RETURN_IF_ERROR(driver.Restore(r.pid, r.gpu_map));
      Status unlocked = driver.Unlock(r.pid);
      if (unlocked.ok()) RecordForGpuckpt(r, LockEvent::kUnlock);
      return unlocked;
    }
    case CudaProcessState::kLocked:
      return Status::Busy(fmt::format(
          "pid {}: CUDA is locked (a checkpoint in progress?); --toggle needs running or "
          "checkpointed: use --action checkpoint or --action unlock",
          r.pid));
    case CudaProcessState::kFailed:
      break;
  }
  return Status::IOError(
      fmt::format("pid {}: CUDA is in the failed state; nothing to toggle", r.pid));
}

int Run(const CudaDriver& driver, const Request& r) {
  switch (r.mode) {
    case Mode::kGetState: {
      Result<CudaProcessState> state = driver.GetState(r.pid);
      if (!state.ok()) return Fail(state.status());
      std::printf("%s\n", std::string(CudaProcessStateName(state.value())).c_str());
      return 0;
    }
    case Mode::kGetRestoreTid: {
      Result<int> tid = driver.GetRestoreThreadId(r.pid);
      if (!tid.ok()) return Fail(tid.status());
      std::printf("%d\n", tid.value());
      return 0;
    }
    case Mode::kLock: {
      Status locked = driver.Lock(r.pid, r.timeout_ms);
      if (locked.ok()) RecordForGpuckpt(r, LockEvent::kLock);
      if (locked.code() == StatusCode::kAborted) RecordForGpuckpt(r, LockEvent::kLockTimedOut);
      return Finish(locked);
    }
    case Mode::kCheckpoint:
      return Finish(CheckpointRecordingRanges(driver, r.pid, r.ranges_dir));
    case Mode::kRestore:
      return Finish(driver.Restore(r.pid, r.gpu_map));
    case Mode::kUnlock: {
      Status unlocked = driver.Unlock(r.pid);
      if (unlocked.ok()) RecordForGpuckpt(r, LockEvent::kUnlock);
      return Finish(unlocked);
    }
    case Mode::kToggle:
      return Finish(Toggle(driver, r));
  }
  return kExitFailure;
}

// The command line as given, before it is checked.
struct CommandLine {
  std::string action, pid_text, timeout_text, device_map_text;
  bool toggle = false, get_state = false, get_restore_tid = false;
};

void DescribeOptions(CLI::App& app, CommandLine* line) {
  app.footer(kEnvironmentHelp);
  app.set_version_flag("--version", "cuda-checkpoint (gpuckpt) " GPUCKPT_VERSION_STRING);
  app.add_option("--action", line->action,
                 "lock: block further CUDA calls; checkpoint: move GPU memory to host memory "
                 "(locked -> checkpointed); restore: back onto the GPUs (-> locked); unlock: "
                 "let CUDA calls run again")
      ->type_name("lock|checkpoint|restore|unlock");
  app.add_option("--pid", line->pid_text, "The process")->type_name("PID");
  app.add_option("--timeout", line->timeout_text,
                 "With lock and --toggle: give up locking after MS milliseconds, leaving the "
                 "process running (0: wait)")
      ->type_name("MS");
  app.add_option("--device-map", line->device_map_text,
                 "With restore and --toggle: restore onto other GPUs, each OLD GPU UUID onto NEW")
      ->type_name("OLD=NEW,...");
  app.add_flag("--get-state", line->get_state,
               "Print the CUDA state: running, locked, checkpointed");
  app.add_flag("--get-restore-tid", line->get_restore_tid, "Print the driver's restore thread id");
  app.add_flag("--toggle", line->toggle, "running -> checkpointed, checkpointed -> running");
}

// Each of the steps below sets its part of the request and returns what is
// wrong with the command line or the environment ("" when nothing is).

std::string ReadMode(const CLI::App& app, const CommandLine& line, Mode* mode) {
  const bool has_action = app.count("--action") > 0;
  if (int(line.toggle) + int(line.get_state) + int(line.get_restore_tid) + int(has_action) != 1) {
    return "give one of --action, --toggle, --get-state, --get-restore-tid";
  }
  if (line.toggle) {
    *mode = Mode::kToggle;
  } else if (line.get_state) {
    *mode = Mode::kGetState;
  } else if (line.get_restore_tid) {
    *mode = Mode::kGetRestoreTid;
  } else if (line.action == "lock") {
    *mode = Mode::kLock;
  } else if (line.action == "checkpoint") {
    *mode = Mode::kCheckpoint;
  } else if (line.action == "restore") {
    *mode = Mode::kRestore;
  } else if (line.action == "unlock") {
    *mode = Mode::kUnlock;
  } else {
    return fmt::format("unknown --action '{}': expected lock, checkpoint, restore or unlock",
                       line.action);
  }
  return "";
}

std::string ReadPid(const CLI::App& app, const CommandLine& line, int* pid) {
  if (app.count("--pid") == 0) return "--pid is required";
  std::optional<uint64_t> parsed = ParseDecimal(line.pid_text, 1, INT_MAX);
  if (!parsed) return fmt::format("invalid --pid '{}': not a process id", line.pid_text);
  *pid = static_cast<int>(*parsed);
  return "";
}

std::string ReadLockTimeout(const CLI::App& app, const CommandLine& line, Mode mode,
                            unsigned* timeout_ms) {
  const bool locks = mode == Mode::kLock || mode == Mode::kToggle;
  if (app.count("--timeout") > 0) {
    if (!locks) return "--timeout applies to --action lock and --toggle only";
    std::optional<uint64_t> ms = ParseDecimal(line.timeout_text, 0, UINT_MAX);
    if (!ms) return fmt::format("invalid --timeout '{}': not milliseconds", line.timeout_text);
    *timeout_ms = static_cast<unsigned>(*ms);
  }
  // gpuckptfs's configured timeout must apply although CRIU passes its own.
  if (std::optional<std::string> env = Env(kEnvLockTimeout); env && locks) {
    std::optional<uint64_t> ms = ParseDecimal(*env, 0, UINT_MAX);
    if (!ms) return fmt::format("invalid {}='{}': not milliseconds", kEnvLockTimeout, *env);
    *timeout_ms = static_cast<unsigned>(*ms);
  }
  return "";
}

std::string ReadGpuMap(const CLI::App& app, const CommandLine& line, Mode mode,
                       std::vector<GpuUuidPair>* gpu_map) {
  const bool restores = mode == Mode::kRestore || mode == Mode::kToggle;
  if (app.count("--device-map") > 0) {
    if (!restores) return "--device-map applies to --action restore and --toggle only";
    Result<std::vector<GpuUuidPair>> map = ParseGpuMap(line.device_map_text);
    if (!map.ok()) return "--device-map: " + map.status().message();
    *gpu_map = std::move(map).value();
  } else if (std::optional<std::string> env = Env(kEnvGpuMap); env && restores) {
    Result<std::vector<GpuUuidPair>> map = ParseGpuMap(*env);
    if (!map.ok()) return std::string(kEnvGpuMap) + ": " + map.status().message();
    *gpu_map = std::move(map).value();
  }
  return "";
}

// The request, or what is wrong with it: each step in turn, stopping at the
// first that finds something.
std::string ReadRequest(const CLI::App& app, const CommandLine& line, Request* r) {
  std::string problem = ReadMode(app, line, &r->mode);
  if (problem.empty()) problem = ReadPid(app, line, &r->pid);
  if (problem.empty()) problem = ReadLockTimeout(app, line, r->mode, &r->timeout_ms);
  if (problem.empty()) problem = ReadGpuMap(app, line, r->mode, &r->gpu_map);
  if (problem.empty()) {
    if (std::optional<std::string> env = Env(kEnvRangesDir)) r->ranges_dir = *env;
  }
  return problem;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "Checkpoint and restore the CUDA state of a process with the NVIDIA driver's checkpoint "
      "API (gpuckpt's implementation of the command CRIU's cuda_plugin runs).",
      "cuda-checkpoint");
  CommandLine line;
  DescribeOptions(app, &line);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // prints the help on stdout, 0
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);  // prints the version on stdout, 0
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }

  Request r;
  if (std::string problem = ReadRequest(app, line, &r); !problem.empty()) {
    return UsageError(problem);
  }
  Result<std::unique_ptr<CudaDriver>> driver = CudaDriver::Load();
  if (!driver.ok()) return Fail(driver.status());
  return Run(*driver.value(), r);
}

}  // namespace
}  // namespace gpuckpt

int main(int argc, char** argv) {
  try {
    return gpuckpt::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda-checkpoint: internal error: %s\n", e.what());
    return 1;
  }
}
