// OperationBoard: what each process's `status` file says about operations:
// the one in flight (kind, stage, bytes done, when it began) and the last
// one's outcome. It is also the lock that keeps two operations off one
// process: Begin() fails with kBusy while another runs.
//
// Thread-safe (one mutex, held only to copy small values). Operations hold
// a Ticket; dropping it ends the operation.
#ifndef GPUCKPT_CORE_ENGINE_OPERATION_BOARD_H_
#define GPUCKPT_CORE_ENGINE_OPERATION_BOARD_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/base/mutex.h"
#include "core/engine/process_status.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// OperationOutcome and OperationInFlight: process_status.h.

class OperationBoard {
 public:
  class Ticket;

  // Marks an operation of `kind` ("checkpoint") on `pid` in flight.
  Result<std::unique_ptr<Ticket>> Begin(int pid, std::string kind) EXCLUDES(mu_);
  // A ticket for an operation no process's status shows and nothing needs
  // to keep off others: the restore of a tree with a pid namespace of its
  // own, whose pids (1 at its root) are no process's here until it is
  // back, under a new pid. Its calls do nothing.
  static std::unique_ptr<Ticket> Unlisted();

  // "idle", or "checkpoint (copying memory, 1200.0 of about 2100.0 MB
  // (57%), 3.4 s, about 3 s left)" (ProgressText).
  std::string InFlight(int pid) const EXCLUDES(mu_);
  std::optional<OperationInFlight> InFlightInfo(int pid) const EXCLUDES(mu_);
  // The last operation's summary line, or "none".
  std::string Last(int pid) const EXCLUDES(mu_);
  // The last operation's outcome, once one has ended (or set one).
  std::optional<OperationOutcome> LastOutcome(int pid) const EXCLUDES(mu_);

  class Ticket {
   public:
    ~Ticket();
    void SetStage(std::string stage);
    void SetBytes(uint64_t bytes) { bytes_.store(bytes, std::memory_order_relaxed); }
    // What the operation should read in all, estimated (OperationInFlight).
    void SetExpectedBytes(uint64_t bytes) {
      expected_bytes_.store(bytes, std::memory_order_relaxed);
    }
    // The outcome shown as "last:" once the operation ends (the summary
    // line of a success).
    void SetResult(std::string summary);
    // A failure: its first line is the summary (`operation` + " failed: "),
    // any further lines of `status` and `detail` become the detail.
    void SetFailure(const Status& status, std::vector<std::string> detail = {});
    // Lines that say more about a failure, shown after the status's own.
    void AddDetail(const std::vector<std::string>& lines);
    // The kept CRIU log of this operation's failure.
    void SetCriuLog(std::string path);
    void SetCheckpoint(std::string id);

   private:
    friend class OperationBoard;
    Ticket(OperationBoard* board, int pid) : board_(board), pid_(pid) {}
    OperationBoard* board_;
    int pid_;
    std::atomic<uint64_t> bytes_{0};
    std::atomic<uint64_t> expected_bytes_{0};
  };

 private:
  struct Entry {
    bool in_flight = false;
    std::string kind;
    std::string stage;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point stage_start;
    int64_t started_ns = 0;
    const Ticket* ticket = nullptr;
    // The outcome being recorded by the operation in flight.
    OperationOutcome pending;
    std::optional<OperationOutcome> last;
  };
  mutable Mutex mu_;
  std::map<int, Entry> entries_ GUARDED_BY(mu_);
};

// `text` split into lines, empty ones dropped.
std::vector<std::string> SplitLines(const std::string& text);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_OPERATION_BOARD_H_
