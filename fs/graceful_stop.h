// GracefulStop: what SIGINT, SIGTERM and SIGHUP do to a mounted session.
// libfuse's own handlers end the session loop at once. Before that, while
// the mount still serves, this waits for the lazily restored trees to be
// resident (Engine::LazyRestoresInFlight): their lazy-pages servers read
// the mount, and without it they would have to kill the trees. It waits at
// most `max_wait`, and a second signal meanwhile stops at once; then the
// signal goes to libfuse's handler, in the session loop's thread, until
// the loop has ended.
//
// Ownership and thread-safety: one per session, installed and destroyed by
// the thread that runs the session loop (after fuse_set_signal_handlers(),
// before fuse_remove_signal_handlers()); it owns a thread and a pipe, and
// puts libfuse's handlers back when destroyed.
#ifndef GPUCKPT_FS_GRACEFUL_STOP_H_
#define GPUCKPT_FS_GRACEFUL_STOP_H_

#include <pthread.h>

#include <chrono>
#include <memory>
#include <thread>

#include "core/engine/engine.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

class GracefulStop {
 public:
  static Result<std::unique_ptr<GracefulStop>> Install(Engine* engine,
                                                       std::chrono::seconds max_wait);
  ~GracefulStop();
  GracefulStop(const GracefulStop&) = delete;
  GracefulStop& operator=(const GracefulStop&) = delete;

 private:
  GracefulStop(Engine* engine, std::chrono::seconds max_wait, int read_fd, int write_fd);
  void Run();

  Engine* engine_;
  std::chrono::seconds max_wait_;
  int read_fd_;
  int write_fd_;
  pthread_t loop_thread_;
  std::thread thread_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_GRACEFUL_STOP_H_
