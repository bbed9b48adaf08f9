// wl_threads: eight threads, each mutating its own known state.
//
// Thread t owns a block of 512 words that always equals the pattern of
// (t, counter): every 2 ms it checks the block, its thread-local variables
// and its signal mask (odd threads also block SIGUSR2), then advances the
// counter and rewrites the block, all under its own mutex. On SIGUSR1 the
// main thread checks that every thread is still there (its tid in
// /proc/self/task), has made progress since the signal (so it runs after the
// restore), found no error itself, and that each block matches its counter.
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

constexpr int kThreads = 8;
constexpr std::size_t kWords = 512;

struct ThreadState {
  int index = 0;
  std::atomic<pid_t> tid{0};
  std::atomic<std::uint64_t> progress{0};
  std::mutex mu;  // Guards counter, words, error.
  std::uint64_t counter = 0;
  std::array<std::uint64_t, kWords> words{};
  std::string error;
};

std::uint64_t SeedOf(int index, std::uint64_t counter) {
  return (static_cast<std::uint64_t>(index) << 40) + counter;
}

// Empty when thread `s`'s block matches its counter.
std::string CheckBlock(const ThreadState& s) {
  std::size_t bad =
      wl::FirstPatternMismatch(s.words.data(), kWords * 8, SeedOf(s.index, s.counter));
  if (bad == kWords * 8) return "";
  return "thread " + std::to_string(s.index) + ": block differs at byte " + std::to_string(bad) +
         " (counter " + std::to_string(s.counter) + ")";
}

thread_local int tls_index = -1;
thread_local std::uint64_t tls_cookie = 0;

void Run(ThreadState* s) {
  tls_index = s->index;
  tls_cookie = wl::Mix64(s->index);
  s->tid = static_cast<pid_t>(syscall(SYS_gettid));
  bool odd = s->index % 2 == 1;
  if (odd) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }
  for (;;) {
    {
      std::lock_guard lock(s->mu);
      if (s->error.empty()) {
        sigset_t mask;
        pthread_sigmask(SIG_SETMASK, nullptr, &mask);
        std::string prefix = "thread " + std::to_string(s->index) + ": ";
        if (tls_index != s->index || tls_cookie != wl::Mix64(s->index)) {
          s->error = prefix + "thread-local variables changed";
        } else if (sigismember(&mask, SIGUSR2) != (odd ? 1 : 0) ||
                   sigismember(&mask, SIGUSR1) != 1) {
          s->error = prefix + "signal mask changed";
        } else if (static_cast<pid_t>(syscall(SYS_gettid)) != s->tid) {
          s->error = prefix + "tid changed";
        } else {
          s->error = CheckBlock(*s);
        }
      }
      ++s->counter;
      wl::FillPattern(s->words.data(), kWords * 8, SeedOf(s->index, s->counter));
      s->progress = s->counter;
    }
    timespec pause{0, 2 * 1000 * 1000};
    nanosleep(&pause, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  wl::Options options = wl::ParseOptions(argc, argv, 0);
  wl::BlockCheckSignal();  // Before the threads, so that they inherit it.
  static ThreadState states[kThreads];
  for (int t = 0; t < kThreads; ++t) {
    states[t].index = t;
    wl::FillPattern(states[t].words.data(), kWords * 8, SeedOf(t, 0));
    std::thread(Run, &states[t]).detach();
  }
  // Ready once every thread has run a round.
  for (;;) {
    bool all = true;
    for (auto& s : states) all = all && s.progress > 0;
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  wl::Heartbeat heartbeat;
  wl::AnnounceReady(options);
  wl::WaitForCheck([&] { heartbeat.Beat(); }, 50);

  wl::Verdict verdict;
  std::uint64_t at_signal[kThreads];
  for (int t = 0; t < kThreads; ++t) at_signal[t] = states[t].progress;
  // Every thread must advance a few rounds (2 ms each) within 5 s.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int t = 0; t < kThreads; ++t) {
    while (states[t].progress < at_signal[t] + 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (states[t].progress < at_signal[t] + 3) {
      verdict.Fail("thread " + std::to_string(t) + " made no progress (counter " +
                   std::to_string(states[t].progress) + ")");
    }
    std::string task = "/proc/self/task/" + std::to_string(states[t].tid);
    if (access(task.c_str(), F_OK) != 0) {
      verdict.Fail("thread " + std::to_string(t) + " (tid " + std::to_string(states[t].tid) +
                   ") is gone");
    }
    std::lock_guard lock(states[t].mu);
    if (!states[t].error.empty()) verdict.Fail(states[t].error);
    std::string block = CheckBlock(states[t]);
    if (!block.empty()) verdict.Fail(block);
  }
  // The main thread and the eight workers, no more, no less.
  std::size_t tasks = 0;
  for ([[maybe_unused]] auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ++tasks;
  }
  if (tasks != kThreads + 1) verdict.Fail(std::to_string(tasks) + " tasks in /proc/self/task");
  if (!heartbeat.Consistent()) verdict.Fail("heartbeat torn");
  wl::Finish(options, verdict.Text());
}
