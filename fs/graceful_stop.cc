#include "fs/graceful_stop.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "core/base/log.h"

namespace gpuckpt {

namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr unsigned char kQuit = 0;  // from the destructor, not a signal

// What a signal handler may touch: the pipe's write end, and libfuse's
// handlers to put back (one session per process).
std::atomic<int> g_write_fd{-1};
struct sigaction g_fuse_actions[3];

void OnStopSignal(int sig) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  const int fd = g_write_fd.load();
  if (fd >= 0 && write(fd, &byte, 1) < 0) {
    // The pipe is full of earlier signals: this one changes nothing.
  }
  errno = saved_errno;
}

void RestoreFuseHandlers() {
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &g_fuse_actions[i], nullptr);
}

}  // namespace

Result<std::unique_ptr<GracefulStop>> GracefulStop::Install(Engine* engine,
                                                            std::chrono::seconds max_wait) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return StatusFromErrno(errno, "pipe");
  std::unique_ptr<GracefulStop> stop(new GracefulStop(engine, max_wait, fds[0], fds[1]));
  g_write_fd = fds[1];
  struct sigaction ours = {};
  ours.sa_handler = OnStopSignal;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESTART;
  for (int i = 0; i < 3; ++i) {
    if (sigaction(kStopSignals[i], &ours, &g_fuse_actions[i]) != 0)
      return StatusFromErrno(errno, "sigaction");
  }
  // The waiting thread takes none of them: they reach a thread of the
  // session, whose libfuse handler must interrupt it in the end.
  sigset_t block;
  sigemptyset(&block);
  for (int sig : kStopSignals) sigaddset(&block, sig);
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &block, &old);
  stop->thread_ = std::thread([s = stop.get()] { s->Run(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return stop;
}

GracefulStop::GracefulStop(Engine* engine, std::chrono::seconds max_wait, int read_fd, int write_fd)
    : engine_(engine),
      max_wait_(max_wait),
      read_fd_(read_fd),
      write_fd_(write_fd),
      loop_thread_(pthread_self()) {}

GracefulStop::~GracefulStop() {
  RestoreFuseHandlers();
  g_write_fd = -1;
  const unsigned char quit = kQuit;
  if (write(write_fd_, &quit, 1) < 0) {
    // Full: the thread has a signal to read and ends anyway.
  }
  thread_.join();
  close(read_fd_);
  close(write_fd_);
}

void GracefulStop::Run() {
  // The first signal, or the destructor's quit.
  auto next = [this](int timeout_ms) -> int {
    struct pollfd p = {read_fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return -1;
    unsigned char byte;
    return read(read_fd_, &byte, 1) == 1 ? byte : -1;
  };
  int sig = -1;
  while (sig < 0) sig = next(-1);
  if (sig == kQuit) return;
  const auto deadline = std::chrono::steady_clock::now() + max_wait_;
  bool said = false;
  for (;;) {
    const size_t lazy = engine_->LazyRestoresInFlight();
    if (lazy == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      spdlog::warn(
          "stopping: {} lazily restored tree(s) still coming in after {} s; they will "
          "be killed",
          lazy, max_wait_.count());
      break;
    }
    if (!said) {
      spdlog::info(
          "stopping: waiting up to {} s for {} lazily restored tree(s) to be resident "
          "(signal again to stop at once)",
          max_wait_.count(), lazy);
      said = true;
    }
    const int again = next(100);
    if (again == kQuit) return;
    if (again > 0) {
      spdlog::warn("stopping at once: {} lazily restored tree(s) still coming in will be killed",
                   lazy);
      break;
    }
  }
  RestoreFuseHandlers();
  // libfuse's handler ends the loop only from inside it: the loop may not
  // have begun yet (it starts afresh), or be between its check and its
  // wait. So the signal goes to the loop's thread again every 100 ms,
  // until the loop has ended and the destructor says so.
  for (;;) {
    pthread_kill(loop_thread_, sig);
    if (next(100) == kQuit) return;
  }
}

}  // namespace gpuckpt
