#include "core/engine/operation_board.h"

#include <cstdio>

namespace gpuckpt {

Result<std::unique_ptr<OperationBoard::Ticket>> OperationBoard::Begin(int pid, std::string kind) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[pid];
  if (e.in_flight) {
    return Status::Busy("a " + e.kind + " of process " + std::to_string(pid) +
                        " is already in progress");
  }
  auto ticket = std::unique_ptr<Ticket>(new Ticket(this, pid));
  e.in_flight = true;
  e.kind = std::move(kind);
  e.stage = "starting";
  e.start = std::chrono::steady_clock::now();
  e.ticket = ticket.get();
  return ticket;
}

std::unique_ptr<OperationBoard::Ticket> OperationBoard::Unlisted() {
  return std::unique_ptr<Ticket>(new Ticket(nullptr, 0));
}

std::string OperationBoard::InFlight(int pid) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(pid);
  if (it == entries_.end() || !it->second.in_flight) return "idle";
  const Entry& e = it->second;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - e.start).count();
  char buf[160];
  std::snprintf(buf, sizeof(buf), " (stage %s, %.1f MB read, %.1f s)", e.stage.c_str(),
                static_cast<double>(e.ticket->bytes_.load(std::memory_order_relaxed)) / 1e6,
                elapsed);
  return e.kind + buf;
}

std::string OperationBoard::Last(int pid) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(pid);
  return it == entries_.end() ? "none" : it->second.last;
}

OperationBoard::Ticket::~Ticket() {
  if (board_ == nullptr) return;
  std::lock_guard lock(board_->mu_);
  Entry& e = board_->entries_[pid_];
  e.in_flight = false;
  e.ticket = nullptr;
}

void OperationBoard::Ticket::SetStage(std::string stage) {
  if (board_ == nullptr) return;
  std::lock_guard lock(board_->mu_);
  board_->entries_[pid_].stage = std::move(stage);
}

void OperationBoard::Ticket::SetResult(std::string result) {
  if (board_ == nullptr) return;
  std::lock_guard lock(board_->mu_);
  board_->entries_[pid_].last = std::move(result);
}

}  // namespace gpuckpt
