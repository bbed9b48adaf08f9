// Reading one process out of /proc: identity, credentials, command, memory
// and the GPU device files it holds, for gpuckptfs to decide which processes
// to show and who may checkpoint them.
//
// Everything in /proc can change or vanish between two reads. A process is
// identified by (pid, start_time), since pids are reused; a process that is
// gone, or exits while it is being read, is a kNoSuchProcess Status, never a
// crash and never a mix of two processes: ProcessHandle opens /proc/PID once
// and reads every file relative to that directory, which procfs binds to the
// process and not to the number, so once the process is gone every later read
// through the handle fails even if its pid was reused. A /proc file that does
// not parse is a kIOError naming the file and the field.
//
// Thread-safety: the free functions are safe to call concurrently. A
// ProcessHandle is thread-compatible (one thread at a time); it owns its
// directory descriptor.
#ifndef GPUCKPT_CORE_PROC_PROCESS_INFO_H_
#define GPUCKPT_CORE_PROC_PROCESS_INFO_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

// From /proc/PID/status: the Uid:, Gid:, Groups:, CapPrm: and CapEff: lines.
struct ProcessCredentials {
  uint32_t ruid = 0, euid = 0, suid = 0, fsuid = 0;
  uint32_t rgid = 0, egid = 0, sgid = 0, fsgid = 0;
  std::vector<uint32_t> groups;  // supplementary groups
  // Capability sets; MayCheckpoint() refuses a process holding capabilities
  // to anyone but root, as ptrace does.
  uint64_t cap_permitted = 0, cap_effective = 0;
};

struct ProcessInfo {
  int pid = 0;
  uint64_t start_time = 0;  // clock ticks since boot (stat field 22)
  int ppid = 0, pgid = 0, sid = 0;
  char state = '?';  // stat field 3: R, S, D, T, t, Z, X, I, ...
  uint32_t threads = 0;
  ProcessCredentials creds;
  std::string comm;                  // stat field 2, without the parentheses
  std::vector<std::string> cmdline;  // argv as the process now shows it
  std::string exe;                   // readlink of /proc/PID/exe; "" if not allowed or none
  uint64_t rss_bytes = 0, vm_bytes = 0;
  bool kernel_thread = false;  // PF_KTHREAD: no mm, nothing to checkpoint (skip these)
  // False when the process changed credentials (a setuid program, setuid()
  // without exec) or asked not to be dumped: its /proc files are then owned
  // by root.
  // ptrace, and so MayCheckpoint(), refuses it to anyone but root.
  // (Read from the owner of /proc/PID/stat.)
  bool dumpable = true;
  bool cmdline_truncated = false;  // cmdline was longer than max_cmdline_bytes
  // Distinct device paths starting with one of the GPU prefixes, held open
  // (fd) or mapped (maps), sorted. Empty when not read or not readable.
  std::vector<std::string> gpu_devices;
  // For a job launcher: its direct children that hold GPU devices (sorted);
  // empty otherwise. Filled by ProcessTable, not by ReadProcess(): it needs
  // the children's devices too (see IsJobLauncher() in process_table.h).
  std::vector<int> gpu_children;

  bool zombie() const { return state == 'Z' || state == 'X'; }
};

struct ProcReadOptions {
  // Where procfs is mounted; tests point this at a fabricated tree.
  // Default: "/proc".
  std::string proc_root = "/proc";

  // A process holding open or mapping a file whose path starts with one of
  // these is a GPU process: the NVIDIA device nodes (/dev/nvidiactl,
  // /dev/nvidia0, /dev/nvidia-uvm, ...) and AMD's KFD.
  // Default: {"/dev/nvidia", "/dev/kfd"}.
  std::vector<std::string> gpu_device_prefixes = {"/dev/nvidia", "/dev/kfd"};

  // Whether ReadProcess() lists the GPU devices. That reads every fd link and
  // the whole maps file, the costly part of reading a process (a CUDA
  // process has thousands of mappings).
  // Default: true.
  bool read_gpu_devices = true;

  // The command line is read up to this many bytes (ARG_MAX allows
  // megabytes, and a listing reads thousands of processes); beyond it,
  // cmdline_truncated is set.
  // Default: 128 KiB.
  size_t max_cmdline_bytes = 128 * 1024;
};

// Reads one process. kNoSuchProcess if it does not exist or exits meanwhile
// (also when `pid` names a thread that is not a thread group leader: /proc
// answers for thread ids too, but they are not processes).
Result<ProcessInfo> ReadProcess(int pid, const ProcReadOptions& options = {});

// The process and all its descendants (via /proc/PID/task/*/children, or
// every process's parent where the kernel has no children files), parent
// first (breadth first). Descendants that exit during the walk are left out.
Result<std::vector<int>> ProcessTree(int pid, const std::string& proc_root = "/proc");

// "python3 train.py --x" for display: cmdline joined with spaces, "[comm]"
// when the command line is empty (kernel threads, zombies), bounded to
// kMaxDisplayCommand bytes (cut on a UTF-8 character boundary, ending in
// "..."), control characters replaced by '?'.
inline constexpr size_t kMaxDisplayCommand = 200;
std::string DisplayCommand(const ProcessInfo& info);

// The numeric entries of proc_root: every process (thread group leader)
// visible there, unsorted. Processes come and go while this runs.
Result<std::vector<int>> ListPids(const std::string& proc_root = "/proc");

// Parsers of the /proc text formats; `what` names the file in errors. Exposed
// for tests and for callers that read the files themselves.
//
// Fills pid, comm, state, ppid, pgid, sid, threads, start_time, vm_bytes,
// rss_bytes and kernel_thread from /proc/PID/stat. The comm may hold any
// bytes, spaces and parentheses included; it ends at the last ')'.
Status ParseStat(std::string_view text, std::string_view what, ProcessInfo* info);
// The inodes of the sockets /proc/PID/net/tcp (or tcp6) text lists in a
// state other than LISTEN or CLOSE; lines that do not parse are skipped.
std::set<uint64_t> ParseConnectedTcpInodes(std::string_view table);
// The sizes in bytes of the mappings of the file `path` that /proc/PID/maps
// `text` lists, in its order; lines that do not parse are skipped.
std::vector<uint64_t> ParseMappingSizes(std::string_view text, std::string_view path);
// Credentials from /proc/PID/status; Uid: and Gid: are required. *tgid is
// set from Tgid: (-1 when the line is missing).
Status ParseStatus(std::string_view text, std::string_view what, ProcessCredentials* creds,
                   int* tgid);

// An open /proc/PID directory: every read through it sees the same process,
// or fails with kNoSuchProcess once that process is gone (see the top of
// this file). Thread-compatible; owns the descriptor; movable, not copyable.
class ProcessHandle {
 public:
  // kNoSuchProcess if there is no such pid now.
  static Result<ProcessHandle> Open(int pid, const std::string& proc_root = "/proc");

  ProcessHandle(ProcessHandle&& other) noexcept;
  ProcessHandle& operator=(ProcessHandle&& other) noexcept;
  ProcessHandle(const ProcessHandle&) = delete;
  ProcessHandle& operator=(const ProcessHandle&) = delete;
  ~ProcessHandle();

  int pid() const { return pid_; }

  // The stat fields (see ParseStat); cheap: one small read.
  Status ReadStat(ProcessInfo* info) const;
  // creds and dumpable; kNoSuchProcess for a thread id.
  Status ReadStatus(ProcessInfo* info) const;
  // Credentials and Tgid: from status, for a thread id too (a FUSE request
  // names the calling thread).
  Status ReadCredentials(ProcessCredentials* creds, int* tgid) const;
  // cmdline (and cmdline_truncated); empty for kernel threads and zombies.
  Status ReadCmdline(size_t max_bytes, ProcessInfo* info) const;
  // exe; "" where the link cannot be read.
  Status ReadExe(ProcessInfo* info) const;
  // Distinct paths with one of `prefixes` among the fd links and mapped
  // files, sorted. kPermissionDenied where fd/ or maps may not be read.
  Result<std::vector<std::string>> ReadGpuDevices(const std::vector<std::string>& prefixes) const;
  // The sizes of the process's mappings of the file `path` (as the process
  // names it), from maps. kPermissionDenied where maps may not be read.
  Result<std::vector<uint64_t>> ReadMappingSizes(std::string_view path) const;
  // Whether the process holds an established (or closing) TCP connection,
  // which CRIU dumps and restores in TCP repair mode: a socket among its fd
  // links that its network namespace's net/tcp or net/tcp6 lists in a
  // state other than LISTEN or CLOSE.
  Result<bool> HoldsTcpConnection() const;
  // The process's pid in each pid namespace it is in, outermost first
  // (status's NSpid: line): {1234, 1} for the init of a namespace made
  // below ours. kIOError where the line is missing.
  Result<std::vector<int>> ReadNamespacePids() const;
  // Direct children, from task/*/children. kUnavailable where the kernel
  // has no children files (CONFIG_PROC_CHILDREN off).
  Result<std::vector<int>> ReadChildren() const;

 private:
  ProcessHandle(int pid, int dir_fd, std::string path)
      : pid_(pid), dir_fd_(dir_fd), path_(std::move(path)) {}
  // Reads `name` under the directory, at most max_bytes; *truncated (if not
  // null) tells whether there was more.
  Status ReadFile(const char* name, size_t max_bytes, std::string* out,
                  bool* truncated = nullptr) const;
  // The targets of the fd/ links ("/dev/nvidia0", "socket:[1234]", ...).
  Result<std::vector<std::string>> ReadFdTargets() const;
  std::string What(const char* name) const { return path_ + "/" + name; }

  int pid_ = 0;
  int dir_fd_ = -1;
  std::string path_;  // proc_root/pid, for messages
};

// The direct children of the process behind `handle` (children whose ppid
// it is), sorted: from its task/*/children files, or, where the kernel has
// none, from every process's parent (a read of every stat under proc_root).
// Children that start or exit meanwhile may be missed or included.
Result<std::vector<int>> DirectChildren(const ProcessHandle& handle,
                                        const std::string& proc_root = "/proc");

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_PROCESS_INFO_H_
