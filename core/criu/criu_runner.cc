#include "core/criu/criu_runner.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <sstream>

#include "core/criu/breakpoint_probe.h"

namespace gpuckpt {
namespace {

constexpr const char* kDefaultCriu = "/usr/local/sbin/criu";
constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr size_t kChildStackSize = 256 * 1024;

// Everything the child needs, prepared by the parent before clone(): the
// child shares the parent's memory and must not allocate or take locks.
struct SpawnPlan {
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const char* work_dir = nullptr;
  int stdio[3] = {-1, -1, -1};
  const int* keep = nullptr;  // sorted, unique, all >= 3
  size_t keep_count = 0;
  bool drop = false;
  uint32_t uid = 0, gid = 0;
  const gid_t* groups = nullptr;
  size_t group_count = 0;
  uint64_t caps = 0;          // capability bits kept when dropping
  const int* join = nullptr;  // cgroup.procs descriptors to write "0" to
  size_t join_count = 0;
  int err = 0;               // out: errno of the step that failed
  bool join_failed = false;  // out: that step was joining a cgroup
};

// The kernel's struct sigaction (x86-64, arm64): no glibc wrapper, which
// would touch state shared with the parent.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  uint64_t mask;
};

#define CHILD_FN __attribute__((no_sanitize("address", "undefined")))

CHILD_FN bool ChildFail(SpawnPlan* plan) {
  plan->err = errno;
  return false;
}

// Moves the stdio sources out of 0..2 first, so that dup2 onto 0..2 cannot
// clobber a source that happens to sit there.
CHILD_FN bool ChildSetupFds(SpawnPlan* plan) {
  int high[3];
  for (int i = 0; i < 3; ++i) {
    high[i] = static_cast<int>(syscall(SYS_fcntl, plan->stdio[i], F_DUPFD, 3));
    if (high[i] < 0) return ChildFail(plan);
  }
  for (int i = 0; i < 3; ++i) {
    if (syscall(SYS_dup2, high[i], i) < 0) return ChildFail(plan);
  }
  for (size_t i = 0; i < plan->keep_count; ++i) {
    if (syscall(SYS_fcntl, plan->keep[i], F_SETFD, 0) < 0) return ChildFail(plan);
  }
  unsigned int from = 3;
  for (size_t i = 0; i < plan->keep_count; ++i) {
    const unsigned int fd = static_cast<unsigned int>(plan->keep[i]);
    if (fd > from) syscall(SYS_close_range, from, fd - 1, 0);
    from = fd + 1;
  }
  if (syscall(SYS_close_range, from, ~0U, 0) < 0) return ChildFail(plan);
  return true;
}

CHILD_FN bool ChildDropPrivileges(SpawnPlan* plan) {
  if (syscall(SYS_setgroups, plan->group_count, plan->groups) < 0 ||
      syscall(SYS_setresgid, plan->gid, plan->gid, plan->gid) < 0 ||
      syscall(SYS_prctl, PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0 ||
      syscall(SYS_setresuid, plan->uid, plan->uid, plan->uid) < 0) {
    return ChildFail(plan);
  }
  __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  for (int i = 0; i < 2; ++i) {
    const uint32_t bits = static_cast<uint32_t>(plan->caps >> (32 * i));
    data[i].effective = data[i].permitted = data[i].inheritable = bits;
  }
  if (syscall(SYS_capset, &header, data) < 0) return ChildFail(plan);
  // Ambient capabilities survive exec of a binary without file capabilities.
  for (int cap = 0; cap < 64; ++cap) {
    if ((plan->caps >> cap & 1) &&
        syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0) {
      return ChildFail(plan);
    }
  }
  return true;
}

CHILD_FN int ChildMain(void* arg) {
  SpawnPlan* plan = static_cast<SpawnPlan*>(arg);
  // Parent handlers must not run here (shared memory): default them all
  // before unblocking signals. Handlers would be reset by exec anyway.
  KernelSigaction dfl = {};
  for (int sig = 1; sig < 65; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) syscall(SYS_rt_sigaction, sig, &dfl, nullptr, 8);
  }
  for (size_t i = 0; i < plan->join_count; ++i) {
    if (syscall(SYS_write, plan->join[i], "0", 1) != 1) {
      plan->join_failed = true;
      ChildFail(plan);
      syscall(SYS_exit, 127);
      return 127;
    }
  }
  if (ChildSetupFds(plan) && (!plan->drop || ChildDropPrivileges(plan))) {
    if (syscall(SYS_chdir, plan->work_dir) < 0) {
      ChildFail(plan);
    } else {
      const uint64_t empty = 0;
      syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty, nullptr, 8);
      syscall(SYS_execve, plan->path, plan->argv, plan->envp);
      ChildFail(plan);
    }
  }
  syscall(SYS_exit, 127);
  return 127;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Variables that steer one operation of cuda-checkpoint: set per command,
// never leaked from the daemon's environment into every operation.
constexpr const char* kPerOperationVariables[] = {
    "GPUCKPT_LOCK_TIMEOUT_MS=", "GPUCKPT_DEVICE_RANGES_DIR=", "GPUCKPT_GPU_MAP="};

bool NameIn(const char* entry, const std::vector<std::string>& extra) {
  for (const char* prefix : kPerOperationVariables)
    if (strncmp(entry, prefix, strlen(prefix)) == 0) return true;
  for (const std::string& e : extra) {
    const size_t eq = e.find('=');
    if (eq != std::string::npos && strncmp(entry, e.c_str(), eq + 1) == 0) return true;
  }
  return false;
}

// CRIU's FI_NO_BREAKPOINTS: trace system calls to the sigreturn where
// hardware breakpoints never fire (see breakpoint_probe.h).
constexpr const char* kNoBreakpoints = "CRIU_FAULT=130";

// The caller's environment with PATH replaced by path_prepend + its PATH,
// and `extra` set (and, where they would hang CRIU, hardware breakpoints
// off, unless `extra` says otherwise).
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& path_prepend,
                                          std::vector<std::string> extra) {
  bool sets_fault = false;
  for (const std::string& e : extra) sets_fault |= e.rfind("CRIU_FAULT=", 0) == 0;
  if (!sets_fault && !HardwareBreakpointsFire()) extra.push_back(kNoBreakpoints);
  std::vector<std::string> env;
  const char* old_path = getenv("PATH");
  std::string path = "PATH=";
  for (const std::string& dir : path_prepend) path += dir + ":";
  path += old_path != nullptr && *old_path != '\0' ? old_path : kDefaultPath;
  env.push_back(path);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (strncmp(*e, "PATH=", 5) != 0 && !NameIn(*e, extra)) env.emplace_back(*e);
  }
  for (const std::string& e : extra) env.push_back(e);
  return env;
}

Result<pid_t> CloneChild(SpawnPlan* plan) {
  std::unique_ptr<char[]> stack(new char[kChildStackSize]);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid =
      clone(ChildMain, stack.get() + kChildStackSize, CLONE_VM | CLONE_VFORK | SIGCHLD, plan);
  const int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) return StatusFromErrno(clone_errno, "clone for criu");
  return pid;
}

int WaitExitCode(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

Result<std::string> FindExecutable(const std::string& path) {
  if (!path.empty()) {
    if (access(path.c_str(), X_OK) != 0) return StatusFromErrno(errno, "criu at " + path);
    return path;
  }
  if (access(kDefaultCriu, X_OK) == 0) return std::string(kDefaultCriu);
  const char* env_path = getenv("PATH");
  std::stringstream dirs(env_path != nullptr ? env_path : kDefaultPath);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/criu";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return Status::Unavailable("criu not found (looked at " + std::string(kDefaultCriu) +
                             " and on PATH); tools/setup installs CRIU 4.1");
}

// Whether "major.minor[.patch]" is at least 4.1.
bool AtLeast41(const std::string& version) {
  int major = 0, minor = 0;
  if (sscanf(version.c_str(), "%d.%d", &major, &minor) != 2) return false;
  return major > 4 || (major == 4 && minor >= 1);
}

}  // namespace

CriuProcess::CriuProcess(CriuProcess&& other) noexcept
    : pid_(other.pid_), pidfd_(other.pidfd_), exit_code_(other.exit_code_) {
  other.pid_ = -1;
  other.pidfd_ = -1;
}

CriuProcess& CriuProcess::operator=(CriuProcess&& other) noexcept {
  if (this != &other) {
    Release();
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::exchange(other.pidfd_, -1);
    exit_code_ = other.exit_code_;
  }
  return *this;
}

CriuProcess::~CriuProcess() { Release(); }

void CriuProcess::Release() {
  if (pid_ > 0 && !exit_code_) Wait().status().PermitUnchecked();
  if (pidfd_ >= 0) close(pidfd_);
  pid_ = -1;
  pidfd_ = -1;
}

Result<int> CriuProcess::Wait() {
  if (exit_code_) return *exit_code_;
  if (pid_ <= 0) return Status::Internal("Wait on an empty CriuProcess");
  const int code = WaitExitCode(pid_);
  if (code < 0) return StatusFromErrno(errno, "waitpid criu " + std::to_string(pid_));
  exit_code_ = code;
  return code;
}

std::string Criu::plugin_dir() const {
  char* real = realpath(path_.c_str(), nullptr);
  std::string binary = real != nullptr ? real : path_;
  free(real);
  // Two levels up: <prefix>/sbin/criu -> <prefix>.
  for (int level = 0; level < 2; ++level) {
    const size_t slash = binary.rfind('/');
    if (slash == std::string::npos) return "";
    binary.resize(slash);
  }
  const std::string dir = binary + "/lib/criu";
  return access(dir.c_str(), R_OK | X_OK) == 0 ? dir : "";
}

Result<CriuProcess> Criu::Start(const CriuCommand& command) const {
  std::vector<int> keep = command.keep_fds;
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  if (!keep.empty() && keep.front() < 3) {
    return Status::InvalidArgument("keep_fds must be >= 3 (stdio is set by stdout_fd/stderr_fd)");
  }
  std::vector<std::string> args = {path_};
  args.insert(args.end(), command.args.begin(), command.args.end());
  std::vector<std::string> env = ChildEnvironment(command.path_prepend, command.environment);
  std::vector<char*> argv = CStrings(args), envp = CStrings(env);
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) return StatusFromErrno(errno, "open /dev/null");
  std::vector<gid_t> groups;
  SpawnPlan plan;
  plan.path = path_.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.work_dir = command.work_dir.empty() ? "/" : command.work_dir.c_str();
  plan.stdio[0] = null_fd;
  plan.stdio[1] = command.stdout_fd >= 0 ? command.stdout_fd : null_fd;
  plan.stdio[2] = command.stderr_fd >= 0 ? command.stderr_fd : null_fd;
  plan.keep = keep.data();
  plan.keep_count = keep.size();
  plan.join = command.join_cgroup_fds.data();
  plan.join_count = command.join_cgroup_fds.size();
  if (command.run_as) {
    groups.assign(command.run_as->groups.begin(), command.run_as->groups.end());
    plan.drop = true;
    plan.uid = command.run_as->uid;
    plan.gid = command.run_as->gid;
    plan.groups = groups.data();
    plan.group_count = groups.size();
    plan.caps = uint64_t{1} << CAP_CHECKPOINT_RESTORE;
    if (command.run_as->keep_sys_ptrace) plan.caps |= uint64_t{1} << CAP_SYS_PTRACE;
    if (command.run_as->keep_setpcap) plan.caps |= uint64_t{1} << CAP_SETPCAP;
    if (command.run_as->keep_net_admin) plan.caps |= uint64_t{1} << CAP_NET_ADMIN;
  }
  Result<pid_t> pid = CloneChild(&plan);
  close(null_fd);
  if (!pid.ok()) return pid.status();
  if (plan.err != 0) {  // the child failed before exec and has exited
    WaitExitCode(*pid);
    if (plan.join_failed)
      return StatusFromErrno(plan.err, "starting " + path_ + ": joining its cgroup");
    return StatusFromErrno(plan.err, "starting " + path_ + " in " + plan.work_dir);
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, *pid, 0));
  CriuProcess process(*pid, pidfd);
  if (pidfd < 0) return StatusFromErrno(errno, "pidfd_open of criu");  // waits for it
  return process;
}

Result<Criu> Criu::Find(const std::string& path) {
  GPUCKPT_ASSIGN_OR_RETURN(std::string binary, FindExecutable(path));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return StatusFromErrno(errno, "pipe");
  CriuCommand command;
  command.args = {"--version"};
  command.stdout_fd = fds[1];
  Result<CriuProcess> process = Criu(binary, "").Start(command);
  close(fds[1]);
  std::string output;
  char buf[4096];
  while (output.size() < 65536) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (!process.ok()) return process.status();
  GPUCKPT_ASSIGN_OR_RETURN(int code, process->Wait());
  const std::string version = ParseCriuVersion(output);
  if (code != 0 || version.empty()) {
    return Status::Unavailable(binary + " --version failed (exit " + std::to_string(code) +
                               "): " + output.substr(0, 200));
  }
  if (!AtLeast41(version)) {
    return Status::Unavailable(binary + " is CRIU " + version +
                               "; gpuckpt needs CRIU 4.1 or newer (tools/setup builds it)");
  }
  return Criu(binary, version);
}

std::string ParseCriuVersion(const std::string& output) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("Version: ", 0) != 0) continue;
    std::string version = line.substr(9);
    while (!version.empty() && isspace(static_cast<unsigned char>(version.back()))) {
      version.pop_back();
    }
    return version;
  }
  return "";
}

std::string SummarizeCriuLog(int fd, size_t max_lines) {
  constexpr off_t kTail = 4 << 20;  // logs of big dumps are long
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return "";
  off_t offset = st.st_size > kTail ? st.st_size - kTail : 0;
  std::string text;
  char buf[64 << 10];
  while (text.size() < static_cast<size_t>(kTail)) {
    const ssize_t n = pread(fd, buf, sizeof(buf), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    offset += n;
  }
  std::deque<std::string> errors, last;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("Error (") != std::string::npos) errors.push_back(line);
    last.push_back(line);
    if (errors.size() > max_lines) errors.pop_front();
    if (last.size() > max_lines) last.pop_front();
  }
  const std::deque<std::string>& pick = errors.empty() ? last : errors;
  std::string out;
  for (const std::string& l : pick) out += (out.empty() ? "" : "\n") + l;
  return out;
}

namespace {

// "(00.607428) Error (criu/util.c:1533): rlimit: ..." -> "rlimit: ...".
std::string WithoutCriuPrefix(const std::string& line) {
  std::string rest = line;
  if (!rest.empty() && rest[0] == '(') {
    const size_t close = rest.find(") ");
    if (close != std::string::npos) rest = rest.substr(close + 2);
  }
  for (const char* level : {"Error (", "Warn  (", "Warn ("}) {
    if (rest.compare(0, std::strlen(level), level) != 0) continue;
    const size_t close = rest.find("): ");
    if (close != std::string::npos) rest = rest.substr(close + 3);
    break;
  }
  return rest;
}

bool IsHarmlessCriuError(const std::string& line) {
  return line.find("RLIMIT_NOFILE") != std::string::npos ||
         line.find("Dumping FAILED") != std::string::npos ||
         line.find("Restoring FAILED") != std::string::npos;
}

}  // namespace

std::string CriuFailureCause(const std::string& summary) {
  std::istringstream in(summary);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find("Error (") != std::string::npos && !IsHarmlessCriuError(line))
      return WithoutCriuPrefix(line);
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return WithoutCriuPrefix(last);
}

CriuFailureKind ClassifyCriuFailure(const std::string& summary) {
  // Neither CRIU nor gpuckpt calls setlocale(): both print the C locale's
  // strerror() texts, whatever the environment says.
  if (summary.find(std::strerror(ENOSPC)) != std::string::npos) return CriuFailureKind::kNoSpace;
  if (summary.find(std::strerror(EADDRINUSE)) != std::string::npos)
    return CriuFailureKind::kAddressInUse;
  return CriuFailureKind::kOther;
}

std::string SummarizeCriuLog(const std::string& log_path, size_t max_lines) {
  const int fd = open(log_path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return "";
  std::string summary = SummarizeCriuLog(fd, max_lines);
  close(fd);
  return summary;
}

}  // namespace gpuckpt
