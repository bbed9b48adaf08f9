// The SPANK plugin behind sbatch's --gpuckpt[=INTERVAL] (gpuckpt_spank(8)).
//
// Slurm loads it into sbatch and srun (to add the option) and into
// slurmstepd. In the batch step of a job that asked for it, just before
// the step's task runs the job's script, it has the task run
// gpuckpt-slurm instead (tools/slurm/main.cc), which checkpoints the job
// when Slurm signals it and restores it when it is requeued. It does so
// through SPANK's own items: the task's first argument becomes
// gpuckpt-slurm's path, and the script's path goes to gpuckpt-slurm in the
// job's environment, so everything Slurm does for a task (its
// environment, limits, prologs, TMPDIR) still happens, and the task's pid
// (which --signal=B:... reaches) is gpuckpt-slurm's.
//
// Its arguments on the plugstack.conf line, all optional:
//   mount=DIR     gpuckptfs's mount point (default /mnt/gpuckpt)
//   signal=SIG    the signal that means "checkpoint and requeue" (USR1)
//   helper=PATH   gpuckpt-slurm (default: where it is installed, found
//                 from the plugin's own path)
//
// In each task of the job's srun steps it does the same with the task's
// program, and adds the step's number: there gpuckpt-slurm checkpoints the
// task when the batch step's gpuckpt-slurm has Slurm signal the step, and
// restores it when the requeued job starts the step again (job_anchor.h).
// sbatch passes the option on to the srun steps inside the job in their
// environment (Slurm's SPANK option variables). The extern and
// interactive steps are left alone. Thread-safety: Slurm calls a plugin
// from one thread.
#include <dlfcn.h>
#include <slurm/slurm.h>
#include <stdlib.h>
#include <string.h>
// spank.h declares the plugin's entry points outside its extern "C".
extern "C" {
#include <slurm/spank.h>
}

#include <CLI/CLI.hpp>
#include <string>

#include "fs/duration_option.h"

#ifndef GPUCKPT_SLURM_HELPER_FROM_PLUGIN
#error "GPUCKPT_SLURM_HELPER_FROM_PLUGIN: gpuckpt-slurm's path relative to the plugin's directory"
#endif

// Slurm's plugin loader looks these up by name; C++ gives a const at
// namespace scope internal linkage unless it was declared extern.
extern "C" {
extern const char plugin_name[];
extern const char plugin_type[];
extern const unsigned int plugin_version;
extern const unsigned int spank_plugin_version;
}
SPANK_PLUGIN(gpuckpt, 1)

namespace {

bool g_enabled = false;
std::string g_every;  // the option's INTERVAL, "" for none
std::string g_mount = "/mnt/gpuckpt";
std::string g_signal = "USR1";
// gpuckpt-slurm where it was installed with this plugin: its path from
// the plugin's directory, which is the same under any prefix (/usr/local
// of `cmake --install`, /usr of the package) and in the build tree.
std::string InstalledHelper() {
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&InstalledHelper), &self) == 0 || self.dli_fname == nullptr)
    return GPUCKPT_SLURM_HELPER_FROM_PLUGIN;
  std::string dir = self.dli_fname;
  dir.resize(dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/'));
  const std::string helper = (dir.empty() ? "." : dir) + "/" + GPUCKPT_SLURM_HELPER_FROM_PLUGIN;
  char* real = realpath(helper.c_str(), nullptr);
  const std::string out = real != nullptr ? real : helper;
  free(real);
  return out;
}

std::string g_helper = InstalledHelper();

// Whether `text` is a duration as --every takes it ("30m").
bool IsDuration(const std::string& text) {
  uint64_t seconds = 0;
  CLI::App app;
  app.add_option("--every", seconds)
      ->transform(gpuckpt::DurationUnits())
      ->check(CLI::PositiveNumber);
  try {
    app.parse(std::vector<std::string>{text, "--every"});
  } catch (const CLI::ParseError&) {
    return false;
  }
  return seconds > 0;
}

int OnOption(int, const char* argument, int) {
  g_enabled = true;
  g_every = argument != nullptr ? argument : "";
  // sbatch passes its options on to the srun steps in the job's
  // environment, an option given without a value as "(null)".
  if (g_every == "(null)") g_every.clear();
  if (!g_every.empty() && !IsDuration(g_every)) {
    slurm_error("--gpuckpt=%s: INTERVAL is a number and a unit, s, m, h or d (e.g. 30m)",
                g_every.c_str());
    return -1;
  }
  return 0;
}

spank_option g_option = {
    const_cast<char*>("gpuckpt"),
    const_cast<char*>("[INTERVAL]"),
    const_cast<char*>("checkpoint the job when Slurm signals it (--signal=B:USR1@SECONDS) and "
                      "requeue it, and restore it when it starts again; with INTERVAL (e.g. "
                      "30m), also checkpoint it that often"),
    2,
    0,
    OnOption};

}  // namespace

extern "C" int slurm_spank_init(spank_t spank, int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("mount=")) {
      g_mount = arg.substr(6);
    } else if (arg.starts_with("signal=")) {
      g_signal = arg.substr(7);
    } else if (arg.starts_with("helper=")) {
      g_helper = arg.substr(7);
    } else {
      slurm_error("gpuckpt: unknown plugstack.conf argument '%s' (mount=, signal=, helper=)",
                  arg.c_str());
      return -1;
    }
  }
  return spank_option_register(spank, &g_option) == ESPANK_SUCCESS ? 0 : -1;
}

extern "C" int slurm_spank_task_init(spank_t spank, int, char**) {
  if (!g_enabled) return 0;
  uint32_t step = 0;
  if (spank_get_item(spank, S_JOB_STEPID, &step) != ESPANK_SUCCESS) return -1;
  const bool batch = step == SLURM_BATCH_SCRIPT;
  if (!batch && step > SLURM_MAX_NORMAL_STEP_ID) return 0;  // extern, interactive
  int task_argc = 0;
  char** task_argv = nullptr;
  if (spank_get_item(spank, S_JOB_ARGV, &task_argc, &task_argv) != ESPANK_SUCCESS ||
      task_argc < 1 || task_argv == nullptr || task_argv[0] == nullptr)
    return -1;
  if (spank_setenv(spank, "GPUCKPT_SLURM_PROGRAM", task_argv[0], 1) != ESPANK_SUCCESS ||
      spank_setenv(spank, "GPUCKPT_SLURM_MOUNT", g_mount.c_str(), 1) != ESPANK_SUCCESS ||
      spank_setenv(spank, "GPUCKPT_SLURM_SIGNAL", g_signal.c_str(), 1) != ESPANK_SUCCESS ||
      (!g_every.empty() &&
       spank_setenv(spank, "GPUCKPT_SLURM_EVERY", g_every.c_str(), 1) != ESPANK_SUCCESS) ||
      (!batch && spank_setenv(spank, "GPUCKPT_SLURM_STEP", std::to_string(step).c_str(), 1) !=
                     ESPANK_SUCCESS))
    return -1;
  // The task execs task_argv[0]: Slurm's own array, its entry replaced for
  // the task's lifetime, which ends with that exec.
  task_argv[0] = strdup(g_helper.c_str());
  return task_argv[0] != nullptr ? 0 : -1;
}
