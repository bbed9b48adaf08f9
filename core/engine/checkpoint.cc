// Engine::Checkpoint: CRIU dumps the tree with --stream, every image file
// goes from CRIU's pipe straight into the snapshot writer, and the snapshot
// is published only once CRIU succeeded and every byte is durable.
//
// `--kill` asks CRIU to leave the tree stopped (not to kill it), so that a
// checkpoint that fails to commit can still resume it; the tree is killed
// only after the snapshot is published. A journal entry covers the window
// in which a crash of the daemon would leave it stopped (kill_journal.h).
#include <fcntl.h>
#include <fmt/format.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <set>
#include <thread>

#include "core/base/display_text.h"
#include "core/base/log.h"
#include "core/base/mono_clock.h"
#include "core/base/small_file.h"
#include "core/base/time_text.h"
#include "core/criu/image_streamer.h"
#include "core/criu/images.h"
#include "core/engine/engine_impl.h"
#include "core/engine/engine_internal.h"
#include "core/engine/kill_journal.h"
#include "core/proc/mount_table.h"

namespace gpuckpt {
namespace {

constexpr int kPipeBytes = 1 << 20;
// CRIU's --ghost-limit (per deleted file): no practical limit.
constexpr char kGhostLimit[] = "1024G";

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CRIU refuses a tree whose session or process group leader is outside it
// unless told that it is a "shell job" (started from a shell); those ids
// are then restored from CRIU's own.
bool NeedsShellJob(const ProcessInfo& root, const std::vector<int>& tree) {
  auto inside = [&](int id) { return std::find(tree.begin(), tree.end(), id) != tree.end(); };
  return !inside(root.sid) || !inside(root.pgid);
}

// CRIU cannot checkpoint io_uring instances, and says so cryptically
// ("Unknown shit 600 (anon_inode:[io_uring])") after the GPUs were locked
// and the tree frozen: refuse first, plainly. PyTorch's TCPStore (the
// store of torch.distributed) holds one when it runs on libuv.
Status RefuseIoUring(const std::vector<int>& tree) {
  for (int pid : tree) {
    auto handle = ProcessHandle::Open(pid);
    if (!handle.ok()) continue;  // exited meanwhile
    auto rings = handle->ReadGpuDevices({"anon_inode:[io_uring]"});
    if (rings.ok() && !rings->empty())
      return Status::Unavailable(fmt::format(
          "process {} uses io_uring, which CRIU cannot checkpoint (PyTorch's TCPStore does on "
          "libuv: USE_LIBUV=0 in the job's environment, or ?use_libuv=0 in a tcp:// "
          "init_method, avoids it)",
          pid));
  }
  return Status::Ok();
}

// Every CUDA process maps one 2 MiB region of /dev/nvidia-uvm; each CUDA
// managed allocation (cudaMallocManaged) adds a mapping of its own size.
// Measured on driver 580.159.04: plain CUDA processes, PyTorch training and
// inference and pinned host memory map the 2 MiB region alone; a 1 GiB
// managed allocation adds a 1 GiB mapping. A mapping larger than the region
// is managed memory; one of 2 MiB or less is not told apart from it, and
// the driver then refuses the checkpoint itself, after the freeze.
constexpr std::string_view kNvidiaUvm = "/dev/nvidia-uvm";
constexpr uint64_t kUvmRegionBytes = 2u << 20;

// The driver cannot checkpoint a process that holds CUDA managed memory: it
// answers cuCheckpointProcessCheckpoint with CUDA_ERROR_NOT_SUPPORTED, after
// the tree was locked and frozen (measured on driver 580.159.04). Refuse
// first, plainly.
Status RefuseCudaManagedMemory(const std::vector<int>& tree) {
  for (int pid : tree) {
    auto handle = ProcessHandle::Open(pid);
    if (!handle.ok()) continue;  // exited meanwhile
    auto sizes = handle->ReadMappingSizes(kNvidiaUvm);
    if (!sizes.ok()) continue;  // then the driver says what it cannot do
    uint64_t managed = 0;
    for (uint64_t size : *sizes)
      if (size > kUvmRegionBytes) managed += size;
    if (managed != 0)
      return Status::Unavailable(fmt::format(
          "process {} holds {:.1f} MB of CUDA managed memory (cudaMallocManaged), which the "
          "NVIDIA driver cannot checkpoint; nothing was locked or frozen",
          pid, managed / 1e6));
  }
  return Status::Ok();
}

// Whether a process of the tree holds a TCP connection, which CRIU dumps in
// TCP repair mode (CAP_NET_ADMIN). A process that cannot be read counts as
// holding none: CRIU then says what it could not dump.
bool TreeHoldsTcpConnection(const std::vector<int>& tree) {
  for (int pid : tree) {
    auto handle = ProcessHandle::Open(pid);
    if (!handle.ok()) continue;  // exited meanwhile
    if (auto holds = handle->HoldsTcpConnection(); holds.ok() && *holds) return true;
  }
  return false;
}

// Where the root of a process's mount namespace is, as the daemon sees it:
// its "/" mount (`theirs`) found among the daemon's mounts (`ours`) by
// device and by the directory of the filesystem it shows: "/" for
// `unshare -m`, a container's root filesystem (e.g. Podman's overlay,
// mounted on the host while the container runs) for a container. nullopt
// where no mount of the daemon's shows it.
std::optional<std::string> HostPathOfRoot(const std::vector<MountEntry>& theirs,
                                          const std::vector<MountEntry>& ours) {
  const MountEntry* root = nullptr;
  for (const MountEntry& m : theirs)  // the last: a mount stacked on "/" hides the older one
    if (m.mountpoint == "/") root = &m;
  if (root == nullptr) return std::nullopt;
  auto at_or_below = [](const std::string& path, const std::string& dir) {
    return dir == "/" || (path.compare(0, dir.size(), dir) == 0 &&
                          (path.size() == dir.size() || path[dir.size()] == '/'));
  };
  // The first mount that shows it: the host's own, not a later bind mount.
  for (const MountEntry& m : ours) {
    if (m.device != root->device || !at_or_below(root->root, m.root)) continue;
    // m shows the directory m.root of the filesystem at m.mountpoint.
    const std::string rest = m.root == "/" ? root->root : root->root.substr(m.root.size());
    const std::string path = m.mountpoint == "/" ? rest : m.mountpoint + (rest == "/" ? "" : rest);
    return path.empty() ? "/" : path;
  }
  return std::nullopt;
}

// A process's mount namespace other than the daemon's (a container,
// `unshare -m`), which CRIU dumps with it: where its root is on the host
// (a restore in a new mount namespace needs it again: CRIU's --root), and
// what CRIU needs to dump it.
struct OwnMountNamespace {
  std::optional<std::string> root;
  std::vector<std::string> criu_args;
};

// nullopt when `pid` shares the daemon's mount namespace. CRIU cannot dump
// a FUSE mount and fails the whole dump on one: gpuckpt's own mounts (this
// daemon's, which a namespace made by copying ours holds, and those of
// other gpuckptfs instances) are no state of the process, so CRIU leaves
// them out, and the restored namespace has their empty directories. So are
// bind mounts of namespace files (nsfs: `ip netns`' /run/netns/*, a
// container engine's), which name namespaces of this host that a restore
// could not bring back. Paths as the process sees them, as CRIU matches
// them.
std::optional<OwnMountNamespace> ReadOwnMountNamespace(int pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat own {};
  struct stat its {};
  if (stat("/proc/self/ns/mnt", &own) != 0 || stat((proc + "/ns/mnt").c_str(), &its) != 0 ||
      own.st_ino == its.st_ino)
    return std::nullopt;
  // Bind mounts of the host's files and directories (a container's
  // /etc/hosts, its cgroup directories) show only part of a filesystem
  // whose "/" the namespace lacks: CRIU finds them among its own mounts
  // (mnt[], auto-detection) and records where they came from.
  OwnMountNamespace ns{std::nullopt, {"--external", "mnt[]"}};
  auto theirs = ReadMountTable(proc + "/mountinfo");
  if (!theirs.ok()) return ns;  // CRIU then says what it could not dump
  for (const MountEntry& m : *theirs) {
    if (m.type != kGpuckptMountType && m.type != "nsfs") continue;
    ns.criu_args.push_back("--skip-mnt");
    ns.criu_args.push_back(m.mountpoint);
  }
  if (auto ours = ReadMountTable("/proc/self/mountinfo"); ours.ok())
    ns.root = HostPathOfRoot(*theirs, *ours);
  return ns;
}

// CRIU's own account of the dump (stats-dump, in its work directory), or
// nothing when it wrote none. The directory may be the user's (an
// unprivileged dump): the file is read as untrusted.
std::optional<CriuDumpStats> ReadCriuDumpStats(const std::string& work) {
  constexpr size_t kMaxStatsBytes = 4096;
  auto bytes = ReadSmallFileNoFollow(work + "/stats-dump", kMaxStatsBytes);
  if (!bytes.ok()) return std::nullopt;
  auto stats = ParseDumpStatsImage(*bytes);
  if (!stats.ok()) return std::nullopt;
  return *stats;
}

}  // namespace

FrozenTime MeasureFrozenTime(const GpuBackend::LockSpan& gpu, int64_t dump_end_ns,
                             const std::optional<CriuDumpStats>& criu) {
  FrozenTime frozen;
  if (gpu.first_lock_ns) {
    // The GPU work stood still from the first lock to the last unlock; a
    // tree that is not unlocked (--kill) stood still until the dump ended.
    const int64_t end = gpu.last_unlock_ns.value_or(dump_end_ns);
    frozen.seconds = std::max<int64_t>(0, end - *gpu.first_lock_ns) / 1e9;
    frozen.how = gpu.last_unlock_ns ? "gpu lock to unlock" : "gpu lock to end of dump";
  } else if (criu) {
    frozen.seconds = criu->frozen_us / 1e6;
    frozen.how = "criu freeze to resume";
  }
  if (criu) frozen.criu_seconds = criu->frozen_us / 1e6;
  return frozen;
}

// Everything a checkpoint must undo on a way out that does not publish it,
// in one object: the kill-journal entry, the GPU locks the backend took
// before CRIU ran, and for --kill the tree CRIU left stopped. Whatever is
// still held when it goes is given back, so that every early return undoes
// exactly what was done. Not thread-safe: one checkpoint's.
class CheckpointRollback {
 public:
  CheckpointRollback(GpuBackend& gpu, KillJournal& journal, const CheckpointRequest& request,
                     const std::vector<int>& tree, const std::vector<uint64_t>& start_times)
      : gpu_(gpu), journal_(journal), request_(request), tree_(tree), start_times_(start_times) {}
  CheckpointRollback(const CheckpointRollback&) = delete;
  CheckpointRollback& operator=(const CheckpointRollback&) = delete;

  ~CheckpointRollback() {
    // CRIU gives a failed dump's processes back running itself; a dump
    // that succeeded with --leave-stopped left them stopped with their
    // device state in host memory, so a commit that fails must continue
    // them and bring their GPU state back.
    if (tree_stopped_)
      ReleaseGpusOrLog(gpu_, ResumeProcesses(tree_, start_times_),
                       "failed checkpoint --kill of " + std::to_string(request_.pid));
    ReleaseLocks();
    if (journaled_) journal_.Remove(tree_, start_times_);
  }

  // A --kill leaves the tree stopped until it is killed, and a tree of
  // several processes may have its GPU processes locked by the backend
  // before CRIU runs: a daemon that dies meanwhile leaves the journal to
  // the next one, which lets them go (EngineImpl::RecoverInterruptedKills()).
  Status JournalIfNeeded() {
    if (!request_.kill && tree_.size() <= 1) return Status::Ok();
    GPUCKPT_RETURN_IF_ERROR(journal_.Add(tree_, start_times_));
    journaled_ = true;
    return Status::Ok();
  }

  // The backend locked `pids` itself, beginning at `since_ns`: they stay
  // locked through CRIU's dump (its plugin leaves them so) until
  // ReleaseLocks(); their lock times are ours to take.
  void HoldLocks(const std::vector<int>& pids, int64_t since_ns) {
    locked_pids_ = pids;
    if (!pids.empty()) lock_span_.first_lock_ns = since_ns;
  }

  void ReleaseLocks() {
    if (locked_pids_.empty()) return;
    ReleaseGpusOrLog(gpu_, locked_pids_, "checkpoint of " + std::to_string(request_.pid));
    lock_span_.last_unlock_ns = MonotonicNowNs();
    locked_pids_.clear();
  }

  // CRIU is about to run: with --kill it may leave the tree stopped.
  void DumpStarting() { tree_stopped_ = request_.kill; }

  // The checkpoint is published: a --kill tree is killed (nothing of it is
  // left to give back), and the journal entry goes.
  void Published() {
    if (request_.kill) {
      for (size_t i = tree_.size(); i-- > 0;) {
        auto p = ReadProcess(tree_[i], ProcReadOptions{.read_gpu_devices = false});
        if (p.ok() && p->start_time == start_times_[i]) kill(tree_[i], SIGKILL);
      }
      locked_pids_.clear();
    }
    tree_stopped_ = false;
  }

  // When the locks HoldLocks() took were taken and given back (empty when
  // the backend took none).
  const GpuBackend::LockSpan& lock_span() const { return lock_span_; }

 private:
  GpuBackend& gpu_;
  KillJournal& journal_;
  const CheckpointRequest& request_;
  const std::vector<int>& tree_;
  const std::vector<uint64_t>& start_times_;
  bool journaled_ = false;
  bool tree_stopped_ = false;
  std::vector<int> locked_pids_;
  GpuBackend::LockSpan lock_span_;
};

// The GPUs of the whole tree (a launcher's child may be the GPU user), each
// once, and the device memory they all hold.
void DescribeGpus(GpuBackend& gpu, const std::vector<int>& tree, CheckpointManifest* manifest) {
  uint64_t device_memory = 0;
  std::set<std::string> seen_gpus;
  for (int pid : tree) {
    auto g = gpu.Describe(pid);
    if (!g.ok()) continue;
    device_memory += g->device_memory_bytes;
    for (const auto& d : g->gpus) {
      if (!seen_gpus.insert(d.uuid.empty() ? d.name : d.uuid).second) continue;
      manifest->gpus.push_back({d.name, d.uuid, d.memory_bytes});
    }
  }
  manifest->device_memory_bytes = device_memory;
}

// The image files CRIU streams are the process owner's.
FileEntry ImageEntry(std::string path, FileType type, uint32_t mode, const ProcessInfo& process,
                     int64_t mtime_ns) {
  FileEntry e;
  e.path = std::move(path);
  e.type = type;
  e.mode = mode;
  e.uid = process.creds.ruid;
  e.gid = process.creds.rgid;
  e.mtime_ns = mtime_ns;
  return e;
}

Status CriuFailure(const std::string& what, const CriuLogs& logs, const Status& served,
                   Result<int>& exit, std::vector<std::string>* detail) {
  const std::string summary = logs.Summary();
  if (detail != nullptr) *detail = SplitLines(summary);
  // The store ran out of space: CRIU then fails only because its pipe was
  // closed ("Broken pipe"), so the store's error is the one that says what
  // happened and what to do.
  if (served.code() == StatusCode::kNoSpace) {
    return Status::NoSpace(what + " failed: " + served.message());
  }
  const CriuFailureKind kind = ClassifyCriuFailure(summary);
  if (kind == CriuFailureKind::kNoSpace) {
    return Status::NoSpace(what + " failed: no space left on a disk CRIU wrote to (" +
                           CriuFailureCause(summary) + ")");
  }
  // One line, for `last:` and `cat restore`; the other lines of the log
  // that say more are `detail`.
  std::string message = what + " failed";
  if (!exit.ok()) {
    message += ": " + exit.status().message();
  } else if (*exit != 0) {
    message += " (criu exit " + std::to_string(*exit) + ")";
  }
  if (const std::string cause = CriuFailureCause(summary); !cause.empty()) message += ": " + cause;
  if (!served.ok() && (exit.ok() && *exit == 0)) message += ": " + served.message();
  // A port the checkpoint's sockets bind is taken. Most often by the
  // checkpointed job's own closed connections, which the kernel keeps in
  // TIME_WAIT for a minute after they closed (a restore right after a
  // kill): nothing is wrong with the checkpoint, try again (EBUSY).
  if (kind == CriuFailureKind::kAddressInUse)
    return Status::Busy(
        "a TCP port the checkpoint's sockets use is taken on this machine (by connections "
        "that closed less than a minute ago and wait in TIME_WAIT, e.g. the checkpointed "
        "job's own, or by another process): try again in a minute; " +
        message);
  return Status::IOError(message);
}

Result<SnapshotInfo> EngineImpl::Checkpoint(const CheckpointRequest& request) {
  std::string kept_log;   // the CRIU log of a failed dump
  bool on_board = false;  // the ticket recorded the outcome
  // Held until the store's change is noted, so that no other operation of
  // the owner's misses both it and the checkpoint it stored.
  std::unique_ptr<QuotaLedger::Reservation> reserved;
  auto run = [&]() -> Result<SnapshotInfo> {
    GPUCKPT_RETURN_IF_ERROR(CheckScheduleRequest(request));
    GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo process, processes_->Get(request.pid));
    GPUCKPT_RETURN_IF_ERROR(MayCheckpoint(request.caller, process));
    GPUCKPT_ASSIGN_OR_RETURN(std::vector<int> tree, CheckpointableTree(request));
    const TreeFootprint footprint = MeasureTree(tree);
    // At worst every byte of the tree's memory and device memory is new;
    // the checkpoint is its process's owner's, whoever asks.
    GPUCKPT_ASSIGN_OR_RETURN(
        reserved, quota_.Reserve(request.caller, process.creds.ruid,
                                 footprint.rss_bytes + footprint.device_memory_bytes,
                                 "a checkpoint of process " + std::to_string(request.pid)));
    GPUCKPT_ASSIGN_OR_RETURN(auto ticket, board_.Begin(request.pid, "checkpoint"));
    on_board = true;
    // The image holds about the tree's memory and its device memory.
    ticket->SetExpectedBytes(footprint.rss_bytes + footprint.device_memory_bytes);
    auto info = DumpAndStore(request, process, tree, footprint, ticket.get(), &kept_log);
    if (info.ok()) {
      const std::optional<double> frozen = FrozenSecondsOf(*info);
      ticket->SetResult(fmt::format(
          "checkpoint {} ok ({}durable after {:.2f} s, {:.1f} MB logical, {:.1f} MB new)", info->id,
          frozen ? fmt::format("frozen {:.2f} s, ", *frozen) : "", info->duration_s,
          info->logical_bytes / 1e6, info->new_bytes / 1e6));
      ticket->SetCheckpoint(info->id);
    } else {
      ticket->SetFailure(info.status());
    }
    return info;
  };
  auto result = run();
  ReleaseFreeMemory();
  NoteStoreChanged();
  reserved.reset();
  RecordCheckpointEnd(request, result, on_board, kept_log);
  if (result.ok()) {
    ApplyRetention(request, *result);
    if (request.every.count() > 0) StartSchedule(request);
  }
  return result;
}

Result<std::vector<int>> EngineImpl::CheckpointableTree(const CheckpointRequest& request) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<int> tree, ProcessTree(request.pid));
  if (!request.caller.is_root()) {
    // CRIU takes the whole tree: every process in it must be the caller's.
    for (int pid : tree) {
      auto member = ReadProcess(pid, ProcReadOptions{.read_gpu_devices = false});
      if (!member.ok()) continue;  // exited meanwhile; CRIU sees the tree anew
      GPUCKPT_RETURN_IF_ERROR(MayCheckpoint(request.caller, *member));
    }
  }
  GPUCKPT_RETURN_IF_ERROR(RefuseIoUring(tree));
  GPUCKPT_RETURN_IF_ERROR(RefuseCudaManagedMemory(tree));
  return tree;
}

void EngineImpl::RecordCheckpointEnd(const CheckpointRequest& request,
                                     const Result<SnapshotInfo>& result, bool on_board,
                                     const std::string& kept_log) {
  if (result.ok()) {
    metrics_.CountOperation("checkpoint", "ok");
    metrics_.AddCheckpointBytes(result->logical_bytes, result->new_bytes, result->stored_bytes);
    const std::optional<double> frozen = FrozenSecondsOf(result.value());
    if (frozen) metrics_.ObserveFrozen(*frozen);
    spdlog::info(
        "checkpoint uid={} pid={} id={} result=ok logical_bytes={} new_bytes={} stored_bytes={} "
        "frozen_s={} total_s={:.3f}",
        request.caller.uid, request.pid, LogValue(result->id), result->logical_bytes,
        result->new_bytes, result->stored_bytes, frozen ? fmt::format("{:.3f}", *frozen) : "-",
        result->duration_s);
    return;
  }
  const Status& failure = result.status();
  metrics_.CountOperation("checkpoint", ResultLabel(failure.code()));
  // A refusal before the operation began (not found, denied, no room) is
  // shown too; a busy process's status shows the operation in its way.
  if (!on_board && failure.code() != StatusCode::kBusy) {
    auto ticket = board_.Begin(request.pid, "checkpoint");
    if (ticket.ok()) (*ticket)->SetFailure(failure);
  }
  LogOperationEnd(failure, "checkpoint uid={} pid={} result={} error={}{}", request.caller.uid,
                  request.pid, ResultLabel(failure.code()), LogValue(failure.message()),
                  kept_log.empty() ? "" : " criu_log=" + LogValue(kept_log));
}

namespace {

// The directories of one dump inside its work dir: `images`, through which
// CRIU streams, and the scratch directory where gpuckpt's cuda-checkpoint
// records the device memory it saw the driver move into host memory, and
// its lock events.
Result<GpuCheckpointOptions> MakeDumpDirs(const std::string& work, const std::string& images,
                                          uint32_t lock_timeout_ms) {
  if (mkdir(images.c_str(), 0700) != 0) return StatusFromErrno(errno, images);
  GpuCheckpointOptions gpu_options;
  gpu_options.lock_timeout_ms = lock_timeout_ms;
  gpu_options.scratch_dir = work + "/gpu";
  if (mkdir(gpu_options.scratch_dir.c_str(), 0700) != 0)
    return StatusFromErrno(errno, gpu_options.scratch_dir);
  return gpu_options;
}

}  // namespace

TreeIdentity IdentifyTree(const ProcessInfo& root, const std::vector<int>& tree) {
  TreeIdentity identity;
  std::set<uint32_t> uids;
  for (int pid : tree) {
    auto p = ReadProcess(pid, ProcReadOptions{.read_gpu_devices = false});
    identity.start_times.push_back(p.ok() ? p->start_time : 0);
    if (p.ok()) uids.insert({p->creds.ruid, p->creds.euid, p->creds.suid});
  }
  // A tree with a process of another user, or one that is root in any of
  // its ids (a setuid program), holds more than one user's rights.
  const ProcessCredentials& c = root.creds;
  if (uids.size() == 1 && *uids.begin() == c.ruid && c.ruid != 0)
    identity.user = Caller{.uid = c.ruid, .gid = c.rgid, .groups = c.groups};
  return identity;
}

namespace {

// Opens the dump's CRIU logs in `work` and, for a tree wholly one user's,
// makes `cmd` run as that user, who is given `work_paths`.
Result<std::unique_ptr<CriuLogs>> PrepareDumpRunner(
    const ProcessInfo& process, const std::vector<int>& tree, const TreeIdentity& identity,
    const std::string& work, const std::vector<std::string>& work_paths, CriuCommand* cmd) {
  const bool dump_as_owner = identity.user.has_value();
  // Made before the work dir is the user's, so the names are the daemon's.
  GPUCKPT_ASSIGN_OR_RETURN(
      auto criu_logs,
      CriuLogs::Create(work, "dump.log",
                       dump_as_owner ? std::optional<uint32_t>(process.creds.ruid) : std::nullopt,
                       process.creds.rgid));
  if (dump_as_owner) {
    // CRIU dumps a tree that is wholly one user's as that user
    // (CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE only): least privilege, and
    // root may lack what a dump of another uid needs (CAP_SYS_RESOURCE for
    // prlimit, in containers). A tree of several owners (only root may ask
    // for that) is dumped as root. CAP_NET_ADMIN only for a tree with TCP
    // connections (the ranks of a multi-GPU job), whose sockets CRIU reads
    // in repair mode: the user's own sockets, nothing it could not see.
    cmd->run_as = CriuCredentials{process.creds.ruid, process.creds.rgid, process.creds.groups,
                                  /*keep_sys_ptrace=*/true, /*keep_setpcap=*/false};
    cmd->run_as->keep_net_admin = TreeHoldsTcpConnection(tree);
    cmd->args.push_back("--unprivileged");
    GPUCKPT_RETURN_IF_ERROR(GiveTo(process.creds.ruid, process.creds.rgid, work_paths));
  }
  cmd->stderr_fd = criu_logs->stderr_fd();
  return criu_logs;
}

void AppendArgs(const std::vector<std::string>& args, CriuCommand* cmd) {
  cmd->args.insert(cmd->args.end(), args.begin(), args.end());
}

// How CRIU's dump ended: what serving its image stream returned, and its
// exit.
struct DumpOutcome {
  Status served;
  Result<int> exit;
  bool ok() const { return served.ok() && exit.ok() && exit.value() == 0; }
};

// Runs `cmd` and stores every image file CRIU streams into `writer`, under
// images/.
Result<DumpOutcome> RunDump(const Criu& criu_runner, const CriuCommand& cmd,
                            ImageCaptureServer& server, SnapshotWriter& writer,
                            const ProcessInfo& process, CheckpointRollback& rollback,
                            OperationBoard::Ticket* ticket) {
  ticket->SetStage("dump");
  const int64_t mtime = UnixNowNs();
  GPUCKPT_RETURN_IF_ERROR(
      writer.AddEntry(ImageEntry("images", FileType::kDirectory, 0700, process, mtime)));
  rollback.DumpStarting();
  GPUCKPT_ASSIGN_OR_RETURN(auto criu, criu_runner.Start(cmd));
  Status served = server.Serve(
      [&](const std::string& file, int fd) -> Status {
        // CRIU splices pages into this pipe 64 KiB at a time by default: a
        // larger pipe halves the wake-ups on both sides. Best effort (the
        // limit is /proc/sys/fs/pipe-max-size).
        fcntl(fd, F_SETPIPE_SZ, kPipeBytes);
        return writer.AddFile(
            ImageEntry("images/" + file, FileType::kRegular, 0600, process, mtime), fd);
      },
      criu.pidfd(), criu.pid());
  Result<int> exit = criu.Wait();
  return DumpOutcome{std::move(served), std::move(exit)};
}

}  // namespace

Result<SnapshotInfo> EngineImpl::DumpAndStore(
    const CheckpointRequest& request, const ProcessInfo& process, const std::vector<int>& tree,
    const TreeFootprint& footprint, OperationBoard::Ticket* ticket, std::string* kept_log) {
  // Before the work dir (a refusal leaves no log to keep) and before
  // anything is locked or frozen: the process runs on untouched.
  GPUCKPT_RETURN_IF_ERROR(CheckRoomForCheckpoint(request.pid, footprint, request.check_space));
  const auto start = std::chrono::steady_clock::now();
  GPUCKPT_ASSIGN_OR_RETURN(auto work_dir, MakeWorkDir("checkpoint-" + std::to_string(request.pid)));
  const std::string& work = work_dir->path();
  const std::string images = work + "/images";
  const uint32_t lock_timeout_ms =
      request.lock_timeout_ms != 0 ? request.lock_timeout_ms : options_.lock_timeout_ms;
  GPUCKPT_ASSIGN_OR_RETURN(const GpuCheckpointOptions gpu_options,
                           MakeDumpDirs(work, images, lock_timeout_ms));
  const TreeIdentity identity = IdentifyTree(process, tree);
  KillJournal journal(JournalDir());
  CheckpointRollback rollback(*gpu_, journal, request, tree, identity.start_times);
  GPUCKPT_RETURN_IF_ERROR(rollback.JournalIfNeeded());
  // The last moment the caller can give up: nothing is locked or frozen yet.
  GPUCKPT_RETURN_IF_ERROR(CheckNotCancelled(
      request.caller, "the checkpoint of process " + std::to_string(request.pid)));
  const int64_t setup_start_ns = MonotonicNowNs();
  // Locking the GPU and moving device memory to the host can be most of a
  // GPU process's checkpoint: a stage of its own in `status`.
  if (footprint.device_memory_bytes > 0) ticket->SetStage("gpu");
  GPUCKPT_ASSIGN_OR_RETURN(const CriuGpuSetup gpu, gpu_->SetupForCheckpoint(tree, gpu_options));
  rollback.HoldLocks(gpu.locked_pids, setup_start_ns);

  const std::optional<OwnMountNamespace> mount_namespace = ReadOwnMountNamespace(request.pid);
  CheckpointManifest manifest =
      DescribeCheckpoint(request, process, tree, identity, gpu, gpu_options);
  if (mount_namespace) manifest.mount_namespace = ManifestMountNamespace{mount_namespace->root};
  GPUCKPT_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotWriter> writer,
                           BeginCheckpointSnapshot(request, process, footprint, &manifest));
  writer->SetProgress([ticket](uint64_t done, uint64_t) { ticket->SetBytes(done); },
                      process.rss_bytes);
  GPUCKPT_ASSIGN_OR_RETURN(auto server, ImageCaptureServer::Listen(images));

  CriuCommand cmd = DumpCommand(request, process, tree, gpu, work, images);
  if (mount_namespace) AppendArgs(mount_namespace->criu_args, &cmd);
  GPUCKPT_ASSIGN_OR_RETURN(
      auto criu_logs,
      PrepareDumpRunner(process, tree, identity, work,
                        {work, images, gpu_options.scratch_dir, server->socket_path()}, &cmd));

  GPUCKPT_ASSIGN_OR_RETURN(DumpOutcome dump,
                           RunDump(criu_, cmd, *server, *writer, process, rollback, ticket));
  // A tree that runs on gets its GPUs back now, not after the commit; a
  // --kill tree stays stopped and locked until it is killed.
  if (!request.kill) rollback.ReleaseLocks();
  const int64_t dump_end_ns = MonotonicNowNs();
  // CRIU is done: what is staged is now what everyone waits for.
  writer->SetBackground(false);
  const double dump_s = SecondsSince(start);
  metrics_.ObserveStage("checkpoint", "dump", dump_s);
  if (!dump.ok())
    return DumpFailure(request.pid, *criu_logs, dump.served, dump.exit, gpu_options, ticket,
                       kept_log);

  RecordDumpResults(gpu_options, rollback.lock_span(), dump_end_ns, dump_s, work, &manifest);
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, CommitCheckpoint(*writer, manifest, ticket));
  rollback.Published();
  if (request.kill) processes_->Invalidate();
  work_dir->MarkSucceeded();
  return info;
}

Status EngineImpl::DumpFailure(int pid, const CriuLogs& logs, const Status& served,
                               Result<int>& exit, const GpuCheckpointOptions& gpu_options,
                               OperationBoard::Ticket* ticket, std::string* kept_log) {
  Status failure =
      RecordCriuFailure("criu dump of process " + std::to_string(pid),
                        "checkpoint-" + std::to_string(pid), logs, served, exit, ticket, kept_log);
  // The driver could not lock the process in time (long GPU work in
  // flight): nothing is wrong, it runs on; try again later (EAGAIN).
  // cuda-checkpoint recorded it in the scratch directory.
  if (gpu_->LockTimes(gpu_options).lock_timed_out)
    return Status::Aborted(fmt::format(
        "the GPU driver could not lock process {} within {} ms (GPU work in flight); it was "
        "left running: try again, or with a longer --lock-timeout",
        pid, gpu_options.lock_timeout_ms));
  return failure;
}

Status EngineImpl::RecordCriuFailure(const std::string& what, const std::string& label,
                                     const CriuLogs& logs, const Status& served, Result<int>& exit,
                                     OperationBoard::Ticket* ticket, std::string* kept_log) {
  std::vector<std::string> detail;
  Status failure = CriuFailure(what, logs, served, exit, &detail);
  *kept_log = KeepCriuLog(logs, label);
  ticket->AddDetail(detail);
  if (!kept_log->empty()) ticket->SetCriuLog(*kept_log);
  return failure;
}

void EngineImpl::RecordDumpResults(const GpuCheckpointOptions& gpu_options,
                                   const GpuBackend::LockSpan& held_locks, int64_t dump_end_ns,
                                   double dump_s, const std::string& work,
                                   CheckpointManifest* manifest) {
  // The device memory the driver moved into host memory, found by
  // cuda-checkpoint: shown under device/ as slices of the pages images.
  auto ranges = gpu_->DeviceRanges(gpu_options);
  if (ranges.ok()) {
    for (const auto& r : *ranges) manifest->cuda_host_ranges.push_back({r.pid, r.start, r.end});
  } else {
    manifest->device_error = ranges.status().message();
  }
  const GpuBackend::LockSpan locks =
      held_locks.first_lock_ns ? held_locks : gpu_->LockTimes(gpu_options);
  const FrozenTime frozen = MeasureFrozenTime(locks, dump_end_ns, ReadCriuDumpStats(work));
  manifest->stages =
      ManifestStages{dump_s, frozen.seconds, frozen.seconds ? frozen.how : "", frozen.criu_seconds};
  manifest->staging_memory_bytes = staging_->capacity();
}

Result<SnapshotInfo> EngineImpl::CommitCheckpoint(SnapshotWriter& writer,
                                                  const CheckpointManifest& manifest,
                                                  OperationBoard::Ticket* ticket) {
  ticket->SetStage("store");
  const auto commit_start = std::chrono::steady_clock::now();
  writer.SetExtraJson(EncodeManifest(manifest));
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, writer.Commit());
  catalog_.Add(info);
  metrics_.ObserveStage("checkpoint", "commit", SecondsSince(commit_start));
  return info;
}

CheckpointManifest EngineImpl::DescribeCheckpoint(const CheckpointRequest& request,
                                                  const ProcessInfo& process,
                                                  const std::vector<int>& tree,
                                                  const TreeIdentity& identity,
                                                  const CriuGpuSetup& gpu,
                                                  const GpuCheckpointOptions& gpu_options) {
  CheckpointManifest manifest;
  manifest.pid = request.pid;
  manifest.command = DisplayCommand(process);
  manifest.owner = ManifestIds{process.creds.ruid, process.creds.rgid};
  // Rights follow the data: a tree wholly one user's is that user's
  // checkpoint whoever asked (root included), dumped and restored with their
  // rights only; only a tree that held root's or several users' processes
  // is made by the one who asked (root: nobody else may ask for one).
  manifest.made_by = MakerRecordOf(identity.user.value_or(request.caller));
  manifest.tree = tree;
  manifest.mode = request.kill ? CheckpointMode::kKill : CheckpointMode::kLeaveRunning;
  manifest.shell_job = NeedsShellJob(process, tree);
  manifest.criu_version = criu_.version();
  manifest.gpu_backend = gpu.stacks;
  const bool uses_gpu = gpu.stacks != GpuStacks::kNone;
  manifest.driver_version = uses_gpu ? gpu_->driver_version() : "";
  if (uses_gpu) {
    manifest.lock_timeout_ms = gpu_options.lock_timeout_ms;
    DescribeGpus(*gpu_, tree, &manifest);
  }
  return manifest;
}

bool EngineImpl::ShouldSpool(const TreeFootprint& footprint, bool check_space) const {
  switch (options_.spool) {
    case EngineOptions::Spool::kAlways:
      return true;
    case EngineOptions::Spool::kNever:
      return false;
    case EngineOptions::Spool::kAuto:
      break;
  }
  if (std::thread::hardware_concurrency() >= EngineOptions::kSpoolBelowCpus) return false;
  // A caller who turned the space check off expects the checkpoint to fit
  // only as a repeat of its parent: not spooled, which writes every byte.
  if (!check_space) return false;
  // Spooled, the image takes its whole size on the disk, and settling it
  // as much again (its chunks are written before its spool files go): on a
  // disk without room for both it is chunked as it comes instead.
  const uint64_t image = footprint.rss_bytes + footprint.device_memory_bytes;
  auto free = store_->FreeBytes();
  return free.ok() && *free / 2 >= image;
}

Result<std::unique_ptr<SnapshotWriter>> EngineImpl::BeginCheckpointSnapshot(
    const CheckpointRequest& request, const ProcessInfo& process, const TreeFootprint& footprint,
    CheckpointManifest* manifest) {
  // The checkpoint this one follows (the process's latest), for users
  // tracing a series. It is also the base the store compares the new
  // chunks with, if it was written for the same owner: chunks the process
  // left unchanged are then recognised without being hashed.
  std::string base;
  if (auto latest = catalog_.LatestOfProcess(request.pid, process.creds.ruid);
      latest.ok() && latest->has_value()) {
    manifest->parent = **latest;
    base = **latest;
  }
  // No extra yet: the manifest is complete only after the dump, and
  // CommitCheckpoint gives it to the writer; nothing reads it before.
  SnapshotSpec spec{"",
                    "pid " + std::to_string(request.pid) + " (" + DisplayText(process.comm) + ")",
                    "", base, DedupDomainFor(process.creds.ruid)};
  // CRIU's pipes are drained into staging memory as fast as CRIU writes
  // them, with hashing, compression and the disk behind, on idle CPU only
  // until CRIU is done: the tree is frozen for as long as CRIU runs. What
  // the image is expected to take (the tree's memory, and the device memory
  // the driver moves into it) is faulted in before CRIU starts.
  SnapshotWriterOptions writer_options;
  writer_options.staging_bytes = staging_->capacity();
  writer_options.shared_staging = staging_;
  // Where hashing cannot keep pace with the disk, a checkpoint without a
  // base to compare with is spooled: CRIU's pipes are spliced into spool
  // files on the store's disk, as fast as it writes them, and nothing is
  // staged. One with a base stages what CRIU writes and stores only what
  // changed. The staging memory is faulted in only then (by the writer).
  // One that is not spooled waits for its parent to be settled if need be.
  // (--spool always: every checkpoint, whatever its parent.)
  writer_options.spool =
      !ShouldSpool(footprint, request.check_space)      ? SnapshotWriterOptions::Spool::kNever
      : options_.spool == EngineOptions::Spool::kAlways ? SnapshotWriterOptions::Spool::kAlways
                                                        : SnapshotWriterOptions::Spool::kUnlessBase;
  writer_options.prefault_bytes = footprint.rss_bytes + manifest->device_memory_bytes.value_or(0);
  writer_options.background = true;
  return BeginNamedSnapshot(request, std::move(spec), writer_options);
}

Result<std::unique_ptr<SnapshotWriter>> EngineImpl::BeginNamedSnapshot(
    const CheckpointRequest& request, SnapshotSpec spec, const SnapshotWriterOptions& options) {
  if (!request.name.empty()) {
    GPUCKPT_RETURN_IF_ERROR(CheckCheckpointName(request.name));
    GPUCKPT_ASSIGN_OR_RETURN(spec.name, CheckpointIdForName(request.name, request.caller));
    return store_->BeginSnapshot(spec, options);
  }
  GPUCKPT_ASSIGN_OR_RETURN(spec.name, NextCheckpointName(request.pid));
  auto writer = store_->BeginSnapshot(spec, options);
  if (writer.ok() || writer.status().code() != StatusCode::kAlreadyExists) return writer;
  // The catalog missed a snapshot of that name: it is read from the store
  // again, and the next name tried once.
  catalog_.Load().PermitUnchecked();
  GPUCKPT_ASSIGN_OR_RETURN(spec.name, NextCheckpointName(request.pid));
  return store_->BeginSnapshot(spec, options);
}

CriuCommand EngineImpl::DumpCommand(const CheckpointRequest& request, const ProcessInfo& process,
                                    const std::vector<int>& tree, const CriuGpuSetup& gpu,
                                    const std::string& work, const std::string& images) const {
  CriuCommand cmd;
  cmd.work_dir = work;
  cmd.args = {"dump",
              "-t",
              std::to_string(request.pid),
              "-D",
              images,
              "-W",
              work,
              "--stream",
              "-o",
              "dump.log",
              "-v4",
              "--libdir",
              PluginDirFor(gpu)};
  cmd.args.push_back(request.kill ? "--leave-stopped" : "--leave-running");
  // Established TCP connections are dumped (and restored) with the
  // process: the ranks of a job talk over loopback sockets (NCCL, the
  // PyTorch store), both ends in the tree. CRIU's firewall lock is skipped:
  // it adds iptables rules that a --kill checkpoint would leave behind, and
  // an in-tree connection, frozen at both ends, needs none.
  cmd.args.insert(cmd.args.end(), {"--tcp-established", "--network-lock", "skip"});
  // A deleted file a process still holds (NCCL's /dev/shm segment, 33 MiB a
  // rank) is part of its state, and CRIU stores its bytes: its default
  // limit (1 MiB) would refuse the checkpoint.
  cmd.args.insert(cmd.args.end(), {"--ghost-limit", kGhostLimit});
  if (NeedsShellJob(process, tree)) cmd.args.push_back("--shell-job");
  cmd.args.insert(cmd.args.end(), gpu.criu_args.begin(), gpu.criu_args.end());
  cmd.path_prepend = gpu.path_prepend;
  cmd.environment = gpu.environment;
  return cmd;
}

}  // namespace gpuckpt
