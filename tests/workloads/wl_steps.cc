// wl_steps: a job that works in steps over a hot part of a large memory,
// for measuring how soon a restored job gets on with its work
// (tests/bench/lazy_restore_bench).
//
//   wl_steps RESULT_FILE [--mib N] [--hot-mib H]
//
// Private memory of N MiB (default 256), every page a pattern seeded by its
// index (dense: every page is dumped). The hot part is H MiB (default 32,
// at most N): 64 KiB runs spread evenly over the whole memory, as a model's
// weights or a working set are spread over a heap. One step reads every
// word of the hot part and checks the first word of each of its pages
// against its pattern; steps follow each other without a pause, and after
// each one a line "STEP END_NS DURATION_NS" goes to RESULT_FILE.steps
// (opened, appended to and closed each time: the process holds no file a
// restore would check), END_NS on CLOCK_REALTIME. A step counter and its
// check word (the heartbeat) live in the memory too. On SIGUSR1 every page
// is checked, and a step that found a wrong page fails the verdict.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

constexpr std::size_t kRunBytes = 64 << 10;

int64_t NowNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Removes `--hot-mib H` from argv (the shared parser takes only --mib);
// H, or `fallback`.
std::size_t TakeHotMib(int* argc, char** argv, std::size_t fallback) {
  for (int i = 1; i + 1 < *argc; ++i) {
    if (std::strcmp(argv[i], "--hot-mib") != 0) continue;
    const std::size_t hot = std::strtoull(argv[i + 1], nullptr, 10);
    for (int j = i; j + 2 <= *argc; ++j) argv[j] = argv[j + 2];
    *argc -= 2;
    return hot;
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t hot_mib = TakeHotMib(&argc, argv, 32);
  wl::Options options = wl::ParseOptions(argc, argv, 256);
  if (hot_mib == 0 || hot_mib > options.mib) hot_mib = options.mib;
  wl::BlockCheckSignal();
  const std::size_t page = wl::PageSize();
  const std::size_t bytes = options.mib << 20;
  const std::size_t pages = bytes / page;
  auto* memory = static_cast<unsigned char*>(wl::MapAnonymous(bytes));
  for (std::size_t i = 0; i < pages; ++i) wl::FillPattern(memory + i * page, page, i);

  // The hot runs' offsets, evenly spread.
  const std::size_t runs = (hot_mib << 20) / kRunBytes;
  const std::size_t stride = bytes / runs;
  std::vector<std::size_t> hot;
  for (std::size_t r = 0; r < runs; ++r) hot.push_back(r * stride / kRunBytes * kRunBytes);

  const std::string steps_file = options.result_file + ".steps";
  wl::Heartbeat heartbeat;
  std::uint64_t step = 0;
  std::string wrong;  // the first wrong page a step found
  volatile std::uint64_t sink = 0;
  wl::AnnounceReady(options);
  wl::WaitForCheck(
      [&] {
        const int64_t start = NowNs(CLOCK_MONOTONIC);
        std::uint64_t sum = 0;
        for (std::size_t offset : hot) {
          const auto* words = reinterpret_cast<const std::uint64_t*>(memory + offset);
          for (std::size_t w = 0; w < kRunBytes / 8; ++w) sum += words[w];
          for (std::size_t p = 0; p < kRunBytes; p += page) {
            const std::size_t index = (offset + p) / page;
            if (wrong.empty() && wl::FirstPatternMismatch(memory + offset + p, 8, index) != 8)
              wrong = "page " + std::to_string(index) + " wrong in step " + std::to_string(step);
          }
        }
        sink = sum;
        heartbeat.Beat();
        ++step;
        const int64_t end = NowNs(CLOCK_MONOTONIC);
        const std::string line = std::to_string(step) + " " +
                                 std::to_string(NowNs(CLOCK_REALTIME)) + " " +
                                 std::to_string(end - start) + "\n";
        const int fd = open(steps_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
          if (write(fd, line.data(), line.size()) < 0) {
            // The driver sees the step missing; the memory check still runs.
          }
          close(fd);
        }
      },
      1);

  wl::Verdict verdict;
  if (!wrong.empty()) verdict.Fail(wrong);
  for (std::size_t i = 0; i < pages; ++i) {
    const std::size_t bad = wl::FirstPatternMismatch(memory + i * page, page, i);
    if (bad != page)
      verdict.Fail("page " + std::to_string(i) + " differs at byte " + std::to_string(bad));
  }
  if (!heartbeat.Consistent()) verdict.Fail("heartbeat torn");
  wl::Finish(options, verdict.Text());
}
