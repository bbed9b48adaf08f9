// Criu: finding the CRIU binary and starting it; CriuProcess: one running
// CRIU, owned until it has been waited for.
//
// Start() is safe in the multi-threaded daemon: argv, envp and every other
// buffer are prepared before the child is created (clone with CLONE_VM |
// CLONE_VFORK, as posix_spawn does, so that a large daemon's page tables are
// not copied), and the child makes only raw system calls until exec. Every
// descriptor except stdio and CriuCommand::keep_fds is closed in the child,
// so the FUSE descriptor and store files never leak into CRIU or into the
// processes it restores.
//
// Thread-safety: Criu is an immutable value, safe to share and copy.
// CriuProcess is move-only and not thread-safe; it owns the child and its
// pidfd.
#ifndef GPUCKPT_CORE_CRIU_CRIU_RUNNER_H_
#define GPUCKPT_CORE_CRIU_CRIU_RUNNER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// Who CRIU runs as when it acts for a non-root user.
struct CriuCredentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;  // supplementary groups; empty: none
  // Also keep CAP_SYS_PTRACE (an unprivileged dump needs it; a restore
  // does not). Default: false.
  bool keep_sys_ptrace = false;
  // Also keep CAP_SETPCAP. A restore needs it when the process's capability
  // bounding set in the images is not full (e.g. a process in a container
  // that dropped some): CRIU's restorer calls PR_CAPBSET_DROP for every
  // capability missing there, even one the current set lacks already, and
  // that needs CAP_SETPCAP (criu/pie/restorer.c, restore_creds). With it, a
  // forged image could leave CAP_SETPCAP to the restored process: check the
  // image's creds first (ParseCoreCreds). Default: false.
  bool keep_setpcap = false;
  // Also keep CAP_NET_ADMIN: TCP repair mode (TCP_REPAIR), which CRIU needs
  // to dump and restore established TCP connections. In repair mode a
  // socket may bind a port others use and take any sequence numbers, so a
  // restore gets it only for images whose connections are what gpuckpt's
  // own dump recorded. Default: false.
  bool keep_net_admin = false;
};

struct CriuCommand {
  // After the binary: {"dump", "-t", "42", "-D", dir, ...}.
  std::vector<std::string> args;
  // CRIU's working directory (must exist; entered after dropping to run_as).
  std::string work_dir;
  // When set, CRIU runs as this user with only CAP_CHECKPOINT_RESTORE (and
  // CAP_SYS_PTRACE if asked) kept, as ambient capabilities: for
  // `criu restore --unprivileged` on behalf of a non-root user (the caller
  // adds --unprivileged). Default: run as the caller.
  std::optional<CriuCredentials> run_as;
  // Directories put first on CRIU's PATH (where our cuda-checkpoint lives).
  std::vector<std::string> path_prepend;
  // Extra environment, "NAME=value"; replaces an inherited variable of the
  // same name. The per-operation settings of gpuckpt's cuda-checkpoint
  // (GPUCKPT_LOCK_TIMEOUT_MS, GPUCKPT_DEVICE_RANGES_DIR, GPUCKPT_GPU_MAP)
  // are never inherited from the daemon's own environment, only set here.
  std::vector<std::string> environment;
  // Descriptors (>= 3) inherited as they are, close-on-exec cleared. Every
  // other descriptor is closed in the child.
  std::vector<int> keep_fds;
  // cgroup.procs files, open for writing, that CRIU's child joins first
  // (it writes "0" to each, before it drops any privilege), so that CRIU and
  // every process it starts or restores begin in those cgroups (see
  // core/proc/cgroup_placement.h). Default: none (the caller's cgroups).
  std::vector<int> join_cgroup_fds;
  // Where CRIU's stdout / stderr go; -1: /dev/null. stdin is /dev/null.
  // CRIU logs to its -o file; its stdout matters only for `--version`.
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// A started CRIU. The destructor waits for it if nobody did (it never kills:
// killing CRIU mid-dump would leave its parasite code in the target).
class CriuProcess {
 public:
  CriuProcess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  CriuProcess(CriuProcess&& other) noexcept;
  CriuProcess& operator=(CriuProcess&& other) noexcept;
  CriuProcess(const CriuProcess&) = delete;
  CriuProcess& operator=(const CriuProcess&) = delete;
  ~CriuProcess();

  pid_t pid() const { return pid_; }
  // pidfd_open() of the child: readable once it has exited (a stop_fd for
  // the image streamers). Valid until this object goes.
  int pidfd() const { return pidfd_; }
  // Waits for the exit; its code, or 128+N when killed by signal N. Once
  // waited, later calls return the same code.
  Result<int> Wait();

 private:
  void Release();

  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::optional<int> exit_code_;
};

class Criu {
 public:
  // `path` if given, else /usr/local/sbin/criu, else `criu` on PATH. Runs
  // `criu --version` and requires 4.1 or newer (older CRIU fails on current
  // kernels); kUnavailable saying what was found otherwise.
  static Result<Criu> Find(const std::string& path = "");

  const std::string& path() const { return path_; }
  const std::string& version() const { return version_; }  // e.g. "4.1.1"
  // <prefix>/lib/criu beside <prefix>/sbin/criu (after symlinks), when it
  // exists, else "": where CRIU's own install puts the cuda and amdgpu
  // plugins, under /usr/local (tools/setup) as under /usr (the package).
  std::string plugin_dir() const;

  Result<CriuProcess> Start(const CriuCommand& command) const;

 private:
  Criu(std::string path, std::string version)
      : path_(std::move(path)), version_(std::move(version)) {}

  std::string path_;
  std::string version_;
};

// The lines worth showing a user from a CRIU log: its "Error (" lines (the
// last `max_lines` of them), or its last `max_lines` lines when there is
// none, joined by '\n'; only the last 4 MiB are read. "" when the log
// cannot be read. The descriptor version reads through `fd` (from offset
// 0, not moving its offset), which must be a regular file; the path
// version opens `log_path` without following a symlink or blocking on a
// FIFO, and reads nothing but a regular file.
std::string SummarizeCriuLog(int fd, size_t max_lines = 4);
std::string SummarizeCriuLog(const std::string& log_path, size_t max_lines = 4);

// The one line that says why CRIU failed, from the lines SummarizeCriuLog
// picked: the first "Error (" line that is not one of CRIU's harmless ones
// (a failed raise of its own RLIMIT_NOFILE, which it survives) nor its
// closing "Dumping FAILED." / "Restoring FAILED.", without CRIU's time
// stamp and source position; else the last line that is not empty. ""
// when there is none.
std::string CriuFailureCause(const std::string& summary);

// What went wrong in a failed CRIU run, as far as gpuckpt answers it with an
// errno of its own. CRIU exits 1 whatever happened and says why only in its
// log, as the strerror() text of the failing call's errno: this is the one
// place that reads it, from the lines SummarizeCriuLog picked.
enum class CriuFailureKind {
  kOther,
  kNoSpace,       // ENOSPC: a disk CRIU wrote to is full
  kAddressInUse,  // EADDRINUSE: a port a restored socket binds is taken
};
CriuFailureKind ClassifyCriuFailure(const std::string& summary);

// "4.1.1" from `criu --version` output ("Version: 4.1.1\nGitID: ..."), or
// "" when there is no version line. Exposed for tests.
std::string ParseCriuVersion(const std::string& output);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_CRIU_CRIU_RUNNER_H_
