#include "core/gpu/group_lock.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace gpuckpt {
namespace {

using Clock = std::chrono::steady_clock;

// One attempt: every process locked at the same time, each waiting at
// most `attempt_ms`. Returns each process's result, in the order of `pids`.
std::vector<Status> LockAllOnce(const CudaDriver& cuda, const std::vector<int>& pids,
                                unsigned attempt_ms) {
  std::vector<Status> results(pids.size());
  std::vector<std::thread> threads;
  threads.reserve(pids.size());
  for (size_t i = 0; i < pids.size(); ++i)
    threads.emplace_back([&, i] { results[i] = cuda.Lock(pids[i], attempt_ms); });
  for (auto& t : threads) t.join();
  return results;
}

void UnlockWhereLocked(const CudaDriver& cuda, const std::vector<int>& pids,
                       const std::vector<Status>& results) {
  for (size_t i = 0; i < pids.size(); ++i)
    if (results[i].ok()) cuda.Unlock(pids[i]).PermitUnchecked();
}

}  // namespace

Status LockTogether(const CudaDriver& cuda, const std::vector<int>& pids,
                    const GroupLockOptions& options) {
  if (pids.empty()) return Status::Ok();
  const auto deadline = Clock::now() + std::chrono::milliseconds(options.timeout_ms);
  unsigned attempt_ms = std::max(1u, std::min(options.first_attempt_ms, options.timeout_ms));
  int attempts = 0;
  std::vector<int> not_locked;
  for (;;) {
    ++attempts;
    std::vector<Status> results = LockAllOnce(cuda, pids, attempt_ms);
    not_locked.clear();
    Status hard;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (results[i].ok()) continue;
      not_locked.push_back(pids[i]);
      // Only a timeout, or a lock another checkpoint holds for a moment, is
      // worth another attempt; anything else (a process gone, a driver
      // error) will not get better.
      const StatusCode code = results[i].code();
      if (code != StatusCode::kAborted && code != StatusCode::kBusy && hard.ok()) hard = results[i];
    }
    if (not_locked.empty()) return Status::Ok();
    UnlockWhereLocked(cuda, pids, results);
    if (!hard.ok()) return hard;
    const auto now = Clock::now();
    if (now + std::chrono::milliseconds(options.backoff_ms) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(options.backoff_ms));
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    attempt_ms = static_cast<unsigned>(
        std::min<int64_t>(int64_t{attempt_ms} * 2, std::max<int64_t>(1, left.count())));
  }
  return Status::Aborted(fmt::format(
      "processes {}: CUDA not locked together within {} ms ({} attempts; {} kept GPU work in "
      "flight); they are left running: try again, or with a longer --lock-timeout",
      fmt::join(pids, ", "), options.timeout_ms, attempts, fmt::join(not_locked, ", ")));
}

}  // namespace gpuckpt
