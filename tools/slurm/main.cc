// gpuckpt-slurm: the program a --gpuckpt batch job runs (job_anchor.h), and
// the keeper at the root of its checkpointed tree (exit_keeper.h); also what
// each task of a --gpuckpt job's srun steps runs.
//
// The SPANK plugin (spank_gpuckpt.cc) makes the batch step run this program
// in place of the job's script: it puts this program's path in the step's
// first argument and the script's in GPUCKPT_SLURM_PROGRAM, beside the
// settings GPUCKPT_SLURM_MOUNT, _SIGNAL and _EVERY. Run so, it is the
// anchor; the script's own arguments follow its name untouched. In an srun
// step's task the plugin does the same with the task's program, and adds
// GPUCKPT_SLURM_STEP, the step's number. Otherwise
// its command line is
//   gpuckpt-slurm keep --status FILE -- PROGRAM [ARGS...]
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "fs/duration_option.h"
#include "tools/slurm/exit_keeper.h"
#include "tools/slurm/job_anchor.h"

namespace gpuckpt {
namespace {

constexpr char kProgramVariable[] = "GPUCKPT_SLURM_PROGRAM";
constexpr char kStepVariable[] = "GPUCKPT_SLURM_STEP";
constexpr const char* kSettingVariables[] = {kProgramVariable, kStepVariable, "GPUCKPT_SLURM_MOUNT",
                                             "GPUCKPT_SLURM_SIGNAL", "GPUCKPT_SLURM_EVERY"};

// A signal by its name, with or without "SIG" ("USR1", "SIGUSR1"), or its
// number.
std::optional<int> SignalNamed(std::string name) {
  if (name.starts_with("SIG")) name = name.substr(3);
  int number = 0;
  auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), number);
  if (error == std::errc() && end == name.data() + name.size() && number > 0 && number < NSIG)
    return number;
  for (int signal = 1; signal < SIGRTMIN; ++signal) {
    const char* abbreviation = sigabbrev_np(signal);
    if (abbreviation != nullptr && name == abbreviation) return signal;
  }
  return std::nullopt;
}

std::string Cwd() {
  char buffer[PATH_MAX];
  return getcwd(buffer, sizeof buffer) != nullptr ? buffer : ".";
}

std::string OwnPath() {
  char buffer[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "gpuckpt-slurm";
}

// A decimal number that fits T, the whole of `text`; nullopt else (or
// for nullptr).
template <typename T>
std::optional<T> NumberIn(const char* text) {
  T number{};
  if (text == nullptr || *text == '\0') return std::nullopt;
  auto [end, error] = std::from_chars(text, text + strlen(text), number);
  if (error != std::errc() || *end != '\0') return std::nullopt;
  return number;
}

// The job's script, run as it would have been without gpuckpt (a step's
// program may be a bare name, found on PATH as Slurm would).
[[noreturn]] void RunPlain(const std::string& program, char** argv) {
  std::vector<char*> args = {const_cast<char*>(program.c_str())};
  for (char** arg = argv + 1; *arg != nullptr; ++arg) args.push_back(*arg);
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "gpuckpt-slurm: cannot run %s: %s\n", args[0], strerror(errno));
  _exit(127);
}

int MainAnchor(int argc, char** argv) {
  const std::string program = getenv(kProgramVariable);
  std::string mount = "/mnt/gpuckpt", signal_name = "USR1";
  uint64_t every_seconds = 0;
  CLI::App app{"gpuckpt-slurm (the anchor of a --gpuckpt batch job)"};
  app.add_option("--mount", mount)->envname("GPUCKPT_SLURM_MOUNT");
  app.add_option("--signal", signal_name)->envname("GPUCKPT_SLURM_SIGNAL");
  app.add_option("--every", every_seconds)
      ->envname("GPUCKPT_SLURM_EVERY")
      ->transform(DurationUnits());
  std::string error;
  try {
    char* no_arguments[] = {argv[0], nullptr};
    app.parse(1, no_arguments);
  } catch (const CLI::ParseError& e) {
    error = e.what();
  }
  const char* step_text = getenv(kStepVariable);
  std::optional<StepTask> step;
  if (step_text != nullptr) {
    auto step_id = NumberIn<uint32_t>(step_text);
    auto rank = NumberIn<uint32_t>(getenv("SLURM_PROCID"));
    if (!step_id || !rank)
      error = "the step's number or its task's rank (SLURM_PROCID) is not a number";
    else
      step = StepTask{*step_id, *rank};
  }
  for (const char* variable : kSettingVariables) unsetenv(variable);
  const std::optional<int> signal = SignalNamed(signal_name);
  const std::optional<uint32_t> job_id = NumberIn<uint32_t>(getenv("SLURM_JOB_ID"));
  if (!job_id)
    error = "SLURM_JOB_ID is not set: this is no Slurm job";
  else if (!signal)
    error = "no such signal: " + signal_name;
  if (!error.empty()) {
    std::fprintf(stderr, "gpuckpt-slurm: %s: the job runs without checkpoints\n", error.c_str());
    RunPlain(program, argv);
  }
  AnchorOptions options;
  options.mount = mount;
  options.job_id = *job_id;
  options.checkpoint_signal = *signal;
  options.every = std::chrono::seconds(every_seconds);
  options.keeper = OwnPath();
  options.step = step;
  // A step's files go beside its batch step's, whose anchor passed its
  // directory on through srun.
  const char* job_dir = getenv("GPUCKPT_SLURM_JOB_DIR");
  options.job_dir = step && job_dir != nullptr && job_dir[0] == '/' ? job_dir : Cwd();
  options.command.push_back(program);
  for (int i = 1; i < argc; ++i) options.command.push_back(argv[i]);
  return RunAnchor(options);
}

int MainKeeper(int argc, char** argv) {
  CLI::App app{"gpuckpt-slurm: the keeper of a --gpuckpt batch job's processes"};
  app.require_subcommand(1);
  CLI::App* keep = app.add_subcommand("keep", "run PROGRAM and record how it ends");
  std::string status_file;
  std::vector<std::string> command;
  keep->add_option("--status", status_file, "the file that records the exit status")->required();
  keep->add_option("command", command, "PROGRAM [ARGS...]")->required();
  CLI11_PARSE(app, argc, argv);
  return RunKeeper(status_file, command);
}

}  // namespace
}  // namespace gpuckpt

int main(int argc, char** argv) {
  if (getenv(gpuckpt::kProgramVariable) != nullptr) return gpuckpt::MainAnchor(argc, argv);
  return gpuckpt::MainKeeper(argc, argv);
}
