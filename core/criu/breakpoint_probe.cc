#include "core/criu/breakpoint_probe.h"

#include <signal.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>

namespace gpuckpt {
namespace {

#if defined(__x86_64__)

// Where the child runs into the breakpoint. noinline and a side effect, so
// that it is a real call at a real address.
__attribute__((noinline)) void BreakpointTarget() { asm volatile("" ::: "memory"); }

bool Probe() {
  const pid_t child = fork();
  if (child < 0) return true;  // cannot tell: leave CRIU as it is
  if (child == 0) {
    if (ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) != 0) _exit(1);
    raise(SIGSTOP);
    BreakpointTarget();
    _exit(0);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFSTOPPED(status)) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    return true;
  }
  // As CRIU's compel does: address in DR0, DR0 enabled locally in DR7.
  const bool set = ptrace(PTRACE_POKEUSER, child, offsetof(struct user, u_debugreg[0]),
                          reinterpret_cast<void*>(&BreakpointTarget)) == 0 &&
                   ptrace(PTRACE_POKEUSER, child, offsetof(struct user, u_debugreg[7]),
                          reinterpret_cast<void*>(1)) == 0;
  if (!set || ptrace(PTRACE_CONT, child, nullptr, nullptr) != 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    return true;  // CRIU finds it cannot set one and traces system calls
  }
  bool fired = false;
  // The child has one call to make: a second is generous.
  for (int i = 0; i < 1000; ++i) {
    const pid_t got = waitpid(child, &status, WNOHANG);
    if (got == child) {
      fired = WIFSTOPPED(status) && WSTOPSIG(status) == SIGTRAP;
      break;
    }
    const timespec ms = {0, 1000000};
    nanosleep(&ms, nullptr);
  }
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return fired;
}

#else

bool Probe() { return true; }

#endif

}  // namespace

bool HardwareBreakpointsFire() {
  static const bool fire = Probe();
  return fire;
}

}  // namespace gpuckpt
