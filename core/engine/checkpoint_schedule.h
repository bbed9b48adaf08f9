// CheckpointSchedule: the processes checkpointed every so often
// (`checkpoint --every`), and the one thread that runs their checkpoints
// when they are due, oldest due first, one at a time.
//
// A schedule is of one process, known by its pid and start time, so that a
// later process given the same pid is never checkpointed by it. Its run
// (the RunFn) says whether to go on: a process that ended, or is no
// longer the one scheduled, ends its schedule there. A run that takes
// longer than the interval is followed by the next at once, not by a
// burst: the next one is due an interval after the previous was due, or
// now, whichever is later.
//
// Thread-safe. The RunFn is called on the schedule's thread with no lock of
// the schedule's held, so it may call Set(), Stop() and Of(). The
// destructor stops the thread, after the run in progress (if any) ends.
#ifndef GPUCKPT_CORE_ENGINE_CHECKPOINT_SCHEDULE_H_
#define GPUCKPT_CORE_ENGINE_CHECKPOINT_SCHEDULE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "core/base/mutex.h"
#include "core/engine/engine.h"

namespace gpuckpt {

class CheckpointSchedule {
 public:
  // Runs one scheduled checkpoint of the process started at `start_time`
  // (ProcessInfo::start_time); returns whether the process is still the
  // scheduled one (false ends the schedule), and sets *ok to whether the
  // checkpoint succeeded.
  using RunFn =
      std::function<bool(const CheckpointRequest& request, uint64_t start_time, bool* ok)>;

  // What Of() reports of one schedule.
  struct View {
    std::chrono::seconds every{0};
    RetentionRule retention;
    RetentionRule owner_retention;
    int64_t next_due_mono_ns = 0;  // MonotonicNowNs()'s clock
    uint64_t runs = 0;             // scheduled checkpoints run so far
    uint64_t failures = 0;         // of those, failed
  };

  explicit CheckpointSchedule(RunFn run);
  ~CheckpointSchedule();
  CheckpointSchedule(const CheckpointSchedule&) = delete;
  CheckpointSchedule& operator=(const CheckpointSchedule&) = delete;

  // Checkpoints request.pid (started at `start_time`) with `request` every
  // request.every from now on, the first one an interval from now; replaces
  // the schedule it had.
  void Set(const CheckpointRequest& request, uint64_t start_time) EXCLUDES(mu_);
  // Ends the schedule of `pid`; false when it had none.
  bool Stop(int pid) EXCLUDES(mu_);
  // The schedule of `pid`, if it has one.
  std::optional<View> Of(int pid) const EXCLUDES(mu_);

 private:
  struct Entry {
    CheckpointRequest request;
    uint64_t start_time = 0;
    int64_t next_due_ns = 0;
    uint64_t generation = 0;  // which Set() made it: a run's result is for it alone
    uint64_t runs = 0, failures = 0;
  };
  void Loop() EXCLUDES(mu_);

  const RunFn run_;
  mutable Mutex mu_;
  CondVar changed_;
  std::map<int, Entry> entries_ GUARDED_BY(mu_);  // by pid
  uint64_t next_generation_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Set()
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_CHECKPOINT_SCHEDULE_H_
