// The mount's top: its directory, README, ctl, restore, metrics and
// report.html, and the three lists of checkpoints (checkpoints/, device/,
// archives/).
#include <algorithm>

#include "core/base/time_text.h"
#include "core/report/report_gather.h"
#include "core/report/report_html.h"
#include "fs/node_handler.h"

namespace gpuckpt {
namespace {

constexpr char kReadme[] =
    "gpuckptfs: checkpoints of processes as files.\n"
    "\n"
    "  <pid>/status                     the process, its GPUs, the operation in flight, the last "
    "result\n"
    "  <pid>/status.json                the same as JSON\n"
    "  echo checkpoint > <pid>/ctl      checkpoint it; it keeps running (blocks until done)\n"
    "  echo 'checkpoint --kill' > <pid>/ctl   checkpoint it, then stop it\n"
    "       options: --name NAME, --lock-timeout MS (how long the GPU driver may take\n"
    "       to stop the process's GPU work; past it the checkpoint fails, EAGAIN)\n"
    "  echo 'checkpoint --every 30m --keep-last 3' > <pid>/ctl   one now, then one every\n"
    "                                   30 minutes, keeping the newest 3 (--every off: stop)\n"
    "  <pid>/checkpoints/{1,2,...,latest}  its checkpoints\n"
    "  checkpoints/<id>/manifest.json   what a checkpoint is (JSON)\n"
    "  checkpoints/<id>/images/         CRIU's image files, read lazily from the store\n"
    "  checkpoints/<id>/container/      a container engine's files (an imported archive)\n"
    "  device/<id>/                     a GPU checkpoint's device state, read from its\n"
    "                                   images: the GPU memory CUDA moved to host memory\n"
    "                                   (cuda-*.bin, listed in cuda-ranges.json), AMD\n"
    "                                   plugin files; not part of a `cp -r` of the checkpoint\n"
    "  archives/<id>.tar                the checkpoint as a Podman/CRI-O checkpoint archive,\n"
    "                                   made from the store as it is read (takes no space):\n"
    "                                   podman container restore --import archives/<id>.tar\n"
    "  echo PATH > restore              restore a checkpoint: a directory here, a `cp -r` copy\n"
    "                                   of one, a CRIU image directory, or a container\n"
    "                                   checkpoint archive; `cat restore`: the new pid (and\n"
    "                                   the checkpoint a copy was imported as), or why it\n"
    "                                   failed\n"
    "       options: PATH --gpu-map OLD_UUID=NEW_UUID,...  restore onto other GPUs\n"
    "                PATH --root DIR    the root directory of a tree with its own mount\n"
    "                                   namespace (root only)\n"
    "  echo track PID > ctl             list a process that uses no GPU (naming <pid>/\n"
    "                                   shows it to its owner too)\n"
    "  echo 'import PATH [NAME]' > ctl  import an image directory or a container checkpoint\n"
    "                                   archive (tar, tar.gz, tar.zst) as a checkpoint\n"
    "  echo gc > ctl                    reclaim chunks of deleted checkpoints (root)\n"
    "  rm -r checkpoints/<id>           delete a checkpoint\n"
    "  metrics                          Prometheus text format\n"
    "  report.html                      a page of charts: your checkpoints over time, what\n"
    "                                   they hold of the store (root: all of them)\n"
    "\n"
    "A failed write says why in <pid>/status (or restore). `ls -l` shows logical\n"
    "sizes; `du` shows what each checkpoint added to the deduplicated store.\n";

constexpr char kCtlHelp[] = "commands: track PID | import PATH [NAME] | gc\n";

// Generated files carry the time of their content (the node_exporter
// textfile collector and other readers judge staleness by it): README and
// ctl's help never change while the daemon runs; `restore` changes with
// the caller's last result; metrics are of the moment they are read.
struct stat TimedFileStat(mode_t perms, uint64_t size, int64_t ns) {
  struct stat st = FileStat(perms, size);
  SetTime(&st, ns);
  return st;
}

class RootNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;

  Result<NodeId> Child(const NodeId&, const std::string& name, const Caller& caller) override {
    if (name == "README") return MakeNode(NodeKind::kReadme);
    if (name == "ctl") return MakeNode(NodeKind::kCtl);
    if (name == "restore") return MakeNode(NodeKind::kRestore);
    if (name == "metrics") return MakeNode(NodeKind::kMetrics);
    if (name == "report.html") return MakeNode(NodeKind::kReport);
    if (name == "checkpoints") return MakeNode(NodeKind::kCheckpointsDir);
    if (name == "device") return MakeNode(NodeKind::kDeviceDir);
    if (name == "archives") return MakeNode(NodeKind::kArchivesDir);
    int pid = 0;
    if (!ParseDecimal(name, &pid)) return NoEntry(name);
    // A process not shown (no GPU, not tracked) that the caller may
    // checkpoint is shown from the moment they name it, as `track` would:
    // naming it is asking for it.
    auto p = context_.Process(pid);
    Status tracked = Status::Ok();
    if (!p.ok()) {
      tracked = context_.engine->Track(pid, caller);
      if (tracked.ok()) p = context_.Process(pid);
    }
    // Someone else's process is as absent as in the listing: its pid,
    // owner and start time are theirs. Root, who may know, learns that
    // there is no such process (ESRCH).
    if (!p.ok() && caller.is_root() && tracked.code() == StatusCode::kNoSuchProcess) return tracked;
    if (!p.ok() || (!caller.is_root() && p->creds.ruid != caller.uid)) return NoEntry(name);
    return MakeNode(NodeKind::kPidDir, pid);
  }

  Result<NodeEntries> Children(const NodeId&, const Caller& caller) override {
    NodeEntries out;
    out.push_back({"README", MakeNode(NodeKind::kReadme)});
    out.push_back({"archives", MakeNode(NodeKind::kArchivesDir)});
    out.push_back({"checkpoints", MakeNode(NodeKind::kCheckpointsDir)});
    out.push_back({"ctl", MakeNode(NodeKind::kCtl)});
    out.push_back({"device", MakeNode(NodeKind::kDeviceDir)});
    out.push_back({"metrics", MakeNode(NodeKind::kMetrics)});
    out.push_back({"report.html", MakeNode(NodeKind::kReport)});
    out.push_back({"restore", MakeNode(NodeKind::kRestore)});
    GPUCKPT_ASSIGN_OR_RETURN(auto processes, context_.Processes());
    for (const auto& p : processes) {
      if (!caller.is_root() && p.creds.ruid != caller.uid) continue;
      out.push_back({std::to_string(p.pid), MakeNode(NodeKind::kPidDir, p.pid)});
    }
    return out;
  }

  Result<struct stat> Attributes(const NodeId&, const Caller&) override { return DirStat(0755); }
};

class ReadmeNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;
  Result<struct stat> Attributes(const NodeId&, const Caller&) override {
    return TimedFileStat(0444, sizeof(kReadme) - 1, context_.engine->started_ns());
  }
  Result<std::string> Content(const NodeId&, const Caller&) override {
    return std::string(kReadme);
  }
};

// Anyone may write a command to ctl and restore; the engine decides what
// the caller may do.
class CtlNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;
  Result<struct stat> Attributes(const NodeId&, const Caller& caller) override {
    return TimedFileStat(0666, 0, context_.engine->LastResultTime(ResultFile::kCtl, caller.uid));
  }
  // The caller's own last command and how it ended, then the commands.
  Result<std::string> Content(const NodeId&, const Caller& caller) override {
    return "last: " + context_.engine->LastResult(ResultFile::kCtl, caller.uid) + kCtlHelp;
  }
};

class RestoreNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;
  Result<struct stat> Attributes(const NodeId&, const Caller& caller) override {
    return TimedFileStat(0666, 0,
                         context_.engine->LastResultTime(ResultFile::kRestore, caller.uid));
  }
  Result<std::string> Content(const NodeId&, const Caller& caller) override {
    return context_.engine->LastResult(ResultFile::kRestore, caller.uid);
  }
};

class MetricsNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;
  Result<struct stat> Attributes(const NodeId&, const Caller&) override {
    return TimedFileStat(0444, 0, UnixNowNs());
  }
  Result<std::string> Content(const NodeId&, const Caller&) override {
    return context_.engine->MetricsText();
  }
};

// The report page of what the caller may see (the same rule as
// checkpoints/: their own checkpoints, root's all), made when it is read.
// Its name is everyone's, its contents each reader's: the content is taken
// at open, as the opener's (fs/filesystem.cc), never from a shared cache.
class ReportNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;
  Result<struct stat> Attributes(const NodeId&, const Caller&) override {
    return TimedFileStat(0444, 0, UnixNowNs());
  }
  Result<std::string> Content(const NodeId&, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto list, context_.trees->Snapshots());
    std::vector<SnapshotInfo> visible;
    for (SnapshotInfo& s : list)
      if (CheckpointTrees::MaySee(OwnerOf(s), caller)) visible.push_back(std::move(s));
    ReportScope scope;
    // An ordinary user learns nothing of the store as a whole, nor of
    // other owners: only what their own checkpoints are and hold.
    if (!caller.is_root()) scope.owner = caller.uid;
    GPUCKPT_ASSIGN_OR_RETURN(ReportData data,
                             GatherReport(*context_.store, visible, scope, UnixNowNs()));
    return RenderReportHtml(data);
  }
};

// checkpoints/, device/ and archives/: one entry per checkpoint the caller
// may see. Sticky and writable, like /tmp: the kernel lets each owner
// remove (rm -r) their own checkpoints and nobody else's, and passes an
// owner's rmdir of device/<id> or rm of archives/<id>.tar to us, to be
// refused as what it is (EROFS), not EACCES. Nothing can be created in them.
class CheckpointListNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;

  Result<NodeEntries> Children(const NodeId&, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto list, context_.trees->Snapshots());
    NodeEntries out;
    for (const auto& s : list) {
      if (!CheckpointTrees::MaySee(OwnerOf(s), caller)) continue;
      if (auto entry = EntryOf(s)) out.push_back(std::move(*entry));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  Result<struct stat> Attributes(const NodeId&, const Caller&) override { return DirStat(01777); }

 protected:
  // The list's entry for checkpoint `s`, if it has one.
  virtual std::optional<std::pair<std::string, NodeId>> EntryOf(const SnapshotInfo& s) = 0;
};

// checkpoints/ and device/: an entry <id> for each checkpoint the caller
// may see (device/: only those with device state).
class SnapshotDirsNode : public CheckpointListNode {
 public:
  // `device_view`: device/, else checkpoints/.
  SnapshotDirsNode(const NodeContext* context, bool device_view)
      : CheckpointListNode(context), device_view_(device_view) {}

  Result<NodeId> Child(const NodeId&, const std::string& name, const Caller& caller) override {
    // Someone else's checkpoint is as absent as in the listing.
    auto head = context_.trees->CurrentHead(name, caller, device_view_);
    if (!head.ok()) return NoEntry(name);
    return SnapshotNode(EntryKind(), name, head->info.key);
  }

 protected:
  std::optional<std::pair<std::string, NodeId>> EntryOf(const SnapshotInfo& s) override {
    // Decided from the manifests (HasDeviceState()): building every
    // checkpoint's device files would read all their pagemaps.
    if (device_view_ && !HasDeviceState(s)) return std::nullopt;
    return std::pair{s.id, SnapshotNode(EntryKind(), s.id, s.key)};
  }

 private:
  NodeKind EntryKind() const {
    return device_view_ ? NodeKind::kDeviceSnapshotDir : NodeKind::kSnapshotDir;
  }

  const bool device_view_;
};

class ArchivesDirNode : public CheckpointListNode {
 public:
  using CheckpointListNode::CheckpointListNode;

  Result<NodeId> Child(const NodeId&, const std::string& name, const Caller& caller) override {
    // As checkpoints/<id>.
    const auto id = ArchiveIdOf(name);
    if (!id) return NoEntry(name);
    auto tree = context_.trees->Current(*id);
    if (!tree.ok() || !CheckpointTrees::MaySee((*tree)->owner, caller)) return NoEntry(name);
    return SnapshotNode(NodeKind::kArchive, *id, (*tree)->info.key);
  }

 protected:
  std::optional<std::pair<std::string, NodeId>> EntryOf(const SnapshotInfo& s) override {
    return std::pair{ArchiveFileName(s.id), SnapshotNode(NodeKind::kArchive, s.id, s.key)};
  }
};

}  // namespace

void AddTopNodes(const NodeContext* context, NodeHandlers* handlers) {
  PutHandler<RootNode>(NodeKind::kRoot, context, handlers);
  PutHandler<ReadmeNode>(NodeKind::kReadme, context, handlers);
  PutHandler<CtlNode>(NodeKind::kCtl, context, handlers);
  PutHandler<RestoreNode>(NodeKind::kRestore, context, handlers);
  PutHandler<MetricsNode>(NodeKind::kMetrics, context, handlers);
  PutHandler<ReportNode>(NodeKind::kReport, context, handlers);
  PutHandler<SnapshotDirsNode>(NodeKind::kCheckpointsDir, context, handlers, /*device_view=*/false);
  PutHandler<SnapshotDirsNode>(NodeKind::kDeviceDir, context, handlers, /*device_view=*/true);
  PutHandler<ArchivesDirNode>(NodeKind::kArchivesDir, context, handlers);
}

}  // namespace gpuckpt
