// Engine, handing every call to EngineImpl; EngineImpl's set-up, naming,
// status report, and the requests that are not checkpoints or restores.
// The two big flows are in checkpoint.cc and restore.cc.
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
#include <cstring>
#include <optional>

#include "core/base/display_text.h"
#include "core/base/full_io.h"
#include "core/base/log.h"
#include "core/base/mono_clock.h"
#include "core/base/time_text.h"
#include "core/base/unique_fd.h"
#include "core/criu/criu_runner.h"
#include "core/engine/engine_impl.h"
#include "core/engine/engine_internal.h"
#include "core/engine/kill_journal.h"

namespace gpuckpt {
namespace {

// --keep-logs keeps work directories for a look; the oldest go beyond this
// many.
constexpr size_t kKeptWorkDirs = 16;
// The CRIU logs of failed operations kept per store (criu-logs/): the oldest
// go beyond this many. A -v4 log is a few hundred KB to a few MB.
constexpr size_t kKeptCriuLogs = 32;
// What is kept of one CRIU log (its end) and of CRIU's stderr.
constexpr size_t kKeptCriuLogBytes = 8 << 20;

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

// Removes the temporary files (".tmp-*") a daemon that died while keeping
// a CRIU log left in `dir`.
void RemoveTemporaries(const std::string& dir) {
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return;
  const int dup_fd = dup(fd.get());
  DIR* d = dup_fd >= 0 ? fdopendir(dup_fd) : nullptr;
  if (d == nullptr) {
    if (dup_fd >= 0) close(dup_fd);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (std::strncmp(e->d_name, ".tmp-", 5) == 0) names.push_back(e->d_name);
  closedir(d);
  for (const auto& name : names) unlinkat(fd.get(), name.c_str(), 0);
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

Status PrepareStateDir(const std::string& dir) { return MakePrivateDir(dir, 0700); }

Status GiveTo(uint32_t uid, uint32_t gid, const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    if (lchown(p.c_str(), uid, gid) != 0) return StatusFromErrno(errno, "chown " + p);
  }
  return Status::Ok();
}

Result<std::unique_ptr<CriuLogs>> CriuLogs::Create(const std::string& work,
                                                   const std::string& log_name,
                                                   std::optional<uint32_t> owner_uid,
                                                   uint32_t owner_gid,
                                                   const std::string& stderr_name) {
  const std::string log_path = work + "/" + log_name;
  UniqueFd log(MakeCriuOutputFile(log_path, owner_uid, owner_gid));
  if (log.get() < 0) return StatusFromErrno(errno, log_path);
  const std::string stderr_path = work + "/" + stderr_name;
  UniqueFd err(MakeCriuOutputFile(stderr_path, owner_uid, owner_gid));
  if (err.get() < 0) return StatusFromErrno(errno, stderr_path);
  return std::unique_ptr<CriuLogs>(new CriuLogs(log.release(), err.release(), log_path));
}

CriuLogs::~CriuLogs() {
  close(log_fd_);
  close(stderr_fd_);
}

namespace {

// The last `max_bytes` of the regular file `fd`, read with pread.
std::string TailOf(int fd, size_t max_bytes) {
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return "";
  const off_t size = st.st_size;
  off_t offset = size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
  std::string out;
  char buf[64 << 10];
  while (offset < size) {
    const ssize_t n = pread(fd, buf, sizeof(buf), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    offset += n;
  }
  return out;
}

}  // namespace

std::string CriuLogs::Contents(size_t max_bytes) const {
  std::string out = TailOf(log_fd_, max_bytes);
  const std::string err = TailOf(stderr_fd_, max_bytes);
  if (!err.empty()) out += "\n--- criu stderr ---\n" + err;
  return out;
}

std::string CriuLogs::Summary() const {
  std::string summary = SummarizeCriuLog(log_fd_);
  if (summary.empty()) summary = SummarizeCriuLog(stderr_fd_);
  return summary;
}

Provenance ProvenanceOf(const SnapshotInfo& info) {
  const CheckpointManifest m = ManifestOrEmpty(info.extra_json);
  const ManifestIds owner = m.OwnerOrRoot();
  const ManifestMaker maker = m.MakerOrOwner();
  return {SnapshotOwner{owner.uid, owner.gid, m.pid},
          SnapshotMaker{maker.uid, maker.gid, maker.groups}, m.IsOwnDump()};
}

SnapshotOwner OwnerOf(const SnapshotInfo& info) { return ProvenanceOf(info).owner; }

SnapshotMaker MakerOf(const SnapshotInfo& info) { return ProvenanceOf(info).maker; }

ManifestMaker MakerRecordOf(const Caller& caller) {
  return ManifestMaker{caller.uid, caller.gid, caller.groups};
}

bool CountsForProcess(const Provenance& p, int pid, uint32_t owner_uid) {
  if (p.owner.pid != pid || p.owner.uid != owner_uid) return false;
  return p.maker.uid == owner_uid || p.maker.uid == 0;
}

bool IsCheckpointOfProcess(const SnapshotInfo& info, int pid, uint32_t owner_uid) {
  return CountsForProcess(ProvenanceOf(info), pid, owner_uid);
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

Status CheckNotCancelled(const Caller& caller, const std::string& what) {
  if (!caller.Cancelled()) return Status::Ok();
  return Status::Cancelled(what + " was not begun: the caller interrupted the request");
}

bool HasUserIdForm(const std::string& name) {
  const size_t dot = name.find('.');
  return dot != std::string::npos && AllDigits(name.substr(0, dot));
}

Result<std::string> CheckpointIdForName(const std::string& name, const Caller& maker) {
  if (!maker.is_root()) return std::to_string(maker.uid) + "." + name;
  if (HasUserIdForm(name))
    return Status::InvalidArgument("checkpoint name '" + DisplayText(name) +
                                   "' has the form UID.NAME of users' checkpoint ids; choose "
                                   "another");
  return name;
}

Result<std::unique_ptr<EngineImpl>> EngineImpl::Create(Store* store,
                                                       std::unique_ptr<GpuBackend> gpu,
                                                       EngineOptions options) {
  GPUCKPT_ASSIGN_OR_RETURN(Criu criu, Criu::Find(options.criu_path));
  GPUCKPT_RETURN_IF_ERROR(MakePrivateDir(options.work_dir, 0711));
  GPUCKPT_RETURN_IF_ERROR(MakePrivateDir(options.work_dir + "/no-plugins", 0755));
  GPUCKPT_RETURN_IF_ERROR(PrepareStateDir(options.state_dir));
  GPUCKPT_RETURN_IF_ERROR(MakePrivateDir(options.state_dir + "/criu-logs", 0700));
  auto engine = std::unique_ptr<EngineImpl>(
      new EngineImpl(store, std::move(gpu), std::move(options), std::move(criu)));
  GPUCKPT_RETURN_IF_ERROR(MakePrivateDir(engine->CriuLogDir(), 0700));
  RemoveTemporaries(engine->CriuLogDir());
  if (Status loaded = engine->catalog_.Prime(); !loaded.ok())
    spdlog::warn("checkpoint catalog not loaded: error={}", LogValue(loaded.message()));
  engine->RecoverInterruptedKills();
  engine->RecoverInterruptedLazyRestores();
  return engine;
}

EngineImpl::EngineImpl(Store* store, std::unique_ptr<GpuBackend> gpu, EngineOptions options,
                       Criu criu)
    : store_(store),
      gpu_(std::move(gpu)),
      options_(std::move(options)),
      criu_(std::move(criu)),
      catalog_(store),
      quota_(store, &catalog_, options_.user_quota_bytes),
      started_ns_(UnixNowNs()) {
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
  const CheckpointManifest m = ManifestOrEmpty(info.extra_json);
  return m.stages ? m.stages->frozen_s : std::nullopt;
}

EngineImpl::~EngineImpl() = default;

void EngineImpl::RecoverInterruptedKills() {
  // A daemon that died between CRIU's dump (which leaves a `--kill` target
  // stopped) and its own commit left a journal entry: the checkpoint was
  // never published, so the process must run on.
  // Their GPU state is still in host memory (CUDA "checkpointed"): bring
  // it back, or they would block in their next CUDA call.
  KillJournal journal(JournalDir());
  const std::vector<int> resumed = journal.ResumeAll();
  if (resumed.empty()) return;
  spdlog::warn("recovery: resumed {} process(es) that a previous daemon left stopped: pids {}",
               resumed.size(), fmt::join(resumed, ","));
  ReleaseGpusOrLog(*gpu_, resumed, "recovery");
}

void EngineImpl::RecoverInterruptedLazyRestores() {
  for (const LazyJournal::Entry& e : LazyJournal(LazyJournalDir()).TakeAll()) {
    auto info = ReadProcess(e.tree_pid, ProcReadOptions{.read_gpu_devices = false});
    if (info.ok() && info->start_time == e.start_time) {
      spdlog::warn(
          "recovery: lazy restore id={} pid={} was still coming in when a previous daemon "
          "stopped; the tree still runs",
          LogValue(e.id), e.tree_pid);
      continue;
    }
    // Its server could no longer read the mount: it killed the tree's
    // unfinished processes (tools/criu-patches) and said why in its log,
    // read without following a link the tree's user may have put there.
    const std::string cause = CriuFailureCause(SummarizeCriuLog(e.work_dir + "/lazy-pages.log"));
    spdlog::warn(
        "recovery: lazy restore id={} pid={} was still coming in when a previous daemon "
        "stopped, so its lazy-pages server killed the tree: {} (log: {}/lazy-pages.log)",
        LogValue(e.id), e.tree_pid, LogValue(cause.empty() ? "its log says nothing" : cause),
        e.work_dir);
  }
}

std::string EngineImpl::LazyJournalDir() const {
  return options_.work_dir + "/lazy-" + StoreDirKey(store_->dir());
}

void ReleaseGpusOrLog(GpuBackend& gpu, const std::vector<int>& pids, const std::string& when) {
  if (pids.empty()) return;
  if (Status s = gpu.Release(pids); !s.ok())
    spdlog::error("gpu release failed: during={} pids={} error={}", LogValue(when),
                  fmt::join(pids, ","), LogValue(s.ToString()));
}

std::string EngineImpl::CriuLogDir() const {
  return options_.state_dir + "/criu-logs/" + StoreDirKey(store_->dir());
}

std::string EngineImpl::KeepCriuLog(const CriuLogs& logs, const std::string& label) {
  const std::string dir = CriuLogDir();
  const std::string contents = logs.Contents(kKeptCriuLogBytes);
  // Named by time, so that names sort oldest first; written under a
  // temporary name and renamed, so that no half-written log is ever seen.
  std::string stamp = Rfc3339Utc(UnixNowNs(), /*with_nanoseconds=*/true);
  stamp.erase(std::remove(stamp.begin(), stamp.end(), ':'), stamp.end());
  const std::string path = dir + "/" + stamp + "-" + label + ".log";
  std::string temp = dir + "/.tmp-XXXXXX";
  UniqueFd fd(mkostemp(temp.data(), O_CLOEXEC));
  auto fail = [&](const std::string& what) {
    spdlog::error("criu log not kept: {} {}: {}", what, LogValue(path), strerror(errno));
    if (fd.get() >= 0) unlink(temp.c_str());
    return std::string();
  };
  if (fd.get() < 0) return fail("create");
  if (!PwriteFully(fd.get(), contents.data(), contents.size(), 0, temp).ok() ||
      fchmod(fd.get(), 0600) != 0)
    return fail("write");
  if (rename(temp.c_str(), path.c_str()) != 0) return fail("rename");
  // The oldest beyond the bound go.
  std::vector<std::string> kept;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 4 && name[0] != '.' && name.compare(name.size() - 4, 4, ".log") == 0)
        kept.push_back(name);
    }
    closedir(d);
  }
  std::sort(kept.begin(), kept.end());
  for (size_t i = 0; i + kKeptCriuLogs < kept.size(); ++i) unlink((dir + "/" + kept[i]).c_str());
  return path;
}

std::string EngineImpl::JournalDir() const {
  return KillJournalDir(options_.work_dir, store_->dir());
}

Result<std::unique_ptr<EngineImpl::WorkDir>> EngineImpl::MakeWorkDir(const std::string& label) {
  std::string templ = options_.work_dir + "/" + label + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return StatusFromErrno(errno, "mkdtemp " + templ);
  return std::make_unique<WorkDir>(this, templ);
}

void EngineImpl::FinishWorkDir(const std::string& dir, bool ok) {
  // A failure's CRIU log was kept under state_dir (KeepCriuLog).
  if (!options_.keep_logs) {
    RemoveTree(dir);
    return;
  }
  std::string drop;
  {
    MutexLock lock(&mu_);
    kept_work_dirs_.push_back(dir);
    if (kept_work_dirs_.size() > kKeptWorkDirs) {
      drop = kept_work_dirs_.front();
      kept_work_dirs_.erase(kept_work_dirs_.begin());
    }
  }
  if (!drop.empty()) RemoveTree(drop);
}

Result<std::string> EngineImpl::NextCheckpointName(int pid) {
  GPUCKPT_ASSIGN_OR_RETURN(const uint64_t highest, catalog_.HighestNumber(pid));
  return std::to_string(pid) + "-" + std::to_string(highest + 1);
}

std::optional<uint32_t> EngineImpl::DedupDomainFor(uint32_t owner_uid) const {
  if (options_.shared_dedup) return std::nullopt;
  return owner_uid;
}

Status EngineImpl::Track(int pid, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo info, ReadProcess(pid));
  GPUCKPT_RETURN_IF_ERROR(MayCheckpoint(caller, info));
  return processes_->Track(pid);
}

Result<GcReport> EngineImpl::Gc(const Caller& caller) {
  const auto start = std::chrono::steady_clock::now();
  auto report = caller.is_root()
                    ? store_->Gc()
                    : Result<GcReport>(Status::PermissionDenied("only root may collect garbage"));
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  NoteStoreChanged();
  metrics_.CountOperation("gc", report.ok() ? "ok" : ResultLabel(report.status().code()));
  if (report.ok()) {
    spdlog::info(
        "gc uid={} result=ok chunks_deleted={} bytes={} pool_swept_chunks={} total_s={:.3f}",
        caller.uid, report->chunks_deleted, report->bytes_deleted, report->pool_swept_chunks,
        total_s);
  } else {
    LogOperationEnd(report.status(), "gc uid={} result={} error={}", caller.uid,
                    ResultLabel(report.status().code()), LogValue(report.status().message()));
  }
  return report;
}

ProcessStatusReport EngineImpl::ProcessStatus(const ProcessInfo& p) {
  ProcessStatusReport report;
  report.process = p;
  report.gpu.unavailable_reason = gpu_->unavailable_reason();
  if (report.gpu.unavailable_reason.empty()) {
    if (auto g = gpu_->Describe(p.pid); g.ok()) report.gpu.process = *g;
  }
  report.operation = board_.InFlightInfo(p.pid);
  report.lazy = lazy_servers_.ProgressOf(p.pid);
  report.last = board_.LastOutcome(p.pid);
  if (auto pool = store_->pool_stats()) report.pool = PoolStatusOf(*pool, report.last);
  report.retention = options_.retention;
  report.owner_retention = options_.owner_retention;
  if (auto scheduled = schedule_.Of(p.pid)) {
    const int64_t next_ns = scheduled->next_due_mono_ns - MonotonicNowNs();
    report.schedule = ScheduleStatus{scheduled->every.count(),
                                     next_ns > 0 ? (next_ns + 999999999) / 1000000000 : 0,
                                     scheduled->runs, scheduled->failures};
    if (!scheduled->retention.empty()) report.retention = scheduled->retention;
    if (!scheduled->owner_retention.empty()) report.owner_retention = scheduled->owner_retention;
  }
  return report;
}

PoolStatus EngineImpl::PoolStatusOf(const PoolStats& pool,
                                    const std::optional<OperationOutcome>& last) {
  // Where the latest checkpoint is: in the pool, or still waiting to be
  // published there (--pool-background). The pool's last error is not
  // shown: it may name another user's checkpoint (it is in the log).
  PoolStatus status{pool.pool, pool.background, pool.pending, std::nullopt};
  if (last && last->ok && !last->checkpoint.empty()) {
    if (auto info = store_->Get(last->checkpoint); info.ok())
      status.last_checkpoint_published = info->pool_incarnation != 0 || info->pool_only;
  }
  return status;
}

std::string EngineImpl::LastResult(ResultFile file, uint32_t uid) const {
  std::optional<RestoreInFlight> restoring;
  ResultText last;
  {
    MutexLock lock(&mu_);
    if (auto r = restores_in_flight_.find(uid);
        file == ResultFile::kRestore && r != restores_in_flight_.end())
      restoring = r->second;
    else if (auto it = last_results_.find({file, uid}); it != last_results_.end())
      last = it->second;
    else
      return "none\n";
  }
  if (!restoring) {
    if (last.lazy_pid == 0) return last.text;
    auto progress = lazy_servers_.ProgressOf(last.lazy_pid);
    return progress ? last.text + "resident: " + LazyProgressText(*progress) + "\n" : last.text;
  }
  if (auto op = board_.InFlightInfo(restoring->pid))
    return "in flight: restore of " + restoring->id + " (" + ProgressText(*op) + ")\n";
  return "in flight: restore of " + restoring->id + "\n";
}

void EngineImpl::NoteRestoreInFlight(uint32_t uid, int pid, const std::string& id) {
  MutexLock lock(&mu_);
  restores_in_flight_[uid] = RestoreInFlight{pid, id};
}

void EngineImpl::ForgetRestoreInFlight(uint32_t uid, int pid) {
  MutexLock lock(&mu_);
  // A later restore of the same caller's may have taken the place.
  auto r = restores_in_flight_.find(uid);
  if (r != restores_in_flight_.end() && r->second.pid == pid) restores_in_flight_.erase(r);
}

int64_t EngineImpl::LastResultTime(ResultFile file, uint32_t uid) const {
  MutexLock lock(&mu_);
  auto it = last_results_.find({file, uid});
  return it == last_results_.end() ? started_ns_ : it->second.set_ns;
}

void EngineImpl::SetLastResult(ResultFile file, uint32_t uid, std::string text, int lazy_pid) {
  if (text.empty() || text.back() != '\n') text += '\n';
  MutexLock lock(&mu_);
  last_results_[{file, uid}] = ResultText{std::move(text), UnixNowNs(), lazy_pid};
}

std::string EngineImpl::MetricsText() {
  std::optional<StoreStats> stats;
  {
    // The scan runs at the first scrape after a change, not at every
    // scrape: changes are operations, each far costlier than the scan, and
    // the settling of a spooled checkpoint, which changes what it takes.
    MutexLock lock(&stats_mu_);
    // Read before the scan: a snapshot settled meanwhile is counted again
    // at the next scrape.
    const uint64_t settled = store_->settled_snapshots();
    if (!store_stats_ || store_changed_.load(std::memory_order_relaxed) ||
        settled != stats_settled_) {
      store_changed_.store(false, std::memory_order_relaxed);
      stats_settled_ = settled;
      if (auto fresh = store_->Stats(); fresh.ok()) {
        store_stats_ = *fresh;
      } else {
        spdlog::error("metrics: store statistics: {}", LogValue(fresh.status().ToString()));
        store_changed_.store(true, std::memory_order_relaxed);
      }
    }
    stats = store_stats_;
  }
  LazyRestoreGauges lazy;
  for (const LazyRestoreProgress& p : lazy_servers_.AllProgress()) {
    ++lazy.trees;
    lazy.bytes_read += p.bytes;
  }
  return metrics_.Render(store_->cache_stats(), stats, store_->pool_stats(), lazy);
}

void EngineImpl::RecordFailure(int pid, const std::string& operation, const Status& status,
                               const Caller& caller) {
  metrics_.CountOperation(operation, ResultLabel(status.code()));
  LogOperationEnd(status, "{} uid={} pid={} result={} error={}", operation, caller.uid, pid,
                  ResultLabel(status.code()), LogValue(status.message()));
  auto ticket = board_.Begin(pid, operation);
  if (ticket.ok()) (*ticket)->SetFailure(status);
}

// --- Engine: the API, handed to EngineImpl ---------------------------------------------

Result<std::unique_ptr<Engine>> Engine::Create(Store* store, std::unique_ptr<GpuBackend> gpu,
                                               EngineOptions options) {
  GPUCKPT_ASSIGN_OR_RETURN(auto impl,
                           EngineImpl::Create(store, std::move(gpu), std::move(options)));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

ProcessTable& Engine::processes() { return impl_->processes(); }
Result<SnapshotInfo> Engine::Checkpoint(const CheckpointRequest& request) {
  return impl_->Checkpoint(request);
}
Result<int> Engine::Restore(const RestoreRequest& request) { return impl_->Restore(request); }
Result<SnapshotInfo> Engine::Import(const std::string& path, const std::string& name,
                                    const Caller& caller) {
  return impl_->Import(path, name, caller);
}
Status Engine::Track(int pid, const Caller& caller) { return impl_->Track(pid, caller); }
Status Engine::StopSchedule(int pid, const Caller& caller) {
  return impl_->StopSchedule(pid, caller);
}
Result<GcReport> Engine::Gc(const Caller& caller) { return impl_->Gc(caller); }
ProcessStatusReport Engine::ProcessStatus(const ProcessInfo& process) {
  return impl_->ProcessStatus(process);
}
std::string Engine::LastResult(ResultFile file, uint32_t uid) const {
  return impl_->LastResult(file, uid);
}
int64_t Engine::LastResultTime(ResultFile file, uint32_t uid) const {
  return impl_->LastResultTime(file, uid);
}
Status Engine::CheckRemovable(const std::string& id) const { return impl_->CheckRemovable(id); }

size_t Engine::LazyRestoresInFlight() const { return impl_->LazyRestoresInFlight(); }

bool Engine::LazyServerBypassesPageCache(int pid) const {
  return impl_->LazyServerBypassesPageCache(pid);
}

void Engine::NoteLazyPagesCopied(int server_pid, uint64_t bytes, bool on_fault) {
  impl_->NoteLazyPagesCopied(server_pid, bytes, on_fault);
}

void Engine::NoteLazyPagesCopiedInBatch(int server_pid, uint64_t bytes) {
  impl_->NoteLazyPagesCopiedInBatch(server_pid, bytes);
}

void Engine::SetLastResult(ResultFile file, uint32_t uid, std::string text) {
  impl_->SetLastResult(file, uid, std::move(text));
}
std::string Engine::MetricsText() { return impl_->MetricsText(); }
void Engine::NoteStoreChanged() { impl_->NoteStoreChanged(); }
void Engine::NoteRemoved(const std::string& id, uint64_t key) { impl_->NoteRemoved(id, key); }
int64_t Engine::started_ns() const { return impl_->started_ns(); }
void Engine::RecordFailure(int pid, const std::string& operation, const Status& status,
                           const Caller& caller) {
  impl_->RecordFailure(pid, operation, status, caller);
}

}  // namespace gpuckpt
