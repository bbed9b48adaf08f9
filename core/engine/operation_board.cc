#include "core/engine/operation_board.h"

#include <cstdio>
#include <sstream>

#include "core/base/time_text.h"

namespace gpuckpt {

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
  return lines;
}

Result<std::unique_ptr<OperationBoard::Ticket>> OperationBoard::Begin(int pid, std::string kind) {
  MutexLock lock(&mu_);
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
  e.stage_start = e.start;
  e.started_ns = UnixNowNs();
  e.ticket = ticket.get();
  e.pending = OperationOutcome{};
  e.pending.operation = e.kind;
  e.pending.started_ns = e.started_ns;
  return ticket;
}

std::unique_ptr<OperationBoard::Ticket> OperationBoard::Unlisted() {
  return std::unique_ptr<Ticket>(new Ticket(nullptr, 0));
}

std::optional<OperationInFlight> OperationBoard::InFlightInfo(int pid) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(pid);
  if (it == entries_.end() || !it->second.in_flight) return std::nullopt;
  const Entry& e = it->second;
  const auto now = std::chrono::steady_clock::now();
  OperationInFlight op;
  op.kind = e.kind;
  op.stage = e.stage;
  op.bytes = e.ticket->bytes_.load(std::memory_order_relaxed);
  op.elapsed_s = std::chrono::duration<double>(now - e.start).count();
  op.started_ns = e.started_ns;
  op.expected_bytes = e.ticket->expected_bytes_.load(std::memory_order_relaxed);
  op.stage_elapsed_s = std::chrono::duration<double>(now - e.stage_start).count();
  return op;
}

std::string OperationBoard::InFlight(int pid) const {
  const auto op = InFlightInfo(pid);
  if (!op) return "idle";
  return op->kind + " (" + ProgressText(*op) + ")";
}

std::string OperationBoard::Last(int pid) const {
  const auto last = LastOutcome(pid);
  return last ? last->summary : "none";
}

std::optional<OperationOutcome> OperationBoard::LastOutcome(int pid) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(pid);
  if (it == entries_.end()) return std::nullopt;
  return it->second.last;
}

OperationBoard::Ticket::~Ticket() {
  if (board_ == nullptr) return;
  MutexLock lock(&board_->mu_);
  Entry& e = board_->entries_[pid_];
  e.in_flight = false;
  e.ticket = nullptr;
  // An operation that set no outcome leaves the last one standing.
  if (!e.pending.summary.empty()) {
    e.pending.ended_ns = UnixNowNs();
    e.last = std::move(e.pending);
  }
  e.pending = OperationOutcome{};
}

void OperationBoard::Ticket::SetStage(std::string stage) {
  if (board_ == nullptr) return;
  MutexLock lock(&board_->mu_);
  Entry& e = board_->entries_[pid_];
  e.stage = std::move(stage);
  e.stage_start = std::chrono::steady_clock::now();
}

void OperationBoard::Ticket::SetResult(std::string summary) {
  if (board_ == nullptr) return;
  MutexLock lock(&board_->mu_);
  OperationOutcome& o = board_->entries_[pid_].pending;
  o.ok = true;
  o.summary = std::move(summary);
}

void OperationBoard::Ticket::SetFailure(const Status& status, std::vector<std::string> detail) {
  if (board_ == nullptr) return;
  std::vector<std::string> lines = SplitLines(status.message());
  MutexLock lock(&board_->mu_);
  OperationOutcome& o = board_->entries_[pid_].pending;
  o.ok = false;
  o.summary = o.operation + " failed: " + (lines.empty() ? status.ToString() : lines.front());
  // The status's further lines first, then what the operation added
  // (AddDetail), then `detail`.
  std::vector<std::string> all(lines.size() > 1 ? lines.begin() + 1 : lines.end(), lines.end());
  all.insert(all.end(), o.detail.begin(), o.detail.end());
  for (auto& line : detail)
    for (auto& part : SplitLines(line)) all.push_back(std::move(part));
  o.detail = std::move(all);
}

void OperationBoard::Ticket::AddDetail(const std::vector<std::string>& lines) {
  if (board_ == nullptr) return;
  MutexLock lock(&board_->mu_);
  for (const auto& line : lines)
    for (auto& part : SplitLines(line)) board_->entries_[pid_].pending.detail.push_back(part);
}

void OperationBoard::Ticket::SetCriuLog(std::string path) {
  if (board_ == nullptr) return;
  MutexLock lock(&board_->mu_);
  board_->entries_[pid_].pending.criu_log = std::move(path);
}

void OperationBoard::Ticket::SetCheckpoint(std::string id) {
  if (board_ == nullptr) return;
  MutexLock lock(&board_->mu_);
  board_->entries_[pid_].pending.checkpoint = std::move(id);
}

}  // namespace gpuckpt
