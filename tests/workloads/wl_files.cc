// wl_files: file descriptors whose state lives in the kernel.
//
//   regular   RESULT_FILE.regular, O_RDWR, offset 12345, known contents
//   dup       dup() of `regular`: one open file, so one shared offset
//   readonly  the same file again, O_RDONLY | O_CLOEXEC, its own offset 777
//   ghost     RESULT_FILE.ghost, opened then unlinked (CRIU dumps it as a
//             ghost file; it stays under CRIU's default 1 MiB ghost limit)
//   pipe      5000 unread bytes in a pipe (both ends held)
//   stream    an AF_UNIX stream socketpair, 3000 bytes queued one way and
//             1000 the other
//   dgram     an AF_UNIX datagram socketpair with three queued messages of
//             10, 200 and 1 bytes (boundaries must survive)
// On SIGUSR1: fd numbers, flags, offsets (and that the dup still shares its
// offset), contents, link count of the ghost, and every queued byte.
// Nothing is written to the regular file after setup, so the same checkpoint
// can be restored again (CRIU checks the size of regular files on restore).
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

constexpr std::size_t kRegularBytes = 64 * 1024 + 120;
constexpr off_t kRegularOffset = 12345;
constexpr off_t kReadonlyOffset = 777;
constexpr std::size_t kGhostBytes = 300 * 1024;
constexpr off_t kGhostOffset = 4242;
constexpr std::size_t kPipeBytes = 5000;
constexpr std::size_t kStreamAtoB = 3000;
constexpr std::size_t kStreamBtoA = 1000;
constexpr std::size_t kDgramSizes[] = {10, 200, 1};

std::vector<unsigned char> Pattern(std::size_t bytes, std::uint64_t seed) {
  std::vector<unsigned char> data((bytes + 7) / 8 * 8);
  wl::FillPattern(data.data(), data.size(), seed);
  data.resize(bytes);
  return data;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "wl_files: %s\n", what.c_str());
  std::_Exit(2);
}

void Check(bool ok, const std::string& what) {
  if (!ok) Die(wl::ErrnoText(what));
}

struct Fds {
  int regular, dup, readonly, ghost, pipe_r, pipe_w, stream_a, stream_b, dgram_a, dgram_b;
};

// Checks an fd's offset and access mode; "" when they are as expected.
std::string CheckFd(const char* name, int fd, off_t offset, int accmode, bool cloexec) {
  std::string prefix = std::string(name) + " (fd " + std::to_string(fd) + "): ";
  int fl = fcntl(fd, F_GETFL);
  int fdfl = fcntl(fd, F_GETFD);
  if (fl < 0 || fdfl < 0) return prefix + "not open";
  if ((fl & O_ACCMODE) != accmode) return prefix + "access mode " + std::to_string(fl & O_ACCMODE);
  if (((fdfl & FD_CLOEXEC) != 0) != cloexec) return prefix + "FD_CLOEXEC changed";
  off_t at = lseek(fd, 0, SEEK_CUR);
  if (offset >= 0 && at != offset) return prefix + "offset " + std::to_string(at);
  return "";
}

std::string CheckContents(const char* name, int fd, const std::vector<unsigned char>& want) {
  std::vector<unsigned char> got(want.size() + 1);
  ssize_t n = pread(fd, got.data(), got.size(), 0);
  if (n != static_cast<ssize_t>(want.size())) {
    return std::string(name) + ": read " + std::to_string(n) + " bytes, want " +
           std::to_string(want.size());
  }
  got.resize(want.size());
  if (got != want) return std::string(name) + ": contents differ";
  return "";
}

// Receives exactly the queued bytes `want` from `fd` and then nothing more.
std::string CheckQueue(const char* name, int fd, const std::vector<unsigned char>& want) {
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)
    return std::string(name) + ": fcntl";
  std::vector<unsigned char> got(want.size());
  std::size_t have = 0;
  while (have < want.size()) {
    ssize_t n = read(fd, got.data() + have, want.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return std::string(name) + ": only " + std::to_string(have) + " of " +
             std::to_string(want.size()) + " bytes queued";
    }
    have += static_cast<std::size_t>(n);
  }
  if (got != want) return std::string(name) + ": queued bytes differ";
  char extra;
  if (read(fd, &extra, 1) != -1 || errno != EAGAIN)
    return std::string(name) + ": more bytes queued";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  wl::Options options = wl::ParseOptions(argc, argv, 0);
  wl::BlockCheckSignal();
  const std::string regular_path = options.result_file + ".regular";
  const std::string ghost_path = options.result_file + ".ghost";
  const auto regular_data = Pattern(kRegularBytes, 1);
  const auto ghost_data = Pattern(kGhostBytes, 2);
  const auto pipe_data = Pattern(kPipeBytes, 3);
  const auto a_to_b = Pattern(kStreamAtoB, 4);
  const auto b_to_a = Pattern(kStreamBtoA, 5);

  Fds f{};
  f.regular = open(regular_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  Check(f.regular >= 0, "open " + regular_path);
  Check(wl::WriteAll(f.regular, regular_data.data(), regular_data.size()), "write regular");
  Check(fsync(f.regular) == 0, "fsync regular");
  Check(lseek(f.regular, kRegularOffset, SEEK_SET) == kRegularOffset, "lseek regular");
  f.dup = dup(f.regular);
  Check(f.dup >= 0, "dup");
  f.readonly = open(regular_path.c_str(), O_RDONLY | O_CLOEXEC);
  Check(f.readonly >= 0, "open readonly");
  Check(lseek(f.readonly, kReadonlyOffset, SEEK_SET) == kReadonlyOffset, "lseek readonly");

  f.ghost = open(ghost_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  Check(f.ghost >= 0, "open " + ghost_path);
  Check(wl::WriteAll(f.ghost, ghost_data.data(), ghost_data.size()), "write ghost");
  Check(lseek(f.ghost, kGhostOffset, SEEK_SET) == kGhostOffset, "lseek ghost");
  Check(unlink(ghost_path.c_str()) == 0, "unlink ghost");

  int p[2];
  Check(pipe(p) == 0, "pipe");
  f.pipe_r = p[0];
  f.pipe_w = p[1];
  Check(wl::WriteAll(f.pipe_w, pipe_data.data(), pipe_data.size()), "write pipe");

  int s[2];
  Check(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0, "socketpair stream");
  f.stream_a = s[0];
  f.stream_b = s[1];
  Check(wl::WriteAll(f.stream_a, a_to_b.data(), a_to_b.size()), "write stream a");
  Check(wl::WriteAll(f.stream_b, b_to_a.data(), b_to_a.size()), "write stream b");

  int d[2];
  Check(socketpair(AF_UNIX, SOCK_DGRAM, 0, d) == 0, "socketpair dgram");
  f.dgram_a = d[0];
  f.dgram_b = d[1];
  std::uint64_t seed = 10;
  for (std::size_t size : kDgramSizes) {
    auto msg = Pattern(size, seed++);
    Check(send(f.dgram_a, msg.data(), msg.size(), 0) == static_cast<ssize_t>(size), "send dgram");
  }

  wl::Heartbeat heartbeat;
  wl::AnnounceReady(options);
  wl::WaitForCheck([&] { heartbeat.Beat(); }, 50);

  wl::Verdict verdict;
  auto expect = [&verdict](const std::string& failure) {
    if (!failure.empty()) verdict.Fail(failure);
  };
  expect(CheckFd("regular", f.regular, kRegularOffset, O_RDWR, false));
  expect(CheckFd("dup", f.dup, kRegularOffset, O_RDWR, false));
  expect(CheckFd("readonly", f.readonly, kReadonlyOffset, O_RDONLY, true));
  expect(CheckFd("ghost", f.ghost, kGhostOffset, O_RDWR, false));
  expect(CheckFd("pipe read end", f.pipe_r, -1, O_RDONLY, false));
  expect(CheckFd("pipe write end", f.pipe_w, -1, O_WRONLY, false));
  expect(CheckContents("regular", f.regular, regular_data));
  expect(CheckContents("ghost", f.ghost, ghost_data));
  // One open file behind regular and dup: reading through one moves both.
  unsigned char buf[100];
  if (read(f.regular, buf, sizeof buf) != sizeof buf ||
      std::vector<unsigned char>(buf, buf + sizeof buf) !=
          std::vector<unsigned char>(regular_data.begin() + kRegularOffset,
                                     regular_data.begin() + kRegularOffset + sizeof buf)) {
    verdict.Fail("regular: read at its offset gave wrong bytes");
  }
  off_t dup_at = lseek(f.dup, 0, SEEK_CUR);
  if (dup_at != kRegularOffset + static_cast<off_t>(sizeof buf)) {
    verdict.Fail("dup no longer shares the offset of regular (at " + std::to_string(dup_at) + ")");
  }
  if (lseek(f.readonly, 0, SEEK_CUR) != kReadonlyOffset)
    verdict.Fail("readonly's offset moved too");
  struct stat st;
  if (fstat(f.ghost, &st) != 0 || st.st_nlink != 0 || st.st_size != kGhostBytes) {
    verdict.Fail("ghost: not an unlinked file of its size");
  }
  if (access(ghost_path.c_str(), F_OK) == 0) verdict.Fail("ghost: its name came back");
  expect(CheckQueue("pipe", f.pipe_r, pipe_data));
  expect(CheckQueue("stream a->b", f.stream_b, a_to_b));
  expect(CheckQueue("stream b->a", f.stream_a, b_to_a));
  seed = 10;
  for (std::size_t size : kDgramSizes) {
    auto want = Pattern(size, seed++);
    std::vector<unsigned char> got(512);
    ssize_t n = recv(f.dgram_b, got.data(), got.size(), MSG_DONTWAIT);
    got.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    if (got != want) {
      verdict.Fail("dgram: message of " + std::to_string(size) + " bytes came back as " +
                   std::to_string(n));
    }
  }
  char extra;
  if (recv(f.dgram_b, &extra, 1, MSG_DONTWAIT) != -1) verdict.Fail("dgram: extra message");
  if (!heartbeat.Consistent()) verdict.Fail("heartbeat torn");
  wl::Finish(options, verdict.Text());
}
