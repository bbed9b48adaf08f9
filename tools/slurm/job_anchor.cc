#include "tools/slurm/job_anchor.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>

#include "core/base/unique_fd.h"
#include "tools/slurm/exit_keeper.h"
#include "tools/slurm/job_checkpoints.h"
#include "tools/slurm/job_requeue.h"

namespace gpuckpt {
namespace {

// How long the anchor waits for Slurm to end the job it requeued.
constexpr int kRequeueWaitSeconds = 120;

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

class Anchor {
 public:
  explicit Anchor(const AnchorOptions& options)
      : options_(options), checkpoints_(options.mount, options.job_id) {}

  int Run() {
    const sigset_t handled = HandledSignals();
    sigprocmask(SIG_BLOCK, &handled, nullptr);
    UniqueFd signals(signalfd(-1, &handled, SFD_CLOEXEC));
    if (signals.get() < 0) return Fail("signalfd", errno);

    if (!StartTree(handled)) return 1;
    UniqueFd tree_ended(static_cast<int>(syscall(SYS_pidfd_open, root_, 0)));
    if (tree_ended.get() < 0) return Fail("watching the job's processes", errno);
    UniqueFd timer = PeriodicTimer();

    std::optional<std::chrono::steady_clock::time_point> requeued_at;
    for (;;) {
      pollfd fds[3] = {
          {signals.get(), POLLIN, 0}, {tree_ended.get(), POLLIN, 0}, {timer.get(), POLLIN, 0}};
      const int timeout_ms = requeued_at ? 1000 : -1;
      if (poll(fds, timer.get() < 0 ? 2 : 3, timeout_ms) < 0) {
        if (errno == EINTR) continue;
        return Fail("poll", errno);
      }
      if (requeued_at) {
        // Slurm ends this process with the rest of the job; drop signals.
        if (fds[0].revents & POLLIN) DrainSignal(signals.get());
        if (SecondsSince(*requeued_at) > kRequeueWaitSeconds) {
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
        if (signal == options_.checkpoint_signal) {
          if (!ended_by_signal_ && CheckpointForRequeue())
            requeued_at = std::chrono::steady_clock::now();
        } else if (signal > 0 && signal != SIGCHLD) {
          if (IsEnding(signal)) ended_by_signal_ = true;
          kill(root_, signal);
        }
      }
      if (fds[1].revents & POLLIN) return TreeEnded();
      if (timer.get() >= 0 && (fds[2].revents & POLLIN)) {
        uint64_t expirations = 0;
        (void)!read(timer.get(), &expirations, sizeof expirations);
        if (!ended_by_signal_) Checkpoint(/*kill=*/false);
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
      auto pid = checkpoints_.Restore(latest);
      if (pid.ok()) {
        root_ = *pid;
        restored_ = true;
        Say("restored job %u from checkpoint %s in %.2f s (pid %d)", options_.job_id,
            latest.id.c_str(), SecondsSince(start), root_);
        return true;
      }
      Say("cannot restore checkpoint %s: %s; the job starts anew", latest.id.c_str(),
          pid.status().message().c_str());
    }
    unlink(options_.status_file.c_str());
    const pid_t child = fork();
    if (child < 0) return Fail("starting the job", errno) == 0;
    if (child == 0) {
      sigprocmask(SIG_UNBLOCK, &handled, nullptr);
      std::vector<std::string> words = {options_.keeper, "keep", "--status", options_.status_file,
                                        "--"};
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
    } else if (auto kept = ReadKeptStatus(options_.status_file); kept.ok()) {
      code = *kept;
    } else {
      Say("the restored job ended without an exit status (%s)", kept.status().message().c_str());
    }
    unlink(options_.status_file.c_str());
    // A job that ended on its own needs its checkpoints no more. One that
    // was ended (by Slurm, or a signal that killed its program) may be
    // requeued, by Slurm or by hand: its latest checkpoint stays.
    const bool killed = code > 128 && IsEnding(code - 128);
    if (ended_by_signal_ || killed || code == 128 + SIGKILL) {
      auto listed = checkpoints_.List();
      if (listed.ok() && !listed->empty())
        Say("job %u was ended by a signal; its checkpoint %s stays for a requeue", options_.job_id,
            listed->back().id.c_str());
    } else {
      RemoveCheckpoints(/*keep_number=*/0);
    }
    return code;
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
  bool Checkpoint(bool kill, bool* had_earlier = nullptr) {
    auto listed = checkpoints_.List();
    const int next = listed.ok() && !listed->empty() ? listed->back().number + 1 : 1;
    if (had_earlier != nullptr) *had_earlier = listed.ok() && !listed->empty();
    const auto start = std::chrono::steady_clock::now();
    auto taken = checkpoints_.Take(root_, next, kill);
    if (!taken.ok()) {
      Say("checkpoint %s failed: %s", checkpoints_.NameOf(next).c_str(),
          taken.status().message().c_str());
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
  pid_t root_ = -1;
  bool restored_ = false;             // root_ is no child of ours
  bool ended_by_checkpoint_ = false;  // checkpoint --kill ended the tree
  bool ended_by_signal_ = false;      // an ending signal came (IsEnding)
};

}  // namespace

int RunAnchor(const AnchorOptions& options) { return Anchor(options).Run(); }

}  // namespace gpuckpt
