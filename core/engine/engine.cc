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
#include <climits>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/base/unique_fd.h"
#include "core/criu/criu_runner.h"
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

// Removes what is in the directory `dir_fd` and below. Work directories
// may be a user's (their CRIU wrote there): everything is reached through
// descriptors, without following a symlink, so an entry swapped for a
// symlink meanwhile removes the symlink, never what it points to.
void RemoveContents(int dir_fd) {
  const int dup_fd = dup(dir_fd);
  if (dup_fd < 0) return;
  DIR* d = fdopendir(dup_fd);
  if (d == nullptr) {
    close(dup_fd);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  for (const auto& name : names) {
    if (unlinkat(dir_fd, name.c_str(), 0) == 0 || errno != EISDIR) continue;
    UniqueFd sub(
        openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (sub.get() >= 0) RemoveContents(sub.get());
    unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR);
  }
}

void RemoveTree(const std::string& path) {
  UniqueFd dir(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.get() >= 0) RemoveContents(dir.get());
  rmdir(path.c_str());
}

// A file the daemon makes in a work directory for CRIU to write: created
// anew (never an existing name, never through a symlink), readable back
// through the returned descriptor, and given to `owner` when CRIU runs as
// a user. -1 with errno set on failure.
int MakeCriuOutputFile(const std::string& path, std::optional<uint32_t> owner_uid,
                       uint32_t owner_gid) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  if (owner_uid && fchown(fd, *owner_uid, owner_gid) != 0) {
    const int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

}  // namespace

void ReleaseFreeMemory() { malloc_trim(0); }

Status GiveTo(uint32_t uid, uint32_t gid, const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    if (lchown(p.c_str(), uid, gid) != 0) return StatusFromErrno(errno, "chown " + p);
  }
  return Status::Ok();
}

Result<std::unique_ptr<CriuLogs>> CriuLogs::Create(const std::string& work,
                                                   const std::string& log_name,
                                                   std::optional<uint32_t> owner_uid,
                                                   uint32_t owner_gid) {
  const std::string log_path = work + "/" + log_name;
  UniqueFd log(MakeCriuOutputFile(log_path, owner_uid, owner_gid));
  if (log.get() < 0) return StatusFromErrno(errno, log_path);
  const std::string stderr_path = work + "/criu.stderr";
  UniqueFd err(MakeCriuOutputFile(stderr_path, owner_uid, owner_gid));
  if (err.get() < 0) return StatusFromErrno(errno, stderr_path);
  return std::unique_ptr<CriuLogs>(new CriuLogs(log.release(), err.release(), log_path));
}

CriuLogs::~CriuLogs() {
  close(log_fd_);
  close(stderr_fd_);
}

std::string CriuLogs::Summary() const {
  std::string summary = SummarizeCriuLog(log_fd_);
  if (summary.empty()) summary = SummarizeCriuLog(stderr_fd_);
  return summary;
}

namespace {

// The owner and the maker of a snapshot, from one parse of its "extra":
// listings ask both of every snapshot in the store.
struct Provenance {
  SnapshotOwner owner;
  SnapshotMaker maker;
};

Provenance ProvenanceOf(const SnapshotInfo& info) {
  Provenance p;
  auto extra = nlohmann::json::parse(info.extra_json, nullptr, /*allow_exceptions=*/false);
  if (!extra.is_object()) return p;
  auto number = [](const nlohmann::json& j, const char* key) -> uint64_t {
    auto it = j.find(key);
    return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
  };
  if (auto it = extra.find("owner"); it != extra.end() && it->is_object()) {
    p.owner.uid = static_cast<uint32_t>(number(*it, "uid"));
    p.owner.gid = static_cast<uint32_t>(number(*it, "gid"));
  }
  p.owner.pid = static_cast<int>(number(extra, "pid"));
  p.maker = SnapshotMaker{p.owner.uid, p.owner.gid, {}};
  auto made_by = extra.find("made_by");
  if (made_by == extra.end() || !made_by->is_object()) return p;
  auto id = [&](const char* key) -> std::optional<uint32_t> {
    auto it = made_by->find(key);
    if (it == made_by->end() || !it->is_number_unsigned() || it->get<uint64_t>() > UINT32_MAX)
      return std::nullopt;
    return static_cast<uint32_t>(it->get<uint64_t>());
  };
  const auto uid = id("uid"), gid = id("gid");
  // A record that does not parse says nothing: the owner stands.
  if (!uid || !gid) return p;
  p.maker = SnapshotMaker{*uid, *gid, {}};
  if (auto groups = made_by->find("groups"); groups != made_by->end() && groups->is_array()) {
    for (const auto& g : *groups)
      if (g.is_number_unsigned() && g.get<uint64_t>() <= UINT32_MAX)
        p.maker.groups.push_back(static_cast<uint32_t>(g.get<uint64_t>()));
  }
  return p;
}

}  // namespace

SnapshotOwner OwnerOf(const SnapshotInfo& info) { return ProvenanceOf(info).owner; }

SnapshotMaker MakerOf(const SnapshotInfo& info) { return ProvenanceOf(info).maker; }

nlohmann::json MadeByJson(const Caller& caller) {
  return {{"uid", caller.uid}, {"gid", caller.gid}, {"groups", caller.groups}};
}

bool IsCheckpointOfProcess(const SnapshotInfo& info, int pid, uint32_t owner_uid) {
  const Provenance p = ProvenanceOf(info);
  if (p.owner.pid != pid || p.owner.uid != owner_uid) return false;
  return p.maker.uid == owner_uid || p.maker.uid == 0;
}

namespace {
bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}
}  // namespace

Status CheckCheckpointName(const std::string& name) {
  const size_t dash = name.find('-');
  if (dash != std::string::npos && AllDigits(name.substr(0, dash)) &&
      AllDigits(name.substr(dash + 1))) {
    return Status::InvalidArgument("checkpoint name '" + name +
                                   "' has the form PID-N of the automatic names; choose another");
  }
  return Status::Ok();
}

std::string CheckpointIdForName(const std::string& name, const Caller& maker) {
  if (maker.is_root()) return name;
  return std::to_string(maker.uid) + "." + name;
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
    // Only the engine makes names of this form (CheckCheckpointName), so
    // they stay far below 2^64.
    if (!AllDigits(rest) || rest.size() > 18) continue;
    highest = std::max<uint64_t>(highest, std::stoull(rest));
  }
  return prefix + std::to_string(highest + 1);
}

Status Engine::CheckQuota(const Caller& caller, uint64_t worst_case_bytes,
                          const std::string& what) {
  if (caller.is_root() || options_.user_quota_bytes == 0) return Status::Ok();
  GPUCKPT_ASSIGN_OR_RETURN(auto snapshots, store_->List());
  uint64_t used = 0;
  for (const auto& s : snapshots)
    if (OwnerOf(s).uid == caller.uid) used += s.stored_bytes;
  if (used + worst_case_bytes <= options_.user_quota_bytes) return Status::Ok();
  return Status::NoSpace(fmt::format(
      "quota: the checkpoints of uid {} hold {:.1f} MB of the store, {} may add up to {:.1f} MB "
      "more, and the quota is {:.1f} MB (rm -r some checkpoints)",
      caller.uid, used / 1e6, what, worst_case_bytes / 1e6, options_.user_quota_bytes / 1e6));
}

std::optional<uint32_t> Engine::DedupDomainFor(uint32_t owner_uid) const {
  if (options_.shared_dedup) return std::nullopt;
  return owner_uid;
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
