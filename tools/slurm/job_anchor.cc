#include "tools/slurm/job_anchor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "core/base/small_file.h"
#include "core/base/unique_fd.h"
#include "tools/slurm/exit_keeper.h"
#include "tools/slurm/job_checkpoints.h"
#include "tools/slurm/job_control.h"

namespace gpuckpt {
namespace {

// How long the anchor waits for Slurm to end the job it requeued.
constexpr int kRequeueWaitSeconds = 120;
// How long the batch anchor waits for the steps' tasks to answer the
// checkpoint signal: Slurm's grace time ends the job before, if shorter.
constexpr int kStepAnswerWaitSeconds = 600;

void Say(const char* format, ...) __attribute__((format(printf, 1, 2)));
void Say(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("gpuckpt-slurm: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every signal but those that cannot be caught, and those a fault raises.
sigset_t HandledSignals() {
  sigset_t set;
  sigfillset(&set);
  for (int synchronous : {SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS})
    sigdelset(&set, synchronous);
  return set;
}

// A pid's decimal name; nullopt for any other.
std::optional<pid_t> NumberIn(std::string_view text) {
  pid_t number = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return number;
}

// "<dir>/.gpuckpt-slurm-<job>[.<step>.<rank>]": the start of the names
// of the job's files, or of one step task's.
std::string FilePrefix(const std::string& dir, uint32_t job_id, std::optional<StepTask> step) {
  std::string prefix = dir + "/.gpuckpt-slurm-" + std::to_string(job_id);
  if (step) prefix += "." + std::to_string(step->step_id) + "." + std::to_string(step->rank);
  return prefix;
}

// SIGSTOP to `root` and every process below it, found through /proc;
// repeated until no new one shows (one may fork meanwhile). The processes
// stopped.
std::set<pid_t> StopTree(pid_t root) {
  std::set<pid_t> stopped;
  std::set<pid_t> tree = {root};
  while (tree.size() > stopped.size()) {
    for (pid_t pid : tree)
      if (stopped.insert(pid).second) kill(pid, SIGSTOP);
    DIR* proc = opendir("/proc");
    if (proc == nullptr) return stopped;
    while (const dirent* entry = readdir(proc)) {
      const auto pid = NumberIn(entry->d_name);
      if (!pid) continue;
      auto stat = ReadSmallFileNoFollow("/proc/" + std::string(entry->d_name) + "/stat", 4096);
      if (!stat.ok()) continue;
      // "pid (comm) state ppid ...": comm may hold anything but its last ')'.
      const size_t close = stat->rfind(')');
      if (close == std::string::npos) continue;
      pid_t parent = 0;
      if (std::sscanf(stat->c_str() + close + 1, " %*c %d", &parent) == 1 && tree.count(parent))
        tree.insert(*pid);
    }
    closedir(proc);
  }
  return stopped;
}

class Anchor {
 public:
  explicit Anchor(const AnchorOptions& options)
      : options_(options),
        checkpoints_(options.mount, options.step ? StepSeries(options.job_id, options.step->step_id,
                                                              options.step->rank)
                                                 : BatchSeries(options.job_id)),
        files_(FilePrefix(options.job_dir, options.job_id, options.step)),
        status_file_(files_ + ".status") {}

  int Run() {
    const sigset_t handled = HandledSignals();
    sigprocmask(SIG_BLOCK, &handled, nullptr);
    UniqueFd signals(signalfd(-1, &handled, SFD_CLOEXEC));
    if (signals.get() < 0) return Fail("signalfd", errno);

    if (options_.step) {
      // A step task that ended on its own before the job was requeued.
      if (auto done = ReadKeptStatus(files_ + ".done"); done.ok()) {
        Say("%s ended before job %u was requeued (exit status %d): not run again", What().c_str(),
            options_.job_id, *done);
        return *done;
      }
    } else {
      // The steps' anchors find the job's directory here, through srun.
      setenv("GPUCKPT_SLURM_JOB_DIR", options_.job_dir.c_str(), 1);
    }
    if (!StartTree(handled)) return 1;
    UniqueFd tree_ended(static_cast<int>(syscall(SYS_pidfd_open, root_, 0)));
    if (tree_ended.get() < 0) return Fail("watching the job's processes", errno);
    UniqueFd timer = PeriodicTimer();

    std::optional<std::chrono::steady_clock::time_point> requeued_at;
    for (;;) {
      pollfd fds[3] = {
          {signals.get(), POLLIN, 0}, {tree_ended.get(), POLLIN, 0}, {timer.get(), POLLIN, 0}};
      // Once requeued, or (a step task) checkpointed for a requeue, only
      // signals count: the tree's end is no news.
      const bool waiting_for_slurm = requeued_at || parked_;
      const int timeout_ms = requeued_at ? 1000 : -1;
      if (poll(fds, waiting_for_slurm ? 1 : timer.get() < 0 ? 2 : 3, timeout_ms) < 0) {
        if (errno == EINTR) continue;
        return Fail("poll", errno);
      }
      if (waiting_for_slurm) {
        // Slurm ends this process with the rest of the job; drop signals.
        int signal = 0;
        if (fds[0].revents & POLLIN) signal = DrainSignal(signals.get());
        if (parked_ && IsEnding(signal)) return 0;
        if (requeued_at && SecondsSince(*requeued_at) > kRequeueWaitSeconds) {
          Say("Slurm did not end the requeued job within %d s", kRequeueWaitSeconds);
          return 0;
        }
        continue;
      }
      // Signals first: one that ends the job may come with the tree's end.
      if (fds[0].revents & POLLIN) {
        const int signal = DrainSignal(signals.get());
        // Once the job is being ended, its processes may hold the ending
        // signal pending, which a checkpoint would keep: none is taken.
        if (options_.step) {
          // Slurm signals every process of a step itself: nothing to pass on.
          if (IsEnding(signal)) ended_by_signal_ = true;
          if (signal == kStepCheckpointSignal && !ended_by_signal_) CheckpointStepTask();
        } else if (signal == options_.checkpoint_signal) {
          if (!ended_by_signal_ && CheckpointForRequeue())
            requeued_at = std::chrono::steady_clock::now();
        } else if (signal > 0 && signal != SIGCHLD) {
          if (IsEnding(signal)) ended_by_signal_ = true;
          kill(root_, signal);
        }
      }
      if (parked_) continue;
      if (fds[1].revents & POLLIN) return TreeEnded();
      if (timer.get() >= 0 && (fds[2].revents & POLLIN)) {
        uint64_t expirations = 0;
        (void)!read(timer.get(), &expirations, sizeof expirations);
        if (!ended_by_signal_ && !StepsHaveRun()) Checkpoint(/*kill=*/false);
      }
    }
  }

 private:
  int Fail(const char* what, int error) {
    Say("%s: %s", what, std::strerror(error));
    return 1;
  }

  static int DrainSignal(int fd) {
    signalfd_siginfo info{};
    if (read(fd, &info, sizeof info) != sizeof info) return 0;
    return static_cast<int>(info.ssi_signo);
  }

  UniqueFd PeriodicTimer() {
    if (options_.every.count() <= 0) return UniqueFd(-1);
    UniqueFd timer(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC));
    itimerspec period{};
    period.it_interval.tv_sec = options_.every.count();
    period.it_value.tv_sec = options_.every.count();
    if (timer.get() < 0 || timerfd_settime(timer.get(), 0, &period, nullptr) != 0) {
      Say("no periodic checkpoints: %s", std::strerror(errno));
      return UniqueFd(-1);
    }
    return timer;
  }

  // Restores the latest checkpoint, or starts the script under a keeper.
  bool StartTree(const sigset_t& handled) {
    auto listed = checkpoints_.List();
    if (!listed.ok()) {
      Say("%s: the job runs without checkpoints", listed.status().message().c_str());
    } else if (!listed->empty()) {
      const JobCheckpoint& latest = listed->back();
      const auto start = std::chrono::steady_clock::now();
      Result<int> pid = Status::Internal("not restored");
      {
        // The mount's `restore` answers each user with their last result:
        // the job's tasks, all one user's, restore one at a time so that
        // each reads its own.
        const UniqueFd lock = LockJobFile(".restore-lock");
        pid = checkpoints_.Restore(latest);
      }
      if (pid.ok()) {
        root_ = *pid;
        restored_ = true;
        Say("restored %s from checkpoint %s in %.2f s (pid %d)", What().c_str(), latest.id.c_str(),
            SecondsSince(start), root_);
        return true;
      }
      Say("cannot restore checkpoint %s: %s; the job starts anew", latest.id.c_str(),
          pid.status().message().c_str());
    }
    unlink(status_file_.c_str());
    const pid_t child = fork();
    if (child < 0) return Fail("starting the job", errno) == 0;
    if (child == 0) {
      sigprocmask(SIG_UNBLOCK, &handled, nullptr);
      std::vector<std::string> words = {options_.keeper, "keep", "--status", status_file_, "--"};
      words.insert(words.end(), options_.command.begin(), options_.command.end());
      std::vector<char*> argv;
      for (std::string& word : words) argv.push_back(word.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      Say("cannot run %s: %s", argv[0], std::strerror(errno));
      _exit(127);
    }
    root_ = child;
    return true;
  }

  // Signals whose default is to end a process: Slurm ends a job (scancel,
  // requeue, the time limit, a preemption without --signal) with SIGTERM
  // and then SIGKILL to every process of it.
  static bool IsEnding(int signal) {
    return signal == SIGTERM || signal == SIGINT || signal == SIGHUP || signal == SIGQUIT ||
           signal == SIGXCPU;
  }

  // The tree is gone: the job is over, or being ended.
  int TreeEnded() {
    if (ended_by_checkpoint_) {
      // Not requeued (said why): the checkpoint stays for a requeue by hand.
      return 1;
    }
    int code = 1;
    if (!restored_) {
      int status = 0;
      while (waitpid(root_, &status, 0) < 0 && errno == EINTR) {
      }
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } else if (auto kept = ReadKeptStatus(status_file_); kept.ok()) {
      code = *kept;
    } else {
      Say("the restored job ended without an exit status (%s)", kept.status().message().c_str());
    }
    unlink(status_file_.c_str());
    // A job that ended on its own needs its checkpoints no more. One that
    // was ended (by Slurm, or a signal that killed its program) may be
    // requeued, by Slurm or by hand: its latest checkpoint stays.
    const bool killed = code > 128 && IsEnding(code - 128);
    if (ended_by_signal_ || killed || code == 128 + SIGKILL) {
      auto listed = checkpoints_.List();
      if (listed.ok() && !listed->empty())
        Say("%s was ended by a signal; its checkpoint %s stays for a requeue", What().c_str(),
            listed->back().id.c_str());
      return code;
    }
    RemoveCheckpoints(/*keep_number=*/0);
    if (options_.step) {
      // Not to be run again if the job is requeued before its end.
      Status noted = WriteKeptStatus(files_ + ".done", code);
      if (!noted.ok()) Say("%s", noted.message().c_str());
    } else {
      RemoveStepsLeftovers();
    }
    return code;
  }

  // Holds an exclusive flock on the job's file <job prefix>`suffix` (in the
  // job's directory, removed with the job's other files) until the fd
  // goes; an fd of -1 (said why) where it cannot be had.
  UniqueFd LockJobFile(const char* suffix) {
    const std::string path = FilePrefix(options_.job_dir, options_.job_id, std::nullopt) + suffix;
    UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (fd.get() < 0 || flock(fd.get(), LOCK_EX) != 0) {
      Say("%s: %s (going on without it)", path.c_str(), std::strerror(errno));
      return UniqueFd(-1);
    }
    return fd;
  }

  // "job 12", "step 12.0 task 3": what the job's output calls this one.
  std::string What() const {
    if (!options_.step) return "job " + std::to_string(options_.job_id);
    return "step " + std::to_string(options_.job_id) + "." +
           std::to_string(options_.step->step_id) + " task " + std::to_string(options_.step->rank);
  }

  // Whether the job's script has started srun steps in this run: one runs
  // (its srun, in the script's tree, no checkpoint can keep), or one left
  // its end (.done). A batch checkpoint from before any step stays good:
  // the script restored there starts the steps again from number 0, as
  // Slurm numbers them in the new run. One from after would not be.
  bool StepsHaveRun() {
    if (options_.step || steps_seen_) return steps_seen_;
    auto steps = RunningSteps(options_.job_id);
    steps_seen_ = steps.ok() && !steps->empty();
    if (DIR* dir = opendir(options_.job_dir.c_str()); dir != nullptr && !steps_seen_) {
      const std::string prefix = files_.substr(options_.job_dir.size() + 1) + ".";
      while (const dirent* entry = readdir(dir)) {
        std::string_view name(entry->d_name);
        if (name.starts_with(prefix) && name.ends_with(".done")) steps_seen_ = true;
      }
      closedir(dir);
    } else if (dir != nullptr) {
      closedir(dir);
    }
    if (steps_seen_)
      Say("job %u runs srun steps: its batch step is checkpointed no more, its "
          "steps' tasks each on their own",
          options_.job_id);
    return steps_seen_;
  }

  // The job ended: its steps' checkpoints and files go.
  void RemoveStepsLeftovers() {
    if (auto listed = JobCheckpoints::ListSteps(options_.mount, options_.job_id); listed.ok()) {
      for (const JobCheckpoint& old : *listed) {
        Status removed = JobCheckpoints::RemoveFrom(options_.mount, old);
        if (!removed.ok()) Say("%s", removed.message().c_str());
      }
    }
    DIR* dir = opendir(options_.job_dir.c_str());
    if (dir == nullptr) return;
    const std::string prefix = files_.substr(options_.job_dir.size() + 1) + ".";
    while (const dirent* entry = readdir(dir))
      if (std::string_view(entry->d_name).starts_with(prefix))
        unlinkat(dirfd(dir), entry->d_name, 0);
    closedir(dir);
  }

  // kStepCheckpointSignal, in a step task: its tree is checkpointed and
  // ended, and the answer left for the batch anchor. Once checkpointed, it
  // waits for Slurm to end the job.
  void CheckpointStepTask() {
    const bool taken = Checkpoint(/*kill=*/true, nullptr, &last_failure_);
    Status answered = WriteFileWhole(files_ + ".checkpoint", taken ? "ok\n" : last_failure_ + "\n");
    if (!answered.ok()) Say("%s", answered.message().c_str());
    parked_ = taken;
  }

  // The checkpoint signal, in the batch step of a job whose steps run:
  // Slurm sends every running step kStepCheckpointSignal, and the job is
  // requeued once each task answered, if any was checkpointed.
  bool CheckpointStepsForRequeue(const std::vector<RunningStep>& steps) {
    std::vector<std::string> answers;
    for (const RunningStep& step : steps)
      for (uint32_t rank = 0; rank < step.tasks; ++rank) {
        answers.push_back(
            FilePrefix(options_.job_dir, options_.job_id, StepTask{step.step_id, rank}) +
            ".checkpoint");
        unlink(answers.back().c_str());
      }
    Say("signal %s: checkpointing the %zu task(s) of job %u's %zu running step(s)",
        sigabbrev_np(options_.checkpoint_signal), answers.size(), options_.job_id, steps.size());
    for (const RunningStep& step : steps) {
      Status sent = SignalStep(options_.job_id, step.step_id, kStepCheckpointSignal);
      if (!sent.ok()) Say("%s", sent.message().c_str());
    }
    const auto start = std::chrono::steady_clock::now();
    size_t answered = 0;
    while (SecondsSince(start) < kStepAnswerWaitSeconds) {
      answered = 0;
      for (const std::string& answer : answers) answered += access(answer.c_str(), F_OK) == 0;
      if (answered == answers.size()) break;
      usleep(100 * 1000);
    }
    size_t taken = 0;
    for (const std::string& answer : answers) {
      auto text = ReadSmallFileNoFollow(answer, 4096);
      unlink(answer.c_str());
      const std::string task = answer.substr(options_.job_dir.size() + 1);
      if (!text.ok())
        Say("%s: no answer within %d s", task.c_str(), kStepAnswerWaitSeconds);
      else if (*text == "ok\n")
        ++taken;
      else
        Say("%s: %s", task.c_str(), text->substr(0, text->find('\n')).c_str());
    }
    Say("%zu of %zu step task(s) checkpointed in %.2f s", taken, answers.size(),
        SecondsSince(start));
    if (taken == 0) {
      Say("no step was checkpointed: job %u runs on", options_.job_id);
      return false;
    }
    Say("the batch script holds the steps' srun: it starts again from its beginning when the job "
        "comes back, and each step checkpointed comes back from its checkpoint");
    // Once requeued, the steps end and srun returns before Slurm's SIGTERM
    // reaches the script, which would go on meanwhile: it is stopped
    // first (Slurm sends SIGCONT with SIGTERM when it ends a job).
    const std::set<pid_t> stopped = StopTree(root_);
    Status requeued = RequeueJob(options_.job_id);
    if (!requeued.ok()) {
      for (pid_t pid : stopped) kill(pid, SIGCONT);
      Say("%s; `scontrol requeue %u` brings it back from its checkpoints",
          requeued.message().c_str(), options_.job_id);
      return false;
    }
    Say("job %u requeued", options_.job_id);
    return true;
  }

  // Removes the job's checkpoints but number `keep_number`.
  void RemoveCheckpoints(int keep_number) {
    auto listed = checkpoints_.List();
    if (!listed.ok()) return;
    for (const JobCheckpoint& old : *listed) {
      if (old.number == keep_number) continue;
      Status removed = checkpoints_.Remove(old);
      if (!removed.ok()) Say("%s", removed.message().c_str());
    }
  }

  // A checkpoint numbered after the latest; the older ones go once it is
  // stored. Returns whether it was taken; `*had_earlier` says whether
  // another checkpoint of the job was there to fall back on.
  bool Checkpoint(bool kill, bool* had_earlier = nullptr, std::string* failure = nullptr) {
    auto listed = checkpoints_.List();
    const int next = listed.ok() && !listed->empty() ? listed->back().number + 1 : 1;
    if (had_earlier != nullptr) *had_earlier = listed.ok() && !listed->empty();
    const auto start = std::chrono::steady_clock::now();
    auto taken = checkpoints_.Take(root_, next, kill);
    if (!taken.ok()) {
      const std::string why =
          "checkpoint " + checkpoints_.NameOf(next) + " failed: " + taken.status().message();
      Say("%s", why.c_str());
      if (failure != nullptr) *failure = why;
      return false;
    }
    Say("checkpoint %s taken in %.2f s%s", taken->id.c_str(), SecondsSince(start),
        kill ? ", the job's processes ended" : "");
    ended_by_checkpoint_ = kill;
    RemoveCheckpoints(taken->number);
    return true;
  }

  // The checkpoint signal: checkpoint and end the tree, then requeue. Returns
  // whether the job was requeued.
  bool CheckpointForRequeue() {
    if (auto steps = RunningSteps(options_.job_id); !steps.ok()) {
      Say("%s", steps.status().message().c_str());
    } else if (!steps->empty()) {
      return CheckpointStepsForRequeue(*steps);
    }
    Say("signal %s: checkpointing job %u", sigabbrev_np(options_.checkpoint_signal),
        options_.job_id);
    bool had_earlier = false;
    if (!Checkpoint(/*kill=*/true, &had_earlier)) {
      if (!had_earlier) return false;
      Say("requeueing job %u to go back to its previous checkpoint", options_.job_id);
    }
    Status requeued = RequeueJob(options_.job_id);
    if (!requeued.ok()) {
      Say("%s; `scontrol requeue %u` brings it back from its checkpoint",
          requeued.message().c_str(), options_.job_id);
      return false;
    }
    Say("job %u requeued", options_.job_id);
    return true;
  }

  const AnchorOptions& options_;
  JobCheckpoints checkpoints_;
  const std::string files_;        // FilePrefix of this anchor's job or step task
  const std::string status_file_;  // the keeper's record of the exit status
  std::string last_failure_;       // why the last checkpoint failed
  bool parked_ = false;            // a step task checkpointed: Slurm ends it
  bool steps_seen_ = false;        // StepsHaveRun() found steps
  pid_t root_ = -1;
  bool restored_ = false;             // root_ is no child of ours
  bool ended_by_checkpoint_ = false;  // checkpoint --kill ended the tree
  bool ended_by_signal_ = false;      // an ending signal came (IsEnding)
};

}  // namespace

int RunAnchor(const AnchorOptions& options) { return Anchor(options).Run(); }

}  // namespace gpuckpt
