#include "core/engine/kill_journal.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <functional>

#include "core/proc/process_info.h"

namespace gpuckpt {

std::string KillJournal::Entry(int pid, uint64_t start_time) const {
  return dir_ + "/" + std::to_string(pid) + "-" + std::to_string(start_time);
}

Status KillJournal::Add(const std::vector<int>& pids, const std::vector<uint64_t>& start_times) {
  if (mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) return StatusFromErrno(errno, dir_);
  for (size_t i = 0; i < pids.size(); ++i) {
    const std::string path = Entry(pids[i], start_times[i]);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return StatusFromErrno(errno, path);
    close(fd);
  }
  return Status::Ok();
}

void KillJournal::Remove(const std::vector<int>& pids, const std::vector<uint64_t>& start_times) {
  for (size_t i = 0; i < pids.size(); ++i) unlink(Entry(pids[i], start_times[i]).c_str());
}

std::vector<int> ResumeProcesses(const std::vector<int>& pids,
                                 const std::vector<uint64_t>& start_times) {
  std::vector<int> resumed;
  for (size_t i = 0; i < pids.size(); ++i) {
    auto info = ReadProcess(pids[i], ProcReadOptions{.read_gpu_devices = false});
    if (info.ok() && info->start_time == start_times[i] && kill(pids[i], SIGCONT) == 0)
      resumed.push_back(pids[i]);
  }
  return resumed;
}

std::string StoreDirKey(const std::string& store_dir) {
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016zx", std::hash<std::string>{}(store_dir));
  return hash;
}

std::string KillJournalDir(const std::string& work_dir, const std::string& store_dir) {
  return work_dir + "/stopped-" + StoreDirKey(store_dir);
}

std::vector<int> KillJournal::ResumeAll() {
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return {};
  std::vector<int> pids;
  std::vector<uint64_t> starts;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    int pid = 0;
    unsigned long long start = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "%d-%llu%c", &pid, &start, &tail) == 2 && pid > 0) {
      pids.push_back(pid);
      starts.push_back(start);
    }
    names.emplace_back(e->d_name);
  }
  closedir(d);
  std::vector<int> resumed = ResumeProcesses(pids, starts);
  for (const auto& n : names)
    if (n != "." && n != "..") unlink((dir_ + "/" + n).c_str());
  return resumed;
}

}  // namespace gpuckpt
