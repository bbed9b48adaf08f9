#include "core/engine/lazy_restore.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "core/base/small_file.h"

namespace gpuckpt {

std::string WhyNotLazy(const LazyTreeFacts& facts) {
  if (!facts.mount_serves_images)
    return "a lazy restore reads the checkpoint's pages through the daemon's mount, and this "
           "restore runs without one";
  if (facts.own_namespaces)
    return "a tree with a pid or mount namespace of its own is restored eagerly: its pids "
           "are not this machine's, which the lazy server needs";
  // CRIU 4.1.1 uses no userfaultfd when it runs unprivileged, and the
  // kernel lets only a holder of CAP_SYS_PTRACE follow a lazily restored
  // process's forks (UFFD_FEATURE_EVENT_FORK), which a tree needs.
  if (!facts.as_root)
    return "an ordinary user's tree is restored eagerly: its restore runs as its owner, and "
           "the kernel lets only a process with CAP_SYS_PTRACE follow a lazily restored "
           "process's forks";
  return "";
}

LazyServers::LazyServers(EndedFn ended) : ended_(std::move(ended)) {}

LazyServers::~LazyServers() {
  std::map<uint64_t, std::thread> threads;
  {
    MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& [key, t] : threads) t.join();
}

void LazyServers::Adopt(std::string id, int tree_pid, uint32_t caller_uid, uint64_t expected_bytes,
                        std::chrono::steady_clock::time_point start, CriuProcess server,
                        FinishFn finish) {
  std::vector<std::thread> finished;
  MutexLock lock(&mu_);
  for (uint64_t key : ended_keys_) {
    finished.push_back(std::move(threads_[key]));
    threads_.erase(key);
  }
  ended_keys_.clear();
  if (auto it = starting_.find(server.pid()); it != starting_.end()) {
    if (it->second) through_page_cache_.insert(server.pid());
    starting_.erase(it);
  }
  const uint64_t key = next_key_++;
  servers_[key] = Server{std::move(id),  tree_pid, caller_uid,       server.pid(),
                         expected_bytes, start,    std::move(finish)};
  threads_[key] =
      std::thread([this, key, s = std::make_shared<CriuProcess>(std::move(server))]() mutable {
        Wait(key, std::move(*s));
      });
  lock.Unlock();
  for (std::thread& t : finished) t.join();
}

void LazyServers::Wait(uint64_t key, CriuProcess server) {
  // Its pid is no longer read (ProgressOf) once it has exited: after the
  // wait it could be another process's.
  struct pollfd exited = {server.pidfd(), POLLIN, 0};
  while (poll(&exited, 1, -1) < 0 && errno == EINTR) {
  }
  uint64_t copied_bytes = 0;
  {
    MutexLock lock(&mu_);
    through_page_cache_.erase(servers_[key].server_pid);
    if (auto copied = copied_.find(servers_[key].server_pid); copied != copied_.end()) {
      copied_bytes = copied->second;
      copied_.erase(copied);
    }
    servers_[key].server_pid = 0;
  }
  Result<int> exit = server.Wait();
  Server done;
  {
    MutexLock lock(&mu_);
    auto it = servers_.find(key);
    done = std::move(it->second);
    servers_.erase(it);
  }
  Ended ended;
  ended.id = done.id;
  ended.tree_pid = done.tree_pid;
  ended.caller_uid = done.caller_uid;
  ended.exit_code = exit.ok() ? *exit : -1;
  ended.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - done.start).count();
  ended.expected_bytes = done.expected_bytes;
  ended.copied_bytes = copied_bytes;
  ended.why = done.finish(ended.exit_code == 0);
  if (ended.why.empty() && ended.exit_code != 0)
    ended.why = exit.ok() ? "the lazy-pages server exited with " + std::to_string(*exit)
                          : exit.status().message();
  ended_(ended);
  done.finish = nullptr;  // the work dir and logs, after `ended_` has seen them
  MutexLock lock(&mu_);
  ended_keys_.push_back(key);
}

void LazyServers::NoteStarting(int server_pid, bool through_page_cache) {
  MutexLock lock(&mu_);
  starting_[server_pid] = through_page_cache;
}

void LazyServers::ForgetStarting(int server_pid) {
  MutexLock lock(&mu_);
  starting_.erase(server_pid);
  copied_.erase(server_pid);
}

bool LazyServers::NoteCopied(int server_pid, uint64_t bytes) {
  MutexLock lock(&mu_);
  if (!IsServerLocked(server_pid)) return false;
  copied_[server_pid] += bytes;
  return true;
}

bool LazyServers::IsServer(int pid) const {
  MutexLock lock(&mu_);
  return IsServerLocked(pid);
}

bool LazyServers::IsServerLocked(int pid) const {
  if (pid > 0 && starting_.count(pid) != 0) return true;
  for (const auto& [key, server] : servers_)
    if (server.server_pid == pid) return pid > 0;
  return false;
}

bool LazyServers::BypassesPageCache(int pid) const {
  if (!IsServer(pid)) return false;
  MutexLock lock(&mu_);
  if (auto it = starting_.find(pid); it != starting_.end()) return !it->second;
  return through_page_cache_.count(pid) == 0;
}

bool LazyServers::Serving(const std::string& id) const {
  MutexLock lock(&mu_);
  for (const auto& [key, server] : servers_)
    if (server.id == id) return true;
  return false;
}

std::vector<LazyServers::Progress> LazyServers::Snapshot(int tree_pid) const {
  std::vector<std::pair<int, Progress>> running;  // (server pid, progress so far)
  {
    MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [key, server] : servers_) {
      if (server.server_pid == 0 || (tree_pid != 0 && server.tree_pid != tree_pid)) continue;
      auto copied = copied_.find(server.server_pid);
      running.push_back(
          {server.server_pid,
           Progress{server.id, copied == copied_.end() ? 0 : copied->second, server.expected_bytes,
                    std::chrono::duration<double>(now - server.start).count()}});
    }
  }
  std::vector<Progress> out;
  for (auto& [server_pid, progress] : running) {
    // Our own child, not waited for yet (Wait() clears server_pid first):
    // its pid is still its.
    auto io = ReadSmallFileNoFollow("/proc/" + std::to_string(server_pid) + "/io", 4096);
    if (io.ok()) {
      const size_t at = io->find("rchar: ");
      if (at != std::string::npos)
        progress.bytes += std::strtoull(io->c_str() + at + 7, nullptr, 10);
    }
    out.push_back(std::move(progress));
  }
  return out;
}

std::optional<LazyServers::Progress> LazyServers::ProgressOf(int tree_pid) const {
  if (tree_pid <= 0) return std::nullopt;
  std::vector<Progress> found = Snapshot(tree_pid);
  if (found.empty()) return std::nullopt;
  return found.front();
}

std::vector<LazyServers::Progress> LazyServers::AllProgress() const { return Snapshot(0); }

size_t LazyServers::size() const {
  MutexLock lock(&mu_);
  return servers_.size();
}

Status LazyJournal::Add(const Entry& entry) {
  if (mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) return StatusFromErrno(errno, dir_);
  const std::string path = dir_ + "/" + std::to_string(entry.tree_pid);
  const std::string text =
      entry.id + "\n" + entry.work_dir + "\n" + std::to_string(entry.start_time) + "\n";
  // Whole or absent for the next daemon: written aside, then renamed.
  const std::string tmp = path + ".new";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return StatusFromErrno(errno, tmp);
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int write_errno = errno;
  close(fd);
  if (!written) return StatusFromErrno(write_errno, tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) return StatusFromErrno(errno, path);
  return Status::Ok();
}

void LazyJournal::Remove(int tree_pid) { unlink((dir_ + "/" + std::to_string(tree_pid)).c_str()); }

std::vector<LazyJournal::Entry> LazyJournal::TakeAll() {
  std::vector<Entry> entries;
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return entries;
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);  // "<pid>", or a torn "<pid>.new"
  closedir(d);
  for (const std::string& name : names) {
    const std::string path = dir_ + "/" + name;
    auto text = ReadSmallFileNoFollow(path, 8192);
    unlink(path.c_str());
    if (!text.ok()) continue;
    std::istringstream lines(*text);
    Entry entry;
    entry.tree_pid = std::atoi(name.c_str());
    std::string start;
    if (!std::getline(lines, entry.id) || !std::getline(lines, entry.work_dir) ||
        !std::getline(lines, start) || entry.tree_pid <= 0)
      continue;
    entry.start_time = std::strtoull(start.c_str(), nullptr, 10);
    entries.push_back(std::move(entry));
  }
  return entries;
}

}  // namespace gpuckpt
