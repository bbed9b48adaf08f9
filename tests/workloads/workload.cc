#include "tests/workloads/workload.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

namespace gpuckpt::workload {

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "workload: %s\n", what.c_str());
  std::_Exit(2);
}

[[noreturn]] void Usage(const char* argv0, std::size_t default_mib, bool takes_stall) {
  const char* stall = takes_stall ? " [--stall]" : "";
  if (default_mib != 0) {
    std::fprintf(stderr, "usage: %s RESULT_FILE [--mib N]%s   (default %zu MiB)\n", argv0, stall,
                 default_mib);
  } else {
    std::fprintf(stderr, "usage: %s RESULT_FILE%s\n", argv0, stall);
  }
  std::_Exit(2);
}

// Temp file + rename; fsync only when `sync`.
void WriteThroughRename(const std::string& path, const std::string& text, bool sync) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Die(ErrnoText("create " + tmp));
  if (!WriteAll(fd, text.data(), text.size()) || (sync && fsync(fd) != 0)) {
    Die(ErrnoText("write " + tmp));
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) Die(ErrnoText("rename to " + path));
}

std::int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The meter thread (see workload.h, step 4). The gap is taken from the
// clock, not from the sleep: a sleep cut short (EINTR, when CRIU seizes the
// thread) or overrun (the thread stopped, or the probe blocked) shows up in
// the next wake-up's gap either way.
void StallMeterLoop(const std::string& path, const std::function<void()>& probe) {
  sigset_t usr2;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  const timespec tick{0, 1000000};  // 1 ms
  const timespec no_wait{0, 0};
  std::int64_t last = MonotonicNs();
  std::int64_t max_gap = 0;
  for (;;) {
    clock_nanosleep(CLOCK_MONOTONIC, 0, &tick, nullptr);
    if (probe) probe();
    const std::int64_t now = MonotonicNs();
    max_gap = std::max(max_gap, now - last);
    last = now;
    if (sigtimedwait(&usr2, nullptr, &no_wait) == SIGUSR2) {
      // Reset first: the time spent writing (and a freeze that began
      // meanwhile) belongs to the next interval, whose first gap runs from
      // `last`, taken before the signal was seen.
      const std::int64_t report = max_gap;
      max_gap = 0;
      char text[32];
      std::snprintf(text, sizeof(text), "%.6f\n", static_cast<double>(report) / 1e9);
      WriteThroughRename(path, text, /*sync=*/false);
    }
  }
}

}  // namespace

Options ParseOptions(int argc, char** argv, std::size_t default_mib, bool takes_stall) {
  Options options;
  options.mib = default_mib;
  int i = 1;
  if (argc < 2 || argv[1][0] == '-') Usage(argv[0], default_mib, takes_stall);
  options.result_file = argv[i++];
  while (i < argc) {
    std::string arg = argv[i++];
    if (arg == "--mib" && default_mib != 0 && i < argc) {
      char* end = nullptr;
      unsigned long long mib = std::strtoull(argv[i++], &end, 10);
      if (*end != '\0' || mib == 0) Usage(argv[0], default_mib, takes_stall);
      options.mib = mib;
    } else if (arg == "--stall" && takes_stall) {
      options.stall = true;
    } else {
      Usage(argv[0], default_mib, takes_stall);
    }
  }
  return options;
}

void WriteFileAtomically(const std::string& path, const std::string& text) {
  WriteThroughRename(path, text, /*sync=*/true);
}

void BlockCheckSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) Die("cannot block SIGUSR1");
}

void StartStallMeter(const Options& options, std::function<void()> probe) {
  if (!options.stall) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR2);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) Die("cannot block SIGUSR2");
  std::thread([path = options.result_file + ".stall", probe = std::move(probe)] {
    StallMeterLoop(path, probe);
  }).detach();
}

void AnnounceReady(const Options& options) {
  WriteFileAtomically(options.result_file + ".ready", std::to_string(getpid()) + "\n");
}

void WaitForCheck(const std::function<void()>& tick, int interval_ms) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  timespec timeout{interval_ms / 1000, (interval_ms % 1000) * 1000000L};
  for (;;) {
    // EINTR comes back after a checkpoint or a restore: just wait again.
    if (sigtimedwait(&set, nullptr, &timeout) == SIGUSR1) return;
    tick();
  }
}

void Finish(const Options& options, const std::string& failure) {
  WriteFileAtomically(options.result_file, failure.empty() ? "PASS\n" : "FAIL: " + failure + "\n");
  std::_Exit(failure.empty() ? 0 : 1);
}

void Verdict::Fail(const std::string& what) {
  if (++count_ <= 4) {
    if (!text_.empty()) text_ += "; ";
    text_ += what;
  }
}

std::string Verdict::Text() const {
  if (count_ <= 4) return text_;
  return text_ + "; ... (" + std::to_string(count_) + " failures)";
}

std::uint64_t Mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::size_t PageSize() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// The pattern is a splitmix64 stream: word k of seed s is Mix64(s * 2^20 + k)
// (pattern areas stay far below 2^20 words, so seeds never overlap).
void FillPattern(void* data, std::size_t bytes, std::uint64_t seed) {
  auto* words = static_cast<std::uint64_t*>(data);
  std::uint64_t base = Mix64(seed) << 20;
  for (std::size_t k = 0; k < bytes / 8; ++k) words[k] = Mix64(base + k);
}

std::size_t FirstPatternMismatch(const void* data, std::size_t bytes, std::uint64_t seed) {
  const auto* words = static_cast<const std::uint64_t*>(data);
  std::uint64_t base = Mix64(seed) << 20;
  for (std::size_t k = 0; k < bytes / 8; ++k) {
    std::uint64_t want = Mix64(base + k);
    if (words[k] != want) {
      std::size_t b = 0;
      while (reinterpret_cast<const unsigned char*>(&words[k])[b] ==
             reinterpret_cast<const unsigned char*>(&want)[b]) {
        ++b;
      }
      return k * 8 + b;
    }
  }
  return bytes;
}

std::size_t FirstNonZero(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return i;
  }
  return bytes;
}

std::uint64_t HashWords(const void* data, std::size_t bytes) {
  const auto* words = static_cast<const std::uint64_t*>(data);
  // Four independent lanes, so that the multiply chains overlap.
  std::uint64_t h[4] = {1, 2, 3, 4};
  std::size_t n = bytes / 8;
  std::size_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int l = 0; l < 4; ++l) h[l] = (h[l] ^ words[k + l]) * 0x9fb21c651e98df25ULL;
  }
  for (; k < n; ++k) h[0] = (h[0] ^ words[k]) * 0x9fb21c651e98df25ULL;
  return Mix64(h[0] ^ Mix64(h[1] ^ Mix64(h[2] ^ Mix64(h[3] ^ bytes))));
}

void* MapAnonymous(std::size_t bytes, bool shared) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die(ErrnoText("mmap of " + std::to_string(bytes) + " bytes"));
  return p;
}

void Heartbeat::Beat() {
  ++beats_;
  check_ = Mix64(beats_);
}

bool Heartbeat::Consistent() const { return check_ == Mix64(beats_); }

bool WriteAll(int fd, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, void* data, std::size_t bytes) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

bool ReadLine(int fd, std::string* line, int timeout_ms) {
  line->clear();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char c;
    ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

std::string ErrnoText(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace gpuckpt::workload
