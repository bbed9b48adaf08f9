// OperationBoard: what each process's `status` file says about operations:
// the one in flight (kind, stage, bytes done, elapsed) and the last result.
// It is also the lock that keeps two operations off one process: Begin()
// fails with kBusy while another runs.
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
#include <mutex>
#include <string>

#include "gpuckpt/status.h"

namespace gpuckpt {

class OperationBoard {
 public:
  class Ticket;

  // Marks an operation of `kind` ("checkpoint") on `pid` in flight.
  Result<std::unique_ptr<Ticket>> Begin(int pid, std::string kind);
  // A ticket for an operation no process's status shows and nothing needs
  // to keep off others: the restore of a tree with a pid namespace of its
  // own, whose pids (1 at its root) are no process's here until it is
  // back, under a new pid. Its calls do nothing.
  static std::unique_ptr<Ticket> Unlisted();

  // "idle", or "checkpoint (stage dump, 1.2 GB read, 3.4 s)".
  std::string InFlight(int pid) const;
  // The last operation's result line, or "none".
  std::string Last(int pid) const;

  class Ticket {
   public:
    ~Ticket();
    void SetStage(std::string stage);
    void SetBytes(uint64_t bytes) { bytes_.store(bytes, std::memory_order_relaxed); }
    // The result shown as "last:" once the operation ends.
    void SetResult(std::string result);

   private:
    friend class OperationBoard;
    Ticket(OperationBoard* board, int pid) : board_(board), pid_(pid) {}
    OperationBoard* board_;
    int pid_;
    std::atomic<uint64_t> bytes_{0};
  };

 private:
  struct Entry {
    bool in_flight = false;
    std::string kind;
    std::string stage;
    std::chrono::steady_clock::time_point start;
    const Ticket* ticket = nullptr;
    std::string last = "none";
  };
  mutable std::mutex mu_;
  std::map<int, Entry> entries_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_ENGINE_OPERATION_BOARD_H_
