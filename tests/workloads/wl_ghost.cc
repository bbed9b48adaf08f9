// wl_ghost: a large deleted file held open (--mib, default 64): bytes that
// a checkpoint stores although they are no process's memory.
//
// RESULT_FILE.ghost is written with a pattern per MiB (in 1 MiB pieces, so
// the process's own memory stays small), then unlinked; CRIU dumps it as a
// ghost file, whatever its size under gpuckpt (its --ghost-limit). A check
// of a checkpoint's size against the process's memory cannot foresee these
// bytes: tests/integration/test_disk_full.py uses it to fill the store's
// disk during a checkpoint. On SIGUSR1: the file is still unlinked, of its
// size, at its offset, and every byte is compared.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

constexpr std::size_t kPiece = 1 << 20;
constexpr std::uint64_t kSeed = 0x6057;

}  // namespace

int main(int argc, char** argv) {
  wl::Options options = wl::ParseOptions(argc, argv, 64);
  wl::BlockCheckSignal();
  const std::string path = options.result_file + ".ghost";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) wl::Finish(options, wl::ErrnoText("open " + path));
  std::vector<unsigned char> piece(kPiece);
  for (std::size_t i = 0; i < options.mib; ++i) {
    wl::FillPattern(piece.data(), kPiece, kSeed + i);
    if (!wl::WriteAll(fd, piece.data(), kPiece)) wl::Finish(options, wl::ErrnoText("write ghost"));
  }
  if (unlink(path.c_str()) != 0) wl::Finish(options, wl::ErrnoText("unlink " + path));
  const off_t size = static_cast<off_t>(options.mib * kPiece);
  wl::Heartbeat heartbeat;
  wl::AnnounceReady(options);
  wl::WaitForCheck([&] { heartbeat.Beat(); }, 50);

  wl::Verdict verdict;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_nlink != 0 || st.st_size != size)
    verdict.Fail("ghost: not an unlinked file of " + std::to_string(size) + " bytes");
  if (lseek(fd, 0, SEEK_CUR) != size) verdict.Fail("ghost: its offset moved");
  for (std::size_t i = 0; i < options.mib && verdict.ok(); ++i) {
    if (pread(fd, piece.data(), kPiece, static_cast<off_t>(i * kPiece)) !=
        static_cast<ssize_t>(kPiece)) {
      verdict.Fail("ghost: short read of MiB " + std::to_string(i));
    } else if (std::size_t bad = wl::FirstPatternMismatch(piece.data(), kPiece, kSeed + i);
               bad != kPiece) {
      verdict.Fail("ghost: MiB " + std::to_string(i) + " differs at byte " + std::to_string(bad));
    }
  }
  if (!heartbeat.Consistent()) verdict.Fail("heartbeat torn");
  wl::Finish(options, verdict.Text());
}
