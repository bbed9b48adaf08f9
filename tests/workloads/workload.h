// The protocol shared by the checkpoint workloads (in the spirit of CRIU's
// zdtm): a workload builds its state, announces that it is ready, keeps
// running until it is asked to check itself, then reports PASS or FAIL.
//
//   wl_NAME RESULT_FILE [--mib N] [--stall]
//
// 1. Once its state is built, the workload writes its pid into
//    RESULT_FILE.ready (temp file + rename, so a reader never sees half).
// 2. It keeps running, sleeping in short intervals and doing light work that
//    keeps its state consistent, while it is checkpointed, killed, restored.
// 3. On SIGUSR1 it verifies everything, writes "PASS\n" or "FAIL: <what>\n"
//    to RESULT_FILE (temp + rename) and exits 0 (pass) or 1 (fail).
//
// Stall meter (workloads that take --stall, and only with it: wl_big,
// wl_memory, tests/gpu/gpu_memory): how long the process was stopped, from its own
// point of view. A thread wakes every 1 ms (clock_nanosleep, CLOCK_MONOTONIC)
// and keeps the largest gap between two consecutive wake-ups. When the whole
// process is frozen (CRIU's ptrace freeze, SIGSTOP) the gap spans the
// freeze; a workload may also give the thread a probe to run at every
// wake-up (gpu_memory: a tiny CUDA operation, which blocks while the driver
// holds the process's CUDA lock; wl_memory: a read of one of its pages,
// which a lazily restored process waits for), so that the gap also spans
// that.
// 4. On SIGUSR2 (blocked in every thread, taken only by the meter thread)
//    the workload writes RESULT_FILE.stall (temp + rename; no fsync: it is
//    read on the same machine): the largest gap since the previous SIGUSR2,
//    or since the meter started, in seconds with 6 decimals ("0.934512\n"),
//    and starts the next interval. A reader resets the meter by sending
//    SIGUSR2, waiting for the file and removing it; does what it measures;
//    then sends SIGUSR2 again and reads the file. Send it only while nothing
//    checkpoints the process (the file is open for a few microseconds).
//    The gap across a kill and restore is the time the process did not
//    exist, not a freeze: read it across leave-running checkpoints only.
//
// Workloads hold nothing that gpuckpt's CRIU cannot dump (no inotify, no
// sockets to the outside; wl_tree's one TCP connection stays on loopback,
// within the tree) and print nothing once ready: CRIU
// checks the size of every open regular file on restore, so a workload that
// wrote to its redirected stdout after a checkpoint could not be restored
// from that checkpoint a second time.
//
// Nothing here is thread-safe unless it says so; call it from the main thread.
#ifndef GPUCKPT_TESTS_WORKLOADS_WORKLOAD_H_
#define GPUCKPT_TESTS_WORKLOADS_WORKLOAD_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace gpuckpt::workload {

// The command line every workload takes.
struct Options {
  std::string result_file;
  // Size of the memory the workload builds, for those that take --mib.
  std::size_t mib = 0;
  // --stall: run the stall meter (StartStallMeter).
  bool stall = false;
};

// Parses `RESULT_FILE [--mib N] [--stall]`; exits with status 2 and a usage
// line on bad input. `default_mib` == 0 means the workload takes no --mib;
// `takes_stall` false means it takes no --stall.
Options ParseOptions(int argc, char** argv, std::size_t default_mib, bool takes_stall = false);

// Writes `text` to `path` through a temporary file in the same directory and
// rename(2), so that a reader sees either nothing or all of it. Exits with
// status 2 on failure (the driver then times out waiting, saying which file).
void WriteFileAtomically(const std::string& path, const std::string& text);

// Blocks SIGUSR1 in the calling thread. Call it before creating threads or
// children, so that all inherit the mask and the signal is only ever taken
// by WaitForCheck().
void BlockCheckSignal();

// Starts the stall meter (protocol step 4 above) when `options.stall`, else
// does nothing. Call it right after BlockCheckSignal() and before creating
// any other thread (a CUDA program: before its first CUDA call): it blocks
// SIGUSR2 in the calling thread, which every later thread inherits, so that
// the signal, whose default action ends the process, reaches only the meter.
// `probe`, when given, runs in the meter thread after every wake-up; it must
// be thread-safe with the rest of the program and should take microseconds
// (its time counts in the gap, which is the point when it blocks).
void StartStallMeter(const Options& options, std::function<void()> probe = nullptr);

// Writes getpid() into RESULT_FILE.ready.
void AnnounceReady(const Options& options);

// Calls `tick` about every `interval_ms` until SIGUSR1 arrives.
void WaitForCheck(const std::function<void()>& tick, int interval_ms);

// Writes the verdict ("PASS" when `failure` is empty) to RESULT_FILE and
// ends the process at once with status 0 or 1, without running destructors
// (other threads may still be running).
[[noreturn]] void Finish(const Options& options, const std::string& failure);

// Collects failures; keeps the first few so that the verdict stays one line.
class Verdict {
 public:
  void Fail(const std::string& what);
  bool ok() const { return count_ == 0; }
  // "" when ok, else "what1; what2; ... (N failures)".
  std::string Text() const;

 private:
  std::string text_;
  int count_ = 0;
};

// --- Known patterns -----------------------------------------------------------

// A strong 64-bit mixer (splitmix64's finalizer): distinct inputs give
// unrelated outputs, so patterns derived from an index catch swapped pages.
std::uint64_t Mix64(std::uint64_t x);

std::size_t PageSize();

// Fills `bytes` (a multiple of 8) with the pattern of `seed`.
void FillPattern(void* data, std::size_t bytes, std::uint64_t seed);

// Offset of the first byte that differs from the pattern of `seed`, or
// `bytes` when all match.
std::size_t FirstPatternMismatch(const void* data, std::size_t bytes, std::uint64_t seed);

// Offset of the first non-zero byte, or `bytes` when all are zero.
std::size_t FirstNonZero(const void* data, std::size_t bytes);

// A 64-bit hash of `bytes` (a multiple of 8).
std::uint64_t HashWords(const void* data, std::size_t bytes);

// Anonymous private memory, or dies saying why.
void* MapAnonymous(std::size_t bytes, bool shared = false);

// A counter and a check word that the idle loop advances together; a
// restore that loses or tears memory breaks the relation.
class Heartbeat {
 public:
  void Beat();
  bool Consistent() const;
  std::uint64_t beats() const { return beats_; }

 private:
  std::uint64_t beats_ = 0;
  std::uint64_t check_ = Mix64(0);
};

// --- Small I/O helpers ----------------------------------------------------------

// write(2) / read(2) of exactly `bytes`, retrying on EINTR and short counts.
bool WriteAll(int fd, const void* data, std::size_t bytes);
bool ReadAll(int fd, void* data, std::size_t bytes);

// Reads one line (without the '\n') from `fd`, waiting at most `timeout_ms`
// in total. False on timeout, EOF or error.
bool ReadLine(int fd, std::string* line, int timeout_ms);

std::string ErrnoText(const std::string& what);

}  // namespace gpuckpt::workload

#endif  // GPUCKPT_TESTS_WORKLOADS_WORKLOAD_H_
