// Engine: set-up, naming, status texts, and the requests that are not
// checkpoints or restores. The two big flows are in checkpoint.cc and
// restore.cc.
#include "core/engine/engine.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/engine/kill_journal.h"

namespace gpuckpt {
namespace {

// Failed operations keep their work directory (CRIU's log) for a look; the
// oldest go beyond this many.
constexpr size_t kKeptFailures = 16;

// A directory of the daemon's with exactly `mode`. The work dir is 0711:
// CRIU run as a user must reach its operation's directory (0700, theirs)
// without seeing the others'.
Status MakePrivateDir(const std::string& path, mode_t mode) {
  if (mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return StatusFromErrno(errno, path);
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return StatusFromErrno(errno, path);
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
    return Status::PermissionDenied(path + " is not a directory owned by the daemon's user");
  }
  if ((st.st_mode & 07777) != mode && chmod(path.c_str(), mode) != 0)
    return StatusFromErrno(errno, "chmod " + path);
  return Status::Ok();
}

void RemoveTree(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d != nullptr) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string child = path + "/" + name;
      struct stat st {};
      if (lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        RemoveTree(child);
      } else {
        unlink(child.c_str());
      }
    }
    closedir(d);
  }
  rmdir(path.c_str());
}

}  // namespace

void ReleaseFreeMemory() { malloc_trim(0); }

Status GiveTo(uint32_t uid, uint32_t gid, const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    if (lchown(p.c_str(), uid, gid) != 0) return StatusFromErrno(errno, "chown " + p);
  }
  return Status::Ok();
}

StderrFile::StderrFile(const std::string& path)
    : fd_(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) {}

StderrFile::~StderrFile() {
  if (fd_ >= 0) close(fd_);
}

SnapshotOwner OwnerOf(const SnapshotInfo& info) {
  SnapshotOwner owner;
  auto extra = nlohmann::json::parse(info.extra_json, nullptr, /*allow_exceptions=*/false);
  if (!extra.is_object()) return owner;
  auto number = [](const nlohmann::json& j, const char* key) -> uint64_t {
    auto it = j.find(key);
    return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
  };
  if (auto it = extra.find("owner"); it != extra.end() && it->is_object()) {
    owner.uid = static_cast<uint32_t>(number(*it, "uid"));
    owner.gid = static_cast<uint32_t>(number(*it, "gid"));
  }
  owner.pid = static_cast<int>(number(extra, "pid"));
  return owner;
}

Result<std::unique_ptr<Engine>> Engine::Create(Store* store, std::unique_ptr<GpuBackend> gpu,
                                               EngineOptions options) {
  GPUCKPT_ASSIGN_OR_RETURN(Criu criu, Criu::Find(options.criu_path));
  GPUCKPT_RETURN_IF_ERROR(MakePrivateDir(options.work_dir, 0711));
  GPUCKPT_RETURN_IF_ERROR(MakePrivateDir(options.work_dir + "/no-plugins", 0755));
  auto engine = std::unique_ptr<Engine>(
      new Engine(store, std::move(gpu), std::move(options), std::move(criu)));
  engine->RecoverInterruptedKills();
  return engine;
}

Engine::Engine(Store* store, std::unique_ptr<GpuBackend> gpu, EngineOptions options, Criu criu)
    : store_(store), gpu_(std::move(gpu)), options_(std::move(options)), criu_(std::move(criu)) {
  ProcessTableOptions table;
  table.all_processes = options_.all_processes;
  table.ttl = options_.process_cache_ttl;
  processes_ = std::make_unique<ProcessTable>(table);
  empty_plugin_dir_ = options_.work_dir + "/no-plugins";
  staging_ = std::make_shared<ByteBudget>(
      options_.staging_memory_bytes != 0 ? options_.staging_memory_bytes : DefaultStagingMemory());
}

uint64_t DefaultStagingMemory() {
  constexpr uint64_t kFloor = 256ull << 20;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return kFloor;
  return std::max(kFloor, static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) / 4);
}

std::optional<double> FrozenSecondsOf(const SnapshotInfo& info) {
  const nlohmann::json extra = nlohmann::json::parse(info.extra_json, nullptr, false);
  if (!extra.is_object()) return std::nullopt;
  auto stages = extra.find("stages");
  if (stages == extra.end() || !stages->is_object()) return std::nullopt;
  auto frozen = stages->find("frozen_s");
  if (frozen == stages->end() || !frozen->is_number()) return std::nullopt;
  return frozen->get<double>();
}

Engine::~Engine() = default;

void Engine::RecoverInterruptedKills() {
  // A daemon that died between CRIU's dump (which leaves a `--kill` target
  // stopped) and its own commit left a journal entry: the checkpoint was
  // never published, so the process must run on.
  // Their GPU state is still in host memory (CUDA "checkpointed"): bring
  // it back, or they would block in their next CUDA call.
  KillJournal journal(JournalDir());
  gpu_->Release(journal.ResumeAll()).PermitUnchecked();
}

std::string Engine::JournalDir() const { return KillJournalDir(options_.work_dir, store_->dir()); }

Result<std::unique_ptr<Engine::WorkDir>> Engine::MakeWorkDir(const std::string& label) {
  std::string templ = options_.work_dir + "/" + label + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return StatusFromErrno(errno, "mkdtemp " + templ);
  return std::make_unique<WorkDir>(this, templ);
}

void Engine::FinishWorkDir(const std::string& dir, bool ok) {
  if (ok && !options_.keep_logs) {
    RemoveTree(dir);
    return;
  }
  std::string drop;
  {
    std::lock_guard lock(mu_);
    kept_failures_.push_back(dir);
    if (kept_failures_.size() > kKeptFailures) {
      drop = kept_failures_.front();
      kept_failures_.erase(kept_failures_.begin());
    }
  }
  if (!drop.empty()) RemoveTree(drop);
}

Result<std::string> Engine::NextCheckpointName(int pid) {
  GPUCKPT_ASSIGN_OR_RETURN(auto snapshots, store_->List());
  const std::string prefix = std::to_string(pid) + "-";
  uint64_t highest = 0;
  for (const auto& s : snapshots) {
    if (s.id.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = s.id.substr(prefix.size());
    if (rest.empty() || rest.size() > 9 ||
        !std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    highest = std::max<uint64_t>(highest, std::stoull(rest));
  }
  return prefix + std::to_string(highest + 1);
}

Status Engine::Track(int pid, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo info, ReadProcess(pid));
  GPUCKPT_RETURN_IF_ERROR(MayCheckpoint(caller, info));
  return processes_->Track(pid);
}

Result<GcReport> Engine::Gc(const Caller& caller) {
  if (!caller.is_root()) return Status::PermissionDenied("only root may collect garbage");
  return store_->Gc();
}

std::string Engine::ProcessStatus(const ProcessInfo& p) {
  std::string out;
  out += fmt::format("pid: {}\n", p.pid);
  out += fmt::format("command: {}\n", DisplayCommand(p));
  out += fmt::format("owner: uid {} gid {}\n", p.creds.ruid, p.creds.rgid);
  out += fmt::format("state: {}\n", std::string(1, p.state));
  out += fmt::format("threads: {}\n", p.threads);
  out += fmt::format("memory: rss {:.1f} MB, virtual {:.1f} MB\n",
                     static_cast<double>(p.rss_bytes) / 1e6, static_cast<double>(p.vm_bytes) / 1e6);
  std::string devices;
  for (const auto& d : p.gpu_devices) devices += (devices.empty() ? "" : " ") + d;
  out += fmt::format("gpu devices: {}\n", devices.empty() ? "none" : devices);
  if (!p.gpu_children.empty())
    out += fmt::format("job: launcher of GPU processes {} (a checkpoint takes the whole tree)\n",
                       fmt::join(p.gpu_children, " "));
  const std::string unavailable = gpu_->unavailable_reason();
  if (!unavailable.empty()) {
    out += fmt::format("gpu: off, GPU state cannot be checkpointed here ({})\n", unavailable);
  } else if (auto g = gpu_->Describe(p.pid); g.ok()) {
    out += fmt::format("gpu state: {}\n", g->state);
    for (const auto& d : g->gpus)
      out += fmt::format("gpu: {} {} ({:.1f} GiB)\n", d.name, d.uuid.empty() ? "-" : d.uuid,
                         static_cast<double>(d.memory_bytes) / (1u << 30));
    if (g->device_memory_bytes > 0)
      out += fmt::format("device memory: {} bytes ({:.2f} GiB)\n", g->device_memory_bytes,
                         static_cast<double>(g->device_memory_bytes) / (1u << 30));
  }
  out += "operation: " + board_.InFlight(p.pid) + "\n";
  out += "last: " + board_.Last(p.pid) + "\n";
  return out;
}

std::string Engine::RestoreResult(uint32_t uid) const {
  std::lock_guard lock(mu_);
  auto it = restore_results_.find(uid);
  return it == restore_results_.end() ? "none\n" : it->second;
}

void Engine::SetRestoreResult(uint32_t uid, std::string text) {
  if (text.empty() || text.back() != '\n') text += '\n';
  std::lock_guard lock(mu_);
  restore_results_[uid] = std::move(text);
}

std::string Engine::MetricsText() const { return metrics_.Render(store_->cache_stats()); }

void Engine::RecordFailure(int pid, const std::string& operation, const Status& status) {
  metrics_.CountOperation(operation, ResultLabel(status.code()));
  auto ticket = board_.Begin(pid, operation);
  if (ticket.ok()) (*ticket)->SetResult(operation + " failed: " + status.message());
}

}  // namespace gpuckpt
