// A process for the CRIU tests to dump and restore: it fills a buffer with a
// known pattern, writes READY to its status file, and then loops; on
// SIGUSR1 it checks the pattern and writes PASS or FAIL to the status file.
// It holds no open files besides stdio, so that CRIU needs nothing special.
//
// Usage: criu_test_workload <status file> <MiB>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

volatile sig_atomic_t check_requested = 0;

void OnUsr1(int) { check_requested = 1; }

uint64_t PatternAt(size_t i) { return (i * 0x9E3779B97F4A7C15ull) ^ (i >> 7) ^ 0x5A5A; }

void WriteStatus(const char* path, const char* text) {
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd < 0) return;
  if (write(fd, text, strlen(text)) < 0) perror("write");
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <status file> <MiB>\n", argv[0]);
    return 2;
  }
  const size_t words = static_cast<size_t>(atoi(argv[2])) * (1 << 20) / sizeof(uint64_t);
  uint64_t* buf = static_cast<uint64_t*>(malloc(words * sizeof(uint64_t)));
  if (buf == nullptr) return 1;
  for (size_t i = 0; i < words; ++i) buf[i] = PatternAt(i);
  signal(SIGUSR1, OnUsr1);
  WriteStatus(argv[1], "READY\n");
  while (true) {
    if (check_requested) {
      check_requested = 0;
      bool ok = true;
      for (size_t i = 0; i < words && ok; ++i) ok = buf[i] == PatternAt(i);
      WriteStatus(argv[1], ok ? "PASS\n" : "FAIL\n");
    }
    const timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}
