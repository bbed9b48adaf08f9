#include "fs/command_runner.h"

#include <string>
#include <system_error>
#include <utility>

namespace gpuckpt {

CommandRunner::~CommandRunner() { WaitForAll(); }

Status CommandRunner::Start(uint32_t uid, std::shared_ptr<std::atomic<bool>> interrupted,
                            std::function<void()> command) {
  JoinEnded();
  uint64_t id = 0;
  {
    MutexLock lock(&mu_);
    size_t& mine = per_uid_[uid];
    if (mine >= max_per_uid_) {
      return Status::Busy("uid " + std::to_string(uid) + " already runs " + std::to_string(mine) +
                          " commands, the most one user may run at once");
    }
    ++mine;
    id = next_id_++;
    running_[id] = Running{uid, std::move(interrupted), std::thread(), false};
  }
  std::thread thread;
  try {
    thread = std::thread([this, id, command = std::move(command)] {
      command();
      End(id);
    });
  } catch (const std::system_error& e) {
    MutexLock lock(&mu_);
    if (--per_uid_[uid] == 0) per_uid_.erase(uid);
    running_.erase(id);
    return Status(StatusCode::kNoMemory,
                  std::string("no thread could be started for the command: ") + e.what());
  }
  MutexLock lock(&mu_);
  Running& entry = running_.at(id);
  entry.thread = std::move(thread);
  // Ended already: a waiter may be waiting for exactly this thread.
  if (entry.ended) ended_cv_.NotifyAll();
  return Status::Ok();
}

void CommandRunner::End(uint64_t id) {
  MutexLock lock(&mu_);
  Running& entry = running_.at(id);
  entry.ended = true;
  if (--per_uid_[entry.uid] == 0) per_uid_.erase(entry.uid);
  ended_cv_.NotifyAll();
}

void CommandRunner::CancelAll() {
  MutexLock lock(&mu_);
  for (auto& [id, entry] : running_) {
    if (entry.interrupted != nullptr) entry.interrupted->store(true, std::memory_order_relaxed);
  }
}

bool CommandRunner::AnyEnded() const {
  for (const auto& [id, entry] : running_)
    if (entry.ended && entry.thread.joinable()) return true;
  return false;
}

std::vector<std::thread> CommandRunner::TakeEnded() {
  std::vector<std::thread> ended;
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->second.ended && it->second.thread.joinable()) {
      ended.push_back(std::move(it->second.thread));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return ended;
}

void CommandRunner::JoinEnded() {
  std::vector<std::thread> ended;
  {
    MutexLock lock(&mu_);
    ended = TakeEnded();
  }
  for (std::thread& t : ended) t.join();
}

void CommandRunner::WaitForAll() {
  for (;;) {
    std::vector<std::thread> ended;
    {
      MutexLock lock(&mu_);
      while (!running_.empty() && !AnyEnded()) ended_cv_.Wait(mu_);
      if (running_.empty()) return;
      ended = TakeEnded();
    }
    for (std::thread& t : ended) t.join();
  }
}

size_t CommandRunner::running() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, entry] : running_)
    if (!entry.ended) ++n;
  return n;
}

}  // namespace gpuckpt
