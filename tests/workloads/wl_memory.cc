// wl_memory: anonymous memory with a known content per page.
//
// Private memory (--mib, default 64) where page i is, by i % 16:
//   7      never touched (a hole: CRIU dumps nothing for it)
//   11     written with zeros (present, but all zero)
//   3, 13  the same "repeated" page (identical content, deduplicable)
//   else   a pattern seeded by i (catches swapped or shifted pages)
// plus 4 MiB of shared anonymous memory (CRIU dumps it as shmem) with a
// pattern per page. On SIGUSR1 every byte of both is compared.
//
// --stall runs the stall meter of workload.h, whose probe reads a word of
// one private page at each tick (every 1 ms), scattered across the whole
// memory: lazily restored, the process then faults every millisecond or
// so, far from its last fault, until nearly all of its memory is in.
#include <cstdint>
#include <string>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

constexpr std::uint64_t kRepeatedSeed = 0x5eed5eed;
constexpr std::uint64_t kSharedSalt = 1ULL << 40;
constexpr std::size_t kSharedBytes = 4 << 20;

enum class PageKind { kHole, kZero, kRepeated, kPattern };

PageKind KindOf(std::size_t i) {
  switch (i % 16) {
    case 7:
      return PageKind::kHole;
    case 11:
      return PageKind::kZero;
    case 3:
    case 13:
      return PageKind::kRepeated;
    default:
      return PageKind::kPattern;
  }
}

void Fill(unsigned char* page, std::size_t i) {
  std::size_t size = wl::PageSize();
  switch (KindOf(i)) {
    case PageKind::kHole:
      break;
    case PageKind::kZero:
      for (std::size_t b = 0; b < size; ++b) page[b] = 0;
      break;
    case PageKind::kRepeated:
      wl::FillPattern(page, size, kRepeatedSeed);
      break;
    case PageKind::kPattern:
      wl::FillPattern(page, size, i);
      break;
  }
}

// Offset of the first wrong byte of page i, or the page size.
std::size_t Check(const unsigned char* page, std::size_t i) {
  std::size_t size = wl::PageSize();
  switch (KindOf(i)) {
    case PageKind::kHole:
    case PageKind::kZero:
      return wl::FirstNonZero(page, size);
    case PageKind::kRepeated:
      return wl::FirstPatternMismatch(page, size, kRepeatedSeed);
    case PageKind::kPattern:
      break;
  }
  return wl::FirstPatternMismatch(page, size, i);
}

}  // namespace

int main(int argc, char** argv) {
  wl::Options options = wl::ParseOptions(argc, argv, 64, /*takes_stall=*/true);
  wl::BlockCheckSignal();
  const std::size_t page = wl::PageSize();
  const std::size_t pages = options.mib * (1 << 20) / page;
  auto* priv = static_cast<unsigned char*>(wl::MapAnonymous(pages * page));
  // Pages in a scattered order (xorshift64), never at a fixed stride, which
  // a lazy restore's server would follow and bring in ahead.
  wl::StartStallMeter(
      options, [priv, page, pages, state = std::uint64_t{0x9e3779b97f4a7c15}]() mutable {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        static_cast<void>(
            *reinterpret_cast<volatile const unsigned char*>(priv + state % pages * page));
      });
  auto* shared = static_cast<unsigned char*>(wl::MapAnonymous(kSharedBytes, /*shared=*/true));
  for (std::size_t i = 0; i < pages; ++i) Fill(priv + i * page, i);
  for (std::size_t i = 0; i < kSharedBytes / page; ++i) {
    wl::FillPattern(shared + i * page, page, kSharedSalt + i);
  }
  wl::Heartbeat heartbeat;
  wl::AnnounceReady(options);
  wl::WaitForCheck([&] { heartbeat.Beat(); }, 50);

  wl::Verdict verdict;
  for (std::size_t i = 0; i < pages; ++i) {
    std::size_t bad = Check(priv + i * page, i);
    if (bad != page) {
      verdict.Fail("private page " + std::to_string(i) + " differs at byte " + std::to_string(bad));
    }
  }
  for (std::size_t i = 0; i < kSharedBytes / page; ++i) {
    std::size_t bad = wl::FirstPatternMismatch(shared + i * page, page, kSharedSalt + i);
    if (bad != page) {
      verdict.Fail("shared page " + std::to_string(i) + " differs at byte " + std::to_string(bad));
    }
  }
  if (!heartbeat.Consistent()) verdict.Fail("heartbeat torn");
  wl::Finish(options, verdict.Text());
}
