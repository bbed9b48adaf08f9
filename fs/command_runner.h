// CommandRunner: runs the commands written to control files on threads of
// their own, so that a long command (a checkpoint, a restore, an import)
// never holds one of the FUSE threads that serve everyone's lookups,
// listings and reads: the FUSE thread hands the command over and returns at
// once, and the command's thread replies to the write when it ends
// (libfuse lets any thread reply).
//
// Each command is counted against the uid that wrote it, and a uid with
// `max_per_uid` commands running is refused the next (kBusy) until one
// ends: one user writing many commands cannot make the daemon start
// threads without bound, nor keep anyone else's command from starting.
//
// Each command comes with the flag its writer's interrupt sets; CancelAll()
// sets every running command's, as if each writer had pressed Ctrl-C, so
// that a daemon that stops makes its commands give up at their next check
// (the engine undoes what a given-up command did) rather than wait for
// them to finish. The destructor and WaitForAll() wait for every command
// started to end.
//
// Thread-safe: Start(), CancelAll(), WaitForAll() and running() may be
// called from any thread, but not from a command's own.
#ifndef GPUCKPT_FS_COMMAND_RUNNER_H_
#define GPUCKPT_FS_COMMAND_RUNNER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "core/base/mutex.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

class CommandRunner {
 public:
  explicit CommandRunner(size_t max_per_uid) : max_per_uid_(max_per_uid) {}
  ~CommandRunner() EXCLUDES(mu_);
  CommandRunner(const CommandRunner&) = delete;
  CommandRunner& operator=(const CommandRunner&) = delete;

  // Runs `command` on a new thread, counted against `uid` until it
  // returns. `interrupted` is the flag CancelAll() sets for it (the
  // command reads it; may be null). kBusy when `uid` already runs
  // max_per_uid commands, kNoMemory when no thread could be started: then
  // `command` is not run, and the caller answers the write itself.
  Status Start(uint32_t uid, std::shared_ptr<std::atomic<bool>> interrupted,
               std::function<void()> command) EXCLUDES(mu_);

  // Sets the interrupt flag of every command running now.
  void CancelAll() EXCLUDES(mu_);

  // Returns once every command started has ended.
  void WaitForAll() EXCLUDES(mu_);

  // Commands running now (all uids).
  size_t running() const EXCLUDES(mu_);

 private:
  struct Running {
    uint32_t uid = 0;
    std::shared_ptr<std::atomic<bool>> interrupted;
    std::thread thread;  // empty until Start() has stored it
    bool ended = false;  // the command has returned; its thread is to be joined
  };
  void End(uint64_t id) EXCLUDES(mu_);
  // Takes out the threads of the commands that have ended, to be joined
  // without the lock (an ending command takes it).
  std::vector<std::thread> TakeEnded() REQUIRES(mu_);
  bool AnyEnded() const REQUIRES(mu_);
  void JoinEnded() EXCLUDES(mu_);

  const size_t max_per_uid_;
  mutable Mutex mu_;
  CondVar ended_cv_;
  uint64_t next_id_ GUARDED_BY(mu_) = 0;
  // Every command started whose thread has not been joined.
  std::map<uint64_t, Running> running_ GUARDED_BY(mu_);
  std::map<uint32_t, size_t> per_uid_ GUARDED_BY(mu_);  // commands not yet ended
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_COMMAND_RUNNER_H_
