// gpu_memory: device memory with a known content, for checkpoints of a CUDA
// process (the zdtm-style protocol of tests/workloads/workload.h).
//
//   gpu_memory RESULT_FILE --gib N [--idle] [--busy-kernel-ms MS] [--stall]
//              [--managed] [--host-mib M] [--children K]
//
// Allocates N GiB with cudaMalloc (plain device memory) and fills 32-bit
// word i with WordHash(i). Then, about every 50 ms, unless
// --idle, a kernel adds kStep to every word; the host counts the kernels, so
// after k of them word i must be WordHash(i) + k * kStep (mod 2^32). A
// checkpoint that loses, tears or shifts device memory, or a restore that
// replays or drops a kernel, breaks the relation.
//
// --busy-kernel-ms MS launches, once before the loop, a kernel that spins on
// the GPU for MS milliseconds (it touches none of the words): a driver lock
// asked for meanwhile has to wait for it, so a short lock timeout must fail.
//
// --stall runs the stall meter of tests/workloads/workload.h: on SIGUSR2 the
// process writes RESULT_FILE.stall, the longest it was stalled (seconds,
// "0.934512\n") since the previous SIGUSR2. Its thread wakes every 1 ms and,
// once the device memory is set up, runs a probe at every wake-up: a 4-byte
// cudaMemsetAsync (always 0, into a word of its own) on a stream of its own
// and a cudaStreamSynchronize of it. So the gap between two wake-ups spans
// both ways a checkpoint stalls the job, back to back when they follow each
// other: the CPU freeze (CRIU stops every thread, the meter's too) and the
// GPU block (while the driver holds the process's CUDA lock, or has its
// device memory checkpointed, the probe's CUDA calls wait). The value is
// the longer of the two, or their sum when they are contiguous. The main
// loop's kernels would show the GPU block too, but only every 50 ms and not
// at all with --idle, so they are not used for it. The probe changes no
// byte of device memory that a checkpoint would not see unchanged (its word
// stays 0); a CUDA error in it is a FAIL like any other.
//
// --managed allocates the words with cudaMallocManaged instead (CUDA's
// unified memory) and fills them on the host, so that they are touched from
// both sides: the kernels run on the device, and the check reads every word
// on the host as well as in a kernel.
//
// --host-mib M also keeps M MiB of host memory (malloc) with a pattern
// (tests/workloads/workload.h's), checked with the rest: the host heap of
// a job beside its device memory.
//
// --children K forks K children before the first CUDA call; each runs as
// this process does, with a CUDA context of its own on the same GPU and
// RESULT_FILE.child<k> as its result file, the last of them --idle (a
// process that holds a context and does nothing). The parent announces
// ready once every child has; on SIGUSR1 it checks itself, then sends each
// child SIGUSR1 and waits for it: PASS only if all pass. Children die with
// the parent (PR_SET_PDEATHSIG).
//
// On SIGUSR1 (blocked in every thread, taken only by sigtimedwait in the
// loop) a kernel counts the words that differ from what they must be, and
// the verdict goes to RESULT_FILE: "PASS" or "FAIL: <what>" (exit 0 or 1).
// Any CUDA error after ready is a FAIL naming the call and the error.
//
// Once ready it prints nothing (stdout and stderr are pointed at /dev/null):
// CRIU checks the size of every open regular file on restore.
//
// Built by tests/gpu/prepare: nvcc -arch=sm_90 -O2 -cudart static, with
// tests/workloads/workload.cc for the protocol.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

constexpr std::uint32_t kStep = 0x9e3779b9u;  // Odd: k * kStep differs for every k < 2^32.
constexpr int kIntervalMs = 50;
constexpr int kThreads = 256;

// splitmix64's finalizer (as wl::Mix64), folded to 32 bits.
__host__ __device__ inline std::uint32_t WordHash(std::uint64_t i) {
  std::uint64_t x = i + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<std::uint32_t>(x ^ (x >> 32));
}

__global__ void FillKernel(std::uint32_t* words, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    words[i] = WordHash(i);
  }
}

__global__ void AddKernel(std::uint32_t* words, std::size_t n, std::uint32_t add) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    words[i] += add;
  }
}

// Counts the words that are not WordHash(i) + add; keeps the lowest index
// of one that is not (first stays ~0 when all match).
__global__ void CheckKernel(const std::uint32_t* words, std::size_t n, std::uint32_t add,
                            unsigned long long* mismatches, unsigned long long* first) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (words[i] != WordHash(i) + add) {
      if (bad == 0) atomicMin(first, static_cast<unsigned long long>(i));
      ++bad;
    }
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

__device__ inline unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins for `ns` nanoseconds of the GPU's global timer.
__global__ void SpinKernel(unsigned long long ns, unsigned long long* sink) {
  const unsigned long long start = GlobalTimerNs();
  unsigned long long spins = 0;
  while (GlobalTimerNs() - start < ns) ++spins;
  *sink = spins;
}

struct Args {
  wl::Options options;  // result_file and stall; the size is --gib.
  std::size_t gib = 0;
  bool idle = false;
  long busy_kernel_ms = 0;
  bool managed = false;
  std::size_t host_mib = 0;
  long children = 0;
};

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s RESULT_FILE --gib N [--idle] [--busy-kernel-ms MS] [--stall] "
               "[--managed] [--host-mib M] [--children K]\n",
               argv0);
  std::_Exit(2);
}

Args Parse(int argc, char** argv) {
  Args args;
  if (argc < 2 || argv[1][0] == '-') Usage(argv[0]);
  args.options.result_file = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto number = [&](long min) {
      if (i + 1 >= argc) Usage(argv[0]);
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < min) Usage(argv[0]);
      return v;
    };
    if (arg == "--gib") {
      args.gib = static_cast<std::size_t>(number(1));
    } else if (arg == "--idle") {
      args.idle = true;
    } else if (arg == "--busy-kernel-ms") {
      args.busy_kernel_ms = number(1);
    } else if (arg == "--stall") {
      args.options.stall = true;
    } else if (arg == "--managed") {
      args.managed = true;
    } else if (arg == "--host-mib") {
      args.host_mib = static_cast<std::size_t>(number(1));
    } else if (arg == "--children") {
      args.children = number(1);
    } else {
      Usage(argv[0]);
    }
  }
  if (args.gib == 0) Usage(argv[0]);
  return args;
}

std::string Describe(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// Before ready: say what failed and exit 2 (the driver times out waiting for
// the ready file and shows this output).
void CheckOrDie(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "gpu_memory: %s\n", Describe(call, e).c_str());
  std::_Exit(2);
}

// After ready: the first CUDA error is kept for the verdict.
class ErrorLog {
 public:
  bool Check(cudaError_t e, const char* call) {
    if (e == cudaSuccess) return true;
    if (text_.empty()) text_ = Describe(call, e);
    return false;
  }
  bool ok() const { return text_.empty(); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// The stall meter's probe (see the top of the file). Runs in the meter
// thread; idle until Arm(), and for good after its first error.
class StallProbe {
 public:
  void Arm(std::uint32_t* word, cudaStream_t stream) {
    word_ = word;
    stream_ = stream;
    armed_.store(true, std::memory_order_release);
  }
  void Run() {
    if (!armed_.load(std::memory_order_acquire)) return;
    cudaError_t e = cudaMemsetAsync(word_, 0, sizeof(*word_), stream_);
    const char* call = "stall probe: cudaMemsetAsync";
    if (e == cudaSuccess) {
      e = cudaStreamSynchronize(stream_);
      call = "stall probe: cudaStreamSynchronize";
    }
    if (e == cudaSuccess) return;
    armed_.store(false, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = Describe(call, e);
  }
  std::string error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  std::atomic<bool> armed_{false};
  std::uint32_t* word_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::string error_;
};

constexpr std::uint64_t kHostSeed = 0x67707568656170ULL;  // "gpuheap"
constexpr int kChildReadyTimeoutS = 300;

// --children: forks them, before any CUDA call or thread. In a child,
// rewrites `args` to the child's and returns no pids; in the parent,
// returns the children's pids, in order.
std::vector<pid_t> ForkChildren(Args* args) {
  std::vector<pid_t> pids;
  const pid_t parent = getpid();
  for (long k = 1; k <= args->children; ++k) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("gpu_memory: fork");
      std::_Exit(2);
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) std::_Exit(2);  // the parent died before the prctl
      args->options.result_file += ".child" + std::to_string(k);
      args->options.stall = false;
      args->idle = k == args->children;
      args->busy_kernel_ms = 0;
      args->children = 0;
      return {};
    }
    pids.push_back(pid);
  }
  return pids;
}

// Before ready: waits until every child has announced ready; a child that
// ended first, or a timeout, is an error (exit 2).
void WaitForChildren(const std::vector<pid_t>& pids, const std::string& result_file) {
  for (std::size_t k = 0; k < pids.size(); ++k) {
    const std::string ready = result_file + ".child" + std::to_string(k + 1) + ".ready";
    for (int waited_ms = 0;; waited_ms += 50) {
      struct stat st {};
      if (stat(ready.c_str(), &st) == 0) break;
      int status = 0;
      if (waitpid(pids[k], &status, WNOHANG) == pids[k] || waited_ms > kChildReadyTimeoutS * 1000) {
        std::fprintf(stderr, "gpu_memory: child %zu (pid %d) did not get ready\n", k + 1,
                     static_cast<int>(pids[k]));
        std::_Exit(2);
      }
      usleep(50 * 1000);
    }
  }
}

// The children's verdicts, after this process's own: each gets SIGUSR1 and
// is waited for. "" when every one passed.
std::string ChildVerdicts(const std::vector<pid_t>& pids, const std::string& result_file) {
  std::string failures;
  for (std::size_t k = 0; k < pids.size(); ++k) {
    const std::string child = "child " + std::to_string(k + 1);
    if (kill(pids[k], SIGUSR1) != 0) {
      failures += (failures.empty() ? "" : "; ") + child + ": gone";
      continue;
    }
    int status = 0;
    if (waitpid(pids[k], &status, 0) != pids[k]) {
      failures += (failures.empty() ? "" : "; ") + child + ": cannot wait for it";
      continue;
    }
    std::string verdict;
    if (FILE* f = std::fopen((result_file + ".child" + std::to_string(k + 1)).c_str(), "r")) {
      char line[512] = {};
      if (std::fgets(line, sizeof(line), f) != nullptr) verdict = line;
      std::fclose(f);
    }
    while (!verdict.empty() && verdict.back() == '\n') verdict.pop_back();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && verdict == "PASS") continue;
    failures += (failures.empty() ? "" : "; ") + child + ": " +
                (verdict.empty() ? "no verdict, wait status " + std::to_string(status) : verdict);
  }
  return failures;
}

void SilenceOutput() {
  const int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null_fd < 0) return;
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(null_fd, STDOUT_FILENO);
  dup2(null_fd, STDERR_FILENO);
  close(null_fd);
}

}  // namespace

int main(int argc, char** argv) {
  Args args = Parse(argc, argv);
  // Before the first CUDA call: the driver's threads inherit the mask, so
  // SIGUSR1 is only ever taken by WaitForCheck().
  wl::BlockCheckSignal();
  // Before any CUDA call or thread: neither survives a fork.
  const std::vector<pid_t> children = ForkChildren(&args);
  // Also before the first CUDA call: it blocks SIGUSR2 for every later thread.
  static StallProbe probe;  // static: the meter thread outlives main's frame
  wl::StartStallMeter(args.options, [] { probe.Run(); });

  CheckOrDie(cudaSetDevice(0), "cudaSetDevice(0)");
  cudaDeviceProp prop{};
  CheckOrDie(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::size_t bytes = args.gib << 30;
  const std::size_t n = bytes / sizeof(std::uint32_t);
  std::size_t free_bytes = 0, total_bytes = 0;
  CheckOrDie(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (free_bytes < bytes) {
    std::fprintf(stderr, "gpu_memory: --gib %zu needs %zu bytes; %s has %zu free of %zu\n",
                 args.gib, bytes, prop.name, free_bytes, total_bytes);
    return 2;
  }
  std::uint32_t* words = nullptr;
  const int blocks = prop.multiProcessorCount * 8;
  if (args.managed) {
    CheckOrDie(cudaMallocManaged(&words, bytes), "cudaMallocManaged(words)");
    for (std::size_t i = 0; i < n; ++i) words[i] = WordHash(i);  // touched from the host
  } else {
    CheckOrDie(cudaMalloc(&words, bytes), "cudaMalloc(words)");
    FillKernel<<<blocks, kThreads>>>(words, n);
    CheckOrDie(cudaGetLastError(), "FillKernel launch");
  }
  CheckOrDie(cudaDeviceSynchronize(), "FillKernel");
  unsigned long long* counters = nullptr;  // [0] mismatches, [1] first, [2] spin sink
  CheckOrDie(cudaMalloc(&counters, 3 * sizeof(unsigned long long)), "cudaMalloc(counters)");
  const std::size_t host_bytes = args.host_mib << 20;
  void* heap = nullptr;
  if (host_bytes != 0) {
    heap = std::malloc(host_bytes);
    if (heap == nullptr) {
      std::fprintf(stderr, "gpu_memory: cannot allocate --host-mib %zu\n", args.host_mib);
      return 2;
    }
    wl::FillPattern(heap, host_bytes, kHostSeed);
  }
  std::printf(
      "gpu_memory: pid %d, %zu GiB%s on %s (%d SMs)%s%s\n", getpid(), args.gib,
      args.managed ? " managed" : "", prop.name, prop.multiProcessorCount,
      args.idle ? ", idle" : "",
      host_bytes != 0 ? (", " + std::to_string(args.host_mib) + " MiB host heap").c_str() : "");
  if (args.options.stall) {  // Before the spin kernel: cudaMemset would wait for it.
    std::uint32_t* probe_word = nullptr;
    CheckOrDie(cudaMalloc(&probe_word, sizeof(*probe_word)), "cudaMalloc(probe word)");
    CheckOrDie(cudaMemset(probe_word, 0, sizeof(*probe_word)), "cudaMemset(probe word)");
    cudaStream_t probe_stream = nullptr;
    CheckOrDie(cudaStreamCreateWithFlags(&probe_stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags(probe stream)");
    probe.Arm(probe_word, probe_stream);
  }
  if (args.busy_kernel_ms > 0) {
    // Asynchronous: it is still running when the driver is asked to lock.
    SpinKernel<<<1, 1>>>(static_cast<unsigned long long>(args.busy_kernel_ms) * 1000000ULL,
                         counters + 2);
    CheckOrDie(cudaGetLastError(), "SpinKernel launch");
    std::printf("gpu_memory: a kernel spins for %ld ms\n", args.busy_kernel_ms);
  }
  WaitForChildren(children, args.options.result_file);
  SilenceOutput();
  wl::AnnounceReady(args.options);

  ErrorLog errors;
  std::uint32_t kernels = 0;  // AddKernel launches that succeeded.
  wl::WaitForCheck(
      [&] {
        if (args.idle || !errors.ok()) return;
        AddKernel<<<blocks, kThreads>>>(words, n, kStep);
        if (!errors.Check(cudaGetLastError(), "AddKernel launch")) return;
        ++kernels;
        // One kernel in flight at most, and its errors are seen at once.
        errors.Check(cudaDeviceSynchronize(), "AddKernel");
      },
      kIntervalMs);

  // This process's own verdict: "" when everything checks out.
  auto own_verdict = [&]() -> std::string {
    if (!errors.ok()) return errors.text();
    if (const std::string e = probe.error(); !e.empty()) return e;
    if (heap != nullptr) {
      const std::size_t at = wl::FirstPatternMismatch(heap, host_bytes, kHostSeed);
      if (at != host_bytes) return "host heap differs at byte " + std::to_string(at);
    }
    if (!errors.Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before the check")) {
      return errors.text();
    }
    const unsigned long long init[2] = {0, ~0ULL};
    if (!errors.Check(cudaMemcpy(counters, init, sizeof(init), cudaMemcpyHostToDevice),
                      "cudaMemcpy(counters)")) {
      return errors.text();
    }
    const std::uint32_t add = kernels * kStep;
    CheckKernel<<<blocks, kThreads>>>(words, n, add, counters, counters + 1);
    unsigned long long result[2] = {0, 0};
    if (!errors.Check(cudaGetLastError(), "CheckKernel launch") ||
        !errors.Check(cudaMemcpy(result, counters, sizeof(result), cudaMemcpyDeviceToHost),
                      "CheckKernel")) {
      return errors.text();
    }
    if (result[0] == 0 && args.managed) {
      // Managed words are the host's to read too.
      for (std::size_t i = 0; i < n; ++i) {
        if (words[i] != WordHash(i) + add) {
          return "managed word " + std::to_string(i) + " differs on the host after " +
                 std::to_string(kernels) + " kernels (the device's check passed)";
        }
      }
    }
    if (result[0] == 0) return "";
    std::uint32_t got = 0;
    std::string what = std::to_string(result[0]) + " of " + std::to_string(n) +
                       " words differ after " + std::to_string(kernels) +
                       " kernels; first at word " + std::to_string(result[1]);
    if (result[1] < n &&
        errors.Check(cudaMemcpy(&got, words + result[1], sizeof(got), cudaMemcpyDeviceToHost),
                     "cudaMemcpy(first bad word)")) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), ": 0x%08x, expected 0x%08x", got, WordHash(result[1]) + add);
      what += buf;
    }
    return what;
  };
  std::string failure = own_verdict();
  const std::string of_children = ChildVerdicts(children, args.options.result_file);
  if (!of_children.empty()) failure += (failure.empty() ? "" : "; ") + of_children;
  wl::Finish(args.options, failure);
}
