// wl_big: a large address space (--mib, default 1024) of mixed pages, for
// checkpoints whose images are big enough to stream, chunk and dedup at scale.
//
// Page i is, by i % 8: 1, 5 never touched (holes); 6 half pattern, half
// zeros (compresses); else a pattern seeded by i. At setup the hash of every
// page goes into a table (itself covered by one hash); on SIGUSR1 every page
// is hashed again and compared, and the first word of each pattern page is
// checked against its index, so a swapped page cannot match.
//
// --stall runs the stall meter of workload.h (SIGUSR2 -> RESULT_FILE.stall:
// the longest the process was stopped), for tests/bench/checkpoint_bench.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

enum class PageKind { kHole, kHalf, kPattern };

PageKind KindOf(std::size_t i) {
  switch (i % 8) {
    case 1:
    case 5:
      return PageKind::kHole;
    case 6:
      return PageKind::kHalf;
    default:
      return PageKind::kPattern;
  }
}

}  // namespace

int main(int argc, char** argv) {
  wl::Options options = wl::ParseOptions(argc, argv, 1024, /*takes_stall=*/true);
  wl::BlockCheckSignal();
  wl::StartStallMeter(options);
  const std::size_t page = wl::PageSize();
  const std::size_t pages = options.mib * (1 << 20) / page;
  auto* mem = static_cast<unsigned char*>(wl::MapAnonymous(pages * page));
  std::vector<std::uint64_t> hashes(pages);
  for (std::size_t i = 0; i < pages; ++i) {
    unsigned char* p = mem + i * page;
    switch (KindOf(i)) {
      case PageKind::kHole:
        break;
      case PageKind::kHalf:
        wl::FillPattern(p, page / 2, i);
        break;
      case PageKind::kPattern:
        wl::FillPattern(p, page, i);
        break;
    }
    hashes[i] = wl::HashWords(p, page);
  }
  const std::uint64_t table_hash = wl::HashWords(hashes.data(), hashes.size() * 8);
  const std::uint64_t zero_hash = hashes[1];
  wl::Heartbeat heartbeat;
  wl::AnnounceReady(options);
  wl::WaitForCheck([&] { heartbeat.Beat(); }, 50);

  wl::Verdict verdict;
  if (wl::HashWords(hashes.data(), hashes.size() * 8) != table_hash) {
    verdict.Fail("the table of page hashes changed");
  }
  std::uint64_t first_word_of_pattern = 0;
  wl::FillPattern(&first_word_of_pattern, 8, 0);  // Seeds the check below.
  for (std::size_t i = 0; i < pages; ++i) {
    const unsigned char* p = mem + i * page;
    std::string where = "page " + std::to_string(i);
    if (wl::HashWords(p, page) != hashes[i]) verdict.Fail(where + ": hash differs");
    if (KindOf(i) == PageKind::kHole && hashes[i] != zero_hash) {
      verdict.Fail(where + ": hole was not zero at setup");
    }
    if (KindOf(i) != PageKind::kHole && wl::FirstPatternMismatch(p, 8, i) != 8) {
      verdict.Fail(where + ": first word is not the one of its index");
    }
  }
  if (!heartbeat.Consistent()) verdict.Fail("heartbeat torn");
  wl::Finish(options, verdict.Text());
}
