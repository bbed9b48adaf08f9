#include "core/proc/process_info.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/base/display_text.h"

namespace gpuckpt {
namespace {

// PF_KTHREAD in the stat flags (include/linux/sched.h): the kernel's own
// threads, which have no user memory. More exact than "cmdline is empty",
// which a zombie or a process that cleared its argv also shows.
constexpr uint64_t kPfKthread = 0x00200000;

// Error for an open or read that failed under /proc/PID: ENOENT and ESRCH
// mean the process is gone (procfs answers ENOENT for lookups in the
// directory of a dead process, ESRCH for reads of its open files).
Status ProcError(int err, int pid, const std::string& what) {
  if (err == ENOENT || err == ESRCH) {
    return Status::NoSuchProcess("process " + std::to_string(pid) + " is gone (" + what + ": " +
                                 std::strerror(err) + ")");
  }
  return StatusFromErrno(err, what);
}

Status Malformed(std::string_view what, std::string_view detail) {
  std::string m = "malformed ";
  m += what;
  m += ": ";
  m += detail;
  return Status::IOError(std::move(m));
}

template <typename T>
bool ParseNumber(std::string_view s, T* out, int base = 10) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, base);
  return ec == std::errc() && end == s.data() + s.size();
}

std::vector<std::string_view> SplitWhitespace(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
    size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t' && s[i] != '\n') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

bool HasPrefix(std::string_view s, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) {
    if (!p.empty() && s.substr(0, p.size()) == p) return true;
  }
  return false;
}

// The pathname column of a /proc/PID/maps line
// ("start-end perms offset dev inode   pathname"), "" if none. A pathname
// may contain spaces, so it is everything after the fifth field.
std::string_view MapsPath(std::string_view line) {
  size_t i = 0;
  for (int field = 0; field < 5; ++field) {
    while (i < line.size() && line[i] == ' ') ++i;
    while (i < line.size() && line[i] != ' ') ++i;
  }
  while (i < line.size() && line[i] == ' ') ++i;
  return line.substr(i);
}

}  // namespace

std::vector<uint64_t> ParseMappingSizes(std::string_view text, std::string_view path) {
  std::vector<uint64_t> sizes;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (MapsPath(line) != path) continue;
    // "start-end perms offset dev inode path", addresses in hex.
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash == std::string_view::npos || space == std::string_view::npos || dash > space) continue;
    uint64_t start = 0, end = 0;
    const std::string_view from = line.substr(0, dash);
    const std::string_view to = line.substr(dash + 1, space - dash - 1);
    if (std::from_chars(from.data(), from.data() + from.size(), start, 16).ec != std::errc() ||
        std::from_chars(to.data(), to.data() + to.size(), end, 16).ec != std::errc() || end < start)
      continue;
    sizes.push_back(end - start);
  }
  return sizes;
}

Status ParseStat(std::string_view text, std::string_view what, ProcessInfo* info) {
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold
  // anything, ") (" and newlines included, so it ends at the last ')'.
  size_t open = text.find('(');
  size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return Malformed(what, "no '(comm)' in " + QuotedExcerpt(text));
  }
  int pid = 0;
  std::string_view pid_text = text.substr(0, open);
  while (!pid_text.empty() && pid_text.back() == ' ') pid_text.remove_suffix(1);
  if (!ParseNumber(pid_text, &pid) || pid <= 0) {
    return Malformed(what, "field 1 (pid) is " + QuotedExcerpt(pid_text));
  }
  std::vector<std::string_view> f = SplitWhitespace(text.substr(close + 1));
  // f[0] is field 3 (state); field N is f[N - 3]. We need up to field 24.
  constexpr size_t kNeeded = 24 - 3 + 1;
  if (f.size() < kNeeded) {
    return Malformed(what, "only " + std::to_string(f.size() + 2) + " fields, need 24");
  }
  auto field = [&](int n, const char* name, auto* out) -> Status {
    if (!ParseNumber(f[n - 3], out)) {
      return Malformed(
          what, "field " + std::to_string(n) + " (" + name + ") is " + QuotedExcerpt(f[n - 3]));
    }
    return Status::Ok();
  };
  if (f[0].size() != 1) return Malformed(what, "field 3 (state) is " + QuotedExcerpt(f[0]));
  uint64_t flags = 0, vsize = 0, rss_pages = 0;
  int ppid = 0, pgid = 0, sid = 0;
  uint32_t threads = 0;
  uint64_t start_time = 0;
  GPUCKPT_RETURN_IF_ERROR(field(4, "ppid", &ppid));
  GPUCKPT_RETURN_IF_ERROR(field(5, "pgrp", &pgid));
  GPUCKPT_RETURN_IF_ERROR(field(6, "session", &sid));
  GPUCKPT_RETURN_IF_ERROR(field(9, "flags", &flags));
  GPUCKPT_RETURN_IF_ERROR(field(20, "num_threads", &threads));
  GPUCKPT_RETURN_IF_ERROR(field(22, "starttime", &start_time));
  GPUCKPT_RETURN_IF_ERROR(field(23, "vsize", &vsize));
  GPUCKPT_RETURN_IF_ERROR(field(24, "rss", &rss_pages));
  static const uint64_t page_size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  info->pid = pid;
  info->comm.assign(text.substr(open + 1, close - open - 1));
  info->state = f[0][0];
  info->ppid = ppid;
  info->pgid = pgid;
  info->sid = sid;
  info->threads = threads;
  info->start_time = start_time;
  info->vm_bytes = vsize;
  info->rss_bytes = rss_pages * page_size;
  info->kernel_thread = (flags & kPfKthread) != 0;
  return Status::Ok();
}

Status ParseStatus(std::string_view text, std::string_view what, ProcessCredentials* creds,
                   int* tgid) {
  bool have_uid = false, have_gid = false;
  *tgid = -1;
  ProcessCredentials c;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = line.substr(0, colon);
    std::vector<std::string_view> v = SplitWhitespace(line.substr(colon + 1));
    auto ids = [&](uint32_t* a, uint32_t* b, uint32_t* c3, uint32_t* d) -> Status {
      uint32_t* outs[] = {a, b, c3, d};
      if (v.size() != 4)
        return Malformed(what, std::string(key) + ": needs 4 ids: " + QuotedExcerpt(line));
      for (int i = 0; i < 4; ++i) {
        if (!ParseNumber(v[i], outs[i])) {
          return Malformed(what, std::string(key) + ": bad id " + QuotedExcerpt(v[i]));
        }
      }
      return Status::Ok();
    };
    if (key == "Uid") {
      GPUCKPT_RETURN_IF_ERROR(ids(&c.ruid, &c.euid, &c.suid, &c.fsuid));
      have_uid = true;
    } else if (key == "Gid") {
      GPUCKPT_RETURN_IF_ERROR(ids(&c.rgid, &c.egid, &c.sgid, &c.fsgid));
      have_gid = true;
    } else if (key == "Groups") {
      c.groups.clear();
      for (auto g : v) {
        uint32_t gid = 0;
        if (!ParseNumber(g, &gid)) return Malformed(what, "Groups: bad gid " + QuotedExcerpt(g));
        c.groups.push_back(gid);
      }
    } else if (key == "CapPrm" || key == "CapEff") {
      uint64_t caps = 0;
      if (v.size() != 1 || !ParseNumber(v[0], &caps, 16)) {
        return Malformed(what, std::string(key) + ": " + QuotedExcerpt(line));
      }
      (key == "CapPrm" ? c.cap_permitted : c.cap_effective) = caps;
    } else if (key == "Tgid") {
      if (v.size() != 1 || !ParseNumber(v[0], tgid))
        return Malformed(what, "Tgid: " + QuotedExcerpt(line));
    }
  }
  if (!have_uid || !have_gid) return Malformed(what, have_uid ? "no Gid: line" : "no Uid: line");
  *creds = std::move(c);
  return Status::Ok();
}

std::set<uint64_t> ParseConnectedTcpInodes(std::string_view table) {
  // "sl local_address rem_address st tx_queue:rx_queue tr:tm->when
  // retrnsmt uid timeout inode ...": st is the TCP state in hex, 0A
  // LISTEN and 07 CLOSE (a socket bound or never connected).
  std::set<uint64_t> inodes;
  size_t pos = table.find('\n');  // the heading
  while (pos != std::string_view::npos && pos + 1 < table.size()) {
    const size_t start = pos + 1;
    pos = table.find('\n', start);
    const auto fields = SplitWhitespace(
        table.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (fields.size() < 10) continue;
    unsigned state = 0;
    uint64_t inode = 0;
    if (!ParseNumber(fields[3], &state, 16) || !ParseNumber(fields[9], &inode) || inode == 0)
      continue;
    if (state != 0x0A && state != 0x07) inodes.insert(inode);
  }
  return inodes;
}

// --- ProcessHandle ------------------------------------------------------------

Result<ProcessHandle> ProcessHandle::Open(int pid, const std::string& proc_root) {
  std::string path = proc_root + "/" + std::to_string(pid);
  if (pid <= 0) return Status::NoSuchProcess("no process " + std::to_string(pid));
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ProcError(errno, pid, path);
  return ProcessHandle(pid, fd, std::move(path));
}

ProcessHandle::ProcessHandle(ProcessHandle&& other) noexcept
    : pid_(other.pid_), dir_fd_(other.dir_fd_), path_(std::move(other.path_)) {
  other.dir_fd_ = -1;
}

ProcessHandle& ProcessHandle::operator=(ProcessHandle&& other) noexcept {
  if (this != &other) {
    if (dir_fd_ >= 0) close(dir_fd_);
    pid_ = other.pid_;
    dir_fd_ = other.dir_fd_;
    path_ = std::move(other.path_);
    other.dir_fd_ = -1;
  }
  return *this;
}

ProcessHandle::~ProcessHandle() {
  if (dir_fd_ >= 0) close(dir_fd_);
}

Status ProcessHandle::ReadFile(const char* name, size_t max_bytes, std::string* out,
                               bool* truncated) const {
  out->clear();
  if (truncated != nullptr) *truncated = false;
  int fd = openat(dir_fd_, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ProcError(errno, pid_, What(name));
  // procfs files have st_size 0: read until EOF.
  char buf[16384];
  Status status;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      status = ProcError(errno, pid_, What(name));
      break;
    }
    if (n == 0) break;
    size_t room = max_bytes - out->size();
    if (static_cast<size_t>(n) > room) {
      out->append(buf, room);
      if (truncated != nullptr) *truncated = true;
      break;
    }
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return status;
}

Status ProcessHandle::ReadStat(ProcessInfo* info) const {
  std::string text;
  // stat is a few hundred bytes; 4 KiB leaves room for any comm.
  GPUCKPT_RETURN_IF_ERROR(ReadFile("stat", 4096, &text));
  GPUCKPT_RETURN_IF_ERROR(ParseStat(text, What("stat"), info));
  if (info->pid != pid_) {
    return Malformed(What("stat"), "it names pid " + std::to_string(info->pid));
  }
  return Status::Ok();
}

Status ProcessHandle::ReadCredentials(ProcessCredentials* creds, int* tgid) const {
  std::string text;
  GPUCKPT_RETURN_IF_ERROR(ReadFile("status", 1 << 20, &text));
  return ParseStatus(text, What("status"), creds, tgid);
}

Status ProcessHandle::ReadStatus(ProcessInfo* info) const {
  int tgid = -1;
  GPUCKPT_RETURN_IF_ERROR(ReadCredentials(&info->creds, &tgid));
  // /proc/TID works for any thread id, though readdir lists only leaders: a
  // thread is not a process to show or checkpoint.
  if (tgid > 0 && tgid != pid_) {
    return Status::NoSuchProcess("no process " + std::to_string(pid_) + ": it is a thread of " +
                                 std::to_string(tgid));
  }
  // The files of a process that is not dumpable are owned by root instead of
  // its effective uid (task_dump_owner() in fs/proc/base.c; the directory
  // itself keeps the euid, so ask a file).
  struct stat st;
  if (fstatat(dir_fd_, "stat", &st, 0) != 0) return ProcError(errno, pid_, What("stat"));
  info->dumpable = st.st_uid == info->creds.euid;
  return Status::Ok();
}

Status ProcessHandle::ReadCmdline(size_t max_bytes, ProcessInfo* info) const {
  std::string text;
  GPUCKPT_RETURN_IF_ERROR(ReadFile("cmdline", max_bytes, &text, &info->cmdline_truncated));
  info->cmdline.clear();
  // NUL-separated with a final NUL; a process that rewrote its argv
  // (setproctitle) may leave one string with spaces and no final NUL.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\0', pos);
    if (end == std::string::npos) end = text.size();
    info->cmdline.emplace_back(text, pos, end - pos);
    pos = end + 1;
  }
  return Status::Ok();
}

Status ProcessHandle::ReadExe(ProcessInfo* info) const {
  char buf[4096];
  ssize_t n = readlinkat(dir_fd_, "exe", buf, sizeof(buf));
  // ENOENT: a kernel thread or zombie has none; EACCES: not ours to see.
  info->exe = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  return Status::Ok();
}

Result<std::vector<std::string>> ProcessHandle::ReadGpuDevices(
    const std::vector<std::string>& prefixes) const {
  std::set<std::string> found;
  if (prefixes.empty()) return std::vector<std::string>();
  GPUCKPT_ASSIGN_OR_RETURN(auto targets, ReadFdTargets());
  for (auto& target : targets) {
    if (HasPrefix(target, prefixes)) found.insert(std::move(target));
  }

  std::string maps;
  GPUCKPT_RETURN_IF_ERROR(ReadFile("maps", std::numeric_limits<size_t>::max(), &maps));
  size_t pos = 0;
  while (pos < maps.size()) {
    size_t eol = maps.find('\n', pos);
    if (eol == std::string::npos) eol = maps.size();
    std::string_view path = MapsPath(std::string_view(maps).substr(pos, eol - pos));
    pos = eol + 1;
    if (!path.empty() && path[0] == '/' && HasPrefix(path, prefixes)) found.emplace(path);
  }
  return std::vector<std::string>(found.begin(), found.end());
}

Result<std::vector<uint64_t>> ProcessHandle::ReadMappingSizes(std::string_view path) const {
  std::string maps;
  GPUCKPT_RETURN_IF_ERROR(ReadFile("maps", std::numeric_limits<size_t>::max(), &maps));
  return ParseMappingSizes(maps, path);
}

Result<bool> ProcessHandle::HoldsTcpConnection() const {
  std::set<uint64_t> connected;
  for (const char* table : {"net/tcp", "net/tcp6"}) {
    std::string text;
    // A kernel without IPv6 has no tcp6; the table of a busy host can be
    // long, but a line is 150 bytes: 256 MiB is over a million sockets.
    if (!ReadFile(table, 256u << 20, &text).ok()) continue;
    connected.merge(ParseConnectedTcpInodes(text));
  }
  if (connected.empty()) return false;
  GPUCKPT_ASSIGN_OR_RETURN(auto targets, ReadFdTargets());
  for (const auto& target : targets) {
    uint64_t inode = 0;
    if (target.size() > 9 && target.starts_with("socket:[") && target.back() == ']' &&
        ParseNumber(std::string_view(target).substr(8, target.size() - 9), &inode) &&
        connected.count(inode) != 0)
      return true;
  }
  return false;
}

Result<std::vector<std::string>> ProcessHandle::ReadFdTargets() const {
  std::vector<std::string> found;
  int fd_dir = openat(dir_fd_, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_dir < 0) return ProcError(errno, pid_, What("fd"));
  DIR* dir = fdopendir(fd_dir);
  if (dir == nullptr) {
    int err = errno;
    close(fd_dir);
    return ProcError(err, pid_, What("fd"));
  }
  int readdir_err = 0;
  for (;;) {
    // readdir() tells its errors only through errno, which readlinkat() below
    // also sets: reset it before each call.
    errno = 0;
    struct dirent* e = readdir(dir);
    if (e == nullptr) {
      readdir_err = errno;
      break;
    }
    if (e->d_name[0] == '.') continue;
    char buf[4096];
    // An fd closed since readdir (ENOENT; exec closes many) is simply not
    // held any more.
    ssize_t n = readlinkat(dirfd(dir), e->d_name, buf, sizeof(buf));
    if (n <= 0) continue;
    found.emplace_back(buf, static_cast<size_t>(n));
  }
  closedir(dir);
  if (readdir_err != 0) return ProcError(readdir_err, pid_, What("fd"));
  return found;
}

Result<std::vector<int>> ProcessHandle::ReadNamespacePids() const {
  std::string text;
  GPUCKPT_RETURN_IF_ERROR(ReadFile("status", 1 << 20, &text));
  for (std::string_view rest = text; !rest.empty();) {
    const size_t eol = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(std::min(eol + 1, rest.size()));
    if (line.substr(0, 6) != "NSpid:") continue;
    std::vector<int> pids;
    for (std::string_view field : SplitWhitespace(line.substr(6))) {
      int pid = 0;
      if (!ParseNumber(field, &pid) || pid <= 0)
        return Malformed(What("status"), QuotedExcerpt(line));
      pids.push_back(pid);
    }
    if (pids.empty()) return Malformed(What("status"), "empty NSpid: line");
    return pids;
  }
  return Malformed(What("status"), "no NSpid: line");
}

Result<std::vector<int>> ProcessHandle::ReadChildren() const {
  int task_fd = openat(dir_fd_, "task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (task_fd < 0) {
    int err = errno;
    // A live process always has task/; where stat is there and task/ is not,
    // this is a tree without it (a fabricated one).
    if (err == ENOENT && faccessat(dir_fd_, "stat", F_OK, 0) == 0) {
      return Status::Unavailable(What("task") + " does not exist");
    }
    return ProcError(err, pid_, What("task"));
  }
  DIR* dir = fdopendir(task_fd);
  if (dir == nullptr) {
    int err = errno;
    close(task_fd);
    return ProcError(err, pid_, What("task"));
  }
  std::vector<int> children;
  Status status;
  bool any_task = false;
  while (struct dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    any_task = true;
    std::string name = std::string(e->d_name) + "/children";
    int fd = openat(dirfd(dir), name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == ENOENT && faccessat(dirfd(dir), e->d_name, F_OK, 0) == 0) {
        status = Status::Unavailable(What("task/") + name + " does not exist");
        break;
      }
      continue;  // the thread exited since readdir
    }
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
    close(fd);
    for (auto word : SplitWhitespace(text)) {
      int child = 0;
      if (ParseNumber(word, &child) && child > 0) children.push_back(child);
    }
  }
  closedir(dir);
  if (!status.ok()) return status;
  if (!any_task) return Status::NoSuchProcess("process " + std::to_string(pid_) + " is gone");
  std::sort(children.begin(), children.end());
  children.erase(std::unique(children.begin(), children.end()), children.end());
  return children;
}

// --- Free functions -------------------------------------------------------------

Result<ProcessInfo> ReadProcess(int pid, const ProcReadOptions& options) {
  GPUCKPT_ASSIGN_OR_RETURN(ProcessHandle handle, ProcessHandle::Open(pid, options.proc_root));
  ProcessInfo info;
  GPUCKPT_RETURN_IF_ERROR(handle.ReadStat(&info));
  GPUCKPT_RETURN_IF_ERROR(handle.ReadStatus(&info));
  GPUCKPT_RETURN_IF_ERROR(handle.ReadCmdline(options.max_cmdline_bytes, &info));
  GPUCKPT_RETURN_IF_ERROR(handle.ReadExe(&info));
  if (options.read_gpu_devices) {
    auto devices = handle.ReadGpuDevices(options.gpu_device_prefixes);
    if (devices.ok()) {
      info.gpu_devices = std::move(devices).value();
    } else if (devices.status().code() != StatusCode::kPermissionDenied) {
      return devices.status();
    }
  }
  return info;
}

Result<std::vector<int>> ListPids(const std::string& proc_root) {
  DIR* dir = opendir(proc_root.c_str());
  if (dir == nullptr) return StatusFromErrno(errno, proc_root);
  std::vector<int> pids;
  errno = 0;
  while (struct dirent* e = readdir(dir)) {
    int pid = 0;
    if (ParseNumber(std::string_view(e->d_name), &pid) && pid > 0) pids.push_back(pid);
  }
  int err = errno;
  closedir(dir);
  if (err != 0) return StatusFromErrno(err, proc_root);
  return pids;
}

namespace {

// Where there are no children files: every process's parent from its stat.
// (An out-parameter, not a Result: g++ 12 warns falsely, free-nonheap-object,
// about a Result<unordered_map> destroyed after a move.)
Status ChildrenByScan(const std::string& proc_root,
                      std::unordered_map<int, std::vector<int>>* children) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<int> pids, ListPids(proc_root));
  std::sort(pids.begin(), pids.end());
  for (int pid : pids) {
    auto handle = ProcessHandle::Open(pid, proc_root);
    if (!handle.ok()) continue;
    ProcessInfo info;
    if (!handle->ReadStat(&info).ok()) continue;  // gone, or unreadable: not ours to walk
    (*children)[info.ppid].push_back(pid);
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<int>> DirectChildren(const ProcessHandle& handle, const std::string& proc_root) {
  auto direct = handle.ReadChildren();
  if (direct.ok() || direct.status().code() != StatusCode::kUnavailable) return direct;
  std::unordered_map<int, std::vector<int>> by_scan;
  GPUCKPT_RETURN_IF_ERROR(ChildrenByScan(proc_root, &by_scan));
  auto it = by_scan.find(handle.pid());
  if (it == by_scan.end()) return std::vector<int>();
  return it->second;  // sorted: ChildrenByScan walks pids in order
}

Result<std::vector<int>> ProcessTree(int pid, const std::string& proc_root) {
  GPUCKPT_ASSIGN_OR_RETURN(ProcessHandle root, ProcessHandle::Open(pid, proc_root));
  auto direct = root.ReadChildren();
  std::unordered_map<int, std::vector<int>> by_scan;
  bool scan = false;
  if (!direct.ok()) {
    if (direct.status().code() != StatusCode::kUnavailable) return direct.status();
    GPUCKPT_RETURN_IF_ERROR(ChildrenByScan(proc_root, &by_scan));
    scan = true;
  }
  std::vector<int> tree{pid};
  std::unordered_set<int> seen{pid};
  std::deque<int> queue{pid};
  while (!queue.empty()) {
    int p = queue.front();
    queue.pop_front();
    std::vector<int> kids;
    if (scan) {
      auto it = by_scan.find(p);
      if (it != by_scan.end()) kids = it->second;
    } else if (p == pid) {
      kids = std::move(direct).value();
    } else {
      auto handle = ProcessHandle::Open(p, proc_root);
      if (!handle.ok()) continue;  // exited during the walk
      auto r = handle->ReadChildren();
      if (!r.ok()) continue;
      kids = std::move(r).value();
    }
    for (int k : kids) {
      // `seen` guards against loops a reused pid could make mid-walk.
      if (seen.insert(k).second) {
        tree.push_back(k);
        queue.push_back(k);
      }
    }
  }
  return tree;
}

std::string DisplayCommand(const ProcessInfo& info) {
  std::string s;
  if (info.cmdline.empty() || (info.cmdline.size() == 1 && info.cmdline[0].empty())) {
    s = "[" + info.comm + "]";
  } else {
    for (size_t i = 0; i < info.cmdline.size(); ++i) {
      if (i > 0) s += ' ';
      s += info.cmdline[i];
      if (s.size() > kMaxDisplayCommand) break;
    }
  }
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  if (s.size() > kMaxDisplayCommand) {
    size_t cut = kMaxDisplayCommand - 3;
    // Back up to the start of a UTF-8 character (not a 10xxxxxx byte).
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s.resize(cut);
    s += "...";
  }
  // Arguments are bytes (a Latin-1 file name, say): shown and stored in
  // JSON as valid UTF-8.
  return DisplayText(s);
}

}  // namespace gpuckpt
