// wl_reaper: runs a command as a child subreaper and reaps every orphan.
//
//   wl_reaper COMMAND [ARGS...]
//
// `criu restore -d` (and a daemon that runs CRIU) leaves the restored process
// an orphan; it is reparented to the nearest subreaper, else to PID 1. Where
// PID 1 does not reap (a bare container init), the restored process stays a
// zombie once it exits, its pid stays taken, and the same checkpoint cannot
// be restored again. The test scripts run under this helper, which reaps
// them. Exits with the command's status (128 + signal if it was killed).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace {

pid_t command_pid = 0;

void Forward(int sig) {
  if (command_pid > 0) kill(command_pid, sig);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s COMMAND [ARGS...]\n", argv[0]);
    return 2;
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    std::fprintf(stderr, "wl_reaper: PR_SET_CHILD_SUBREAPER: %s\n", std::strerror(errno));
    return 2;
  }
  command_pid = fork();
  if (command_pid < 0) {
    std::fprintf(stderr, "wl_reaper: fork: %s\n", std::strerror(errno));
    return 2;
  }
  if (command_pid == 0) {
    execvp(argv[1], argv + 1);
    std::fprintf(stderr, "wl_reaper: %s: %s\n", argv[1], std::strerror(errno));
    _exit(127);
  }
  struct sigaction sa {};
  sa.sa_handler = Forward;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) return 2;
    if (pid != command_pid) continue;  // A reaped orphan.
    // Orphans left now go to our own reaper; the command's status is ours.
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
  }
}
