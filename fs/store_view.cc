#include "fs/store_view.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/base/log.h"
#include "core/base/time_text.h"

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
    "                                   checkpoint archive; `cat restore`: the new pid, or why\n"
    "                                   it failed\n"
    "       options: PATH --gpu-map OLD_UUID=NEW_UUID,...  restore onto other GPUs\n"
    "                PATH --root DIR    the root directory of a tree with its own mount\n"
    "                                   namespace (root only)\n"
    "  echo track PID > ctl             show a process that uses no GPU\n"
    "  echo 'import PATH [NAME]' > ctl  import an image directory or a container checkpoint\n"
    "                                   archive (tar, tar.gz, tar.zst) as a checkpoint\n"
    "  echo gc > ctl                    reclaim chunks of deleted checkpoints (root)\n"
    "  rm -r checkpoints/<id>           delete a checkpoint\n"
    "  metrics                          Prometheus text format\n"
    "\n"
    "A failed write says why in <pid>/status (or restore). `ls -l` shows logical\n"
    "sizes; `du` shows what each checkpoint added to the deduplicated store.\n";

constexpr char kCtlHelp[] = "commands: track PID | import PATH [NAME] | gc\n";
constexpr char kPidCtlHelp[] =
    "commands: checkpoint [--kill] [--name NAME] [--lock-timeout MS] [--no-space-check]\n";

NodeId MakeNode(NodeKind kind, std::string snapshot = "", std::string path = "", int pid = 0) {
  return NodeId{kind, std::move(snapshot), 0, std::move(path), pid};
}

// A node of the checkpoint `id` in its incarnation `key`.
NodeId SnapshotNode(NodeKind kind, const std::string& id, uint64_t key, std::string path = "") {
  return NodeId{kind, id, key, std::move(path), 0};
}

bool ParsePid(const std::string& name, int* pid) {
  if (name.empty() || name.size() > 9 || name[0] == '0') return false;
  for (char c : name)
    if (c < '0' || c > '9') return false;
  *pid = std::stoi(name);
  return true;
}

struct stat DirStat(mode_t perms) {
  struct stat st {};
  st.st_mode = S_IFDIR | perms;
  st.st_nlink = 2;
  return st;
}

struct stat FileStat(mode_t perms, uint64_t size) {
  struct stat st {};
  st.st_mode = S_IFREG | perms;
  st.st_nlink = 1;
  st.st_size = static_cast<off_t>(size);
  st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  return st;
}

void SetTime(struct stat* st, int64_t ns) {
  st->st_mtim.tv_sec = ns / 1000000000;
  st->st_mtim.tv_nsec = ns % 1000000000;
  st->st_ctim = st->st_mtim;
  st->st_atim = st->st_mtim;
}

Status NoEntry(const std::string& name) { return Status::NotFound("no entry '" + name + "'"); }

// A stored file, directory or symlink of a checkpoint, or a device file.
struct stat EntryStat(const FileEntry& e) {
  struct stat st {};
  switch (e.type) {
    case FileType::kDirectory:
      st = DirStat(e.mode);
      break;
    case FileType::kSymlink:
      st.st_mode = S_IFLNK | 0777;
      st.st_nlink = 1;
      st.st_size = static_cast<off_t>(e.symlink_target.size());
      break;
    case FileType::kRegular:
      st = FileStat(e.mode, e.size);
      // du shows what this file added to the store, not its length (0
      // for device files that are views of the images).
      st.st_blocks = static_cast<blkcnt_t>((e.stored_bytes + 511) / 512);
      break;
  }
  st.st_uid = e.uid;
  st.st_gid = e.gid;
  SetTime(&st, e.mtime_ns);
  return st;
}

}  // namespace

Result<std::vector<SnapshotInfo>> StoreView::Snapshots() {
  {
    MutexLock lock(&mu_);
    if (snapshots_read_ != std::chrono::steady_clock::time_point{} &&
        std::chrono::steady_clock::now() - snapshots_read_ < std::chrono::seconds(1)) {
      return snapshots_;
    }
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto list, store_->List());
  MutexLock lock(&mu_);
  snapshots_ = list;
  snapshots_read_ = std::chrono::steady_clock::now();
  return list;
}

void StoreView::Invalidate() {
  MutexLock lock(&mu_);
  snapshots_read_ = {};
}

Result<std::vector<std::string>> StoreView::CheckpointsOf(int pid) {
  // Only what the process's owner (or root) made for that owner: an import
  // claiming the pid of somebody else's job is not among them.
  GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo process, Process(pid));
  GPUCKPT_ASSIGN_OR_RETURN(auto list, Snapshots());
  std::vector<std::string> ids;
  for (const auto& s : list)
    if (IsCheckpointOfProcess(s, pid, process.creds.ruid)) ids.push_back(s.id);
  return ids;
}

Result<ProcessInfo> StoreView::Process(int pid) { return engine_->processes().Get(pid); }

void StoreView::AddToListing(std::vector<FileEntry> files, const SnapshotTree& tree,
                             Listing* listing) {
  listing->children[""];
  for (auto& e : files) {
    const size_t slash = e.path.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : e.path.substr(0, slash);
    const std::string name = slash == std::string::npos ? e.path : e.path.substr(slash + 1);
    listing->children[dir].push_back(name);
    if (e.type == FileType::kDirectory) listing->children[e.path];
    listing->entries.emplace(e.path, std::move(e));
  }
  // Parents that the snapshot holds no entry for (a writer may add files
  // only) are shown as private directories of the owner.
  std::vector<std::string> dirs;
  for (const auto& [dir, names] : listing->children) dirs.push_back(dir);
  for (const auto& dir : dirs) {
    for (std::string d = dir; !d.empty();) {
      if (listing->entries.count(d) == 0) {
        FileEntry e;
        e.path = d;
        e.type = FileType::kDirectory;
        e.mode = 0700;
        e.uid = tree.owner.uid;
        e.gid = tree.owner.gid;
        e.mtime_ns = tree.info.created_ns;
        listing->entries.emplace(d, e);
        const size_t slash = d.rfind('/');
        auto& siblings = listing->children[slash == std::string::npos ? "" : d.substr(0, slash)];
        const std::string base = slash == std::string::npos ? d : d.substr(slash + 1);
        if (std::find(siblings.begin(), siblings.end(), base) == siblings.end())
          siblings.push_back(base);
      }
      const size_t up = d.rfind('/');
      d = up == std::string::npos ? "" : d.substr(0, up);
    }
  }
  for (auto& [dir, names] : listing->children) std::sort(names.begin(), names.end());
}

void StoreView::BuildDeviceListing(const std::vector<FileEntry>& files, SnapshotTree* tree) {
  // An older import of a copy stored its device/: shown as stored (it was
  // the copy's, and may not be what the images give).
  std::vector<FileEntry> stored;
  for (const auto& e : files) {
    if (!IsStoredDevicePath(e.path) || e.path == "device") continue;
    FileEntry inside = e;
    inside.path = e.path.substr(sizeof("device/") - 1);
    stored.push_back(std::move(inside));
  }
  if (!stored.empty()) return AddToListing(std::move(stored), *tree, &tree->device);
  // Files that cannot be built (a damaged pagemap) are left out: device/<id>
  // stays, empty, and the images themselves stay readable.
  std::vector<FileEntry> views;
  if (auto device = BuildDeviceFiles(store_, tree->info, tree->owner, files); device.ok()) {
    for (auto& d : *device) {
      views.push_back(d->entry);
      tree->device_files.emplace(d->entry.path, std::move(d));
    }
  }
  AddToListing(std::move(views), *tree, &tree->device);
}

Result<std::shared_ptr<const StoreView::SnapshotTree>> StoreView::CurrentTree(
    const std::string& id) {
  // One point read: an id removed and reused since the tree was cached
  // has another key, and gets its own tree.
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store_->Get(id));
  {
    MutexLock lock(&mu_);
    auto it = trees_.find(id);
    if (it != trees_.end() && it->second->info.key == info.key) return it->second;
  }
  auto tree = std::make_shared<SnapshotTree>();
  tree->info = std::move(info);
  tree->owner = OwnerOf(tree->info);
  GPUCKPT_ASSIGN_OR_RETURN(auto files, store_->ListFiles(id));
  // The files are listed by id: had the id been removed and reused
  // meanwhile, they would be another incarnation's.
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo again, store_->Get(id));
  if (again.key != tree->info.key) return Status::NotFound("checkpoint " + id + " was replaced");
  // checkpoints/<id>/ holds what a restore needs; a stored device/ (an
  // older import of a copy) shows under device/<id>/ instead.
  std::vector<FileEntry> shown;
  for (const auto& e : files) {
    // The manifest is generated; a stored file of that name stays hidden.
    if (e.path == "manifest.json" || IsStoredDevicePath(e.path)) continue;
    shown.push_back(e);
  }
  AddToListing(std::move(shown), *tree, &tree->files);
  tree->has_device = HasDeviceState(tree->info);
  if (tree->has_device) BuildDeviceListing(files, tree.get());
  // From the listing alone (one libarchive call per member, no reads), so
  // that a stat of archives/<id>.tar is exact and cheap.
  auto archive = ArchiveLayout::Build(tree->info, tree->owner, files);
  if (archive.ok()) {
    tree->archive = std::move(*archive);
  } else {
    tree->archive_status = archive.status();
  }
  MutexLock lock(&mu_);
  // Two threads may build the same tree: the first one stays.
  auto& cached = trees_[id];
  if (cached == nullptr || cached->info.key != tree->info.key) cached = std::move(tree);
  return cached;
}

Result<StoreView::SnapshotHead> StoreView::CurrentHead(const std::string& id, const Caller& caller,
                                                       bool device_view) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store_->Get(id));
  SnapshotHead head{std::move(info), {}};
  head.owner = OwnerOf(head.info);
  // Absent rather than forbidden: EACCES would say that it exists.
  if (!Visible(head.owner, caller)) return Status::NotFound("no checkpoint " + id);
  if (device_view && !HasDeviceState(head.info))
    return Status::NotFound("checkpoint " + id + " has no device state");
  return head;
}

Result<StoreView::SnapshotHead> StoreView::VisibleHead(const NodeId& node, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotHead head,
                           CurrentHead(node.snapshot, caller, InDeviceView(node.kind)));
  if (head.info.key != node.key)
    return Status::NotFound("checkpoint " + node.snapshot + " was removed");
  return head;
}

Result<std::shared_ptr<const StoreView::SnapshotTree>> StoreView::Tree(const NodeId& node) {
  {
    MutexLock lock(&mu_);
    auto it = trees_.find(node.snapshot);
    if (it != trees_.end() && it->second->info.key == node.key) return it->second;
  }
  auto not_found = [&] { return Status::NotFound("checkpoint " + node.snapshot + " was removed"); };
  auto tree = CurrentTree(node.snapshot);
  if (!tree.ok()) {
    if (tree.status().code() == StatusCode::kNotFound) return not_found();
    return tree.status();
  }
  if ((*tree)->info.key != node.key) return not_found();
  return tree;
}

Result<std::shared_ptr<const StoreView::SnapshotTree>> StoreView::VisibleTree(
    const NodeId& node, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node));
  // Absent rather than forbidden: EACCES would say that it exists.
  if (!Visible(tree->owner, caller)) return Status::NotFound("no checkpoint " + node.snapshot);
  if (InDeviceView(node.kind) && !tree->has_device)
    return Status::NotFound("checkpoint " + node.snapshot + " has no device state");
  return tree;
}

Status StoreView::RemoveSnapshot(const NodeId& node, const Caller& caller) {
  if (node.kind != NodeKind::kSnapshotDir) return Status::InvalidArgument("not a checkpoint");
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, VisibleTree(node, caller));
  if (Status s = store_->Remove(node.snapshot); !s.ok()) {
    LogOperationEnd(s, "rm uid={} id={} result={} error={}", caller.uid, LogValue(node.snapshot),
                    ResultLabel(s.code()), LogValue(s.message()));
    return s;
  }
  // (Tests of the checkpoint tree alone run without an engine.)
  if (engine_ != nullptr) engine_->NoteStoreChanged();
  spdlog::info("rm uid={} id={} result=ok logical_bytes={} stored_bytes={}", caller.uid,
               LogValue(node.snapshot), tree->info.logical_bytes, tree->info.stored_bytes);
  MutexLock lock(&mu_);
  if (auto it = trees_.find(node.snapshot); it != trees_.end() && it->second == tree)
    trees_.erase(it);
  snapshots_read_ = {};
  return Status::Ok();
}

Result<NodeId> StoreView::Child(const NodeId& parent, const std::string& name,
                                const Caller& caller) {
  switch (parent.kind) {
    case NodeKind::kRoot:
      return RootChild(name, caller);
    case NodeKind::kCheckpointsDir:
    case NodeKind::kDeviceDir:
    case NodeKind::kArchivesDir:
      return CheckpointListChild(parent, name, caller);
    case NodeKind::kSnapshotDir:
    case NodeKind::kSnapshotEntry:
    case NodeKind::kDeviceSnapshotDir:
    case NodeKind::kDeviceEntry:
      return SnapshotChild(parent, name, caller);
    case NodeKind::kPidDir:
    case NodeKind::kPidCheckpoints:
      return ProcessChild(parent, name);
    default:
      return Status::InvalidArgument("not a directory");
  }
}

Result<NodeId> StoreView::RootChild(const std::string& name, const Caller& caller) {
  if (name == "README") return MakeNode(NodeKind::kReadme);
  if (name == "ctl") return MakeNode(NodeKind::kCtl);
  if (name == "restore") return MakeNode(NodeKind::kRestore);
  if (name == "metrics") return MakeNode(NodeKind::kMetrics);
  if (name == "checkpoints") return MakeNode(NodeKind::kCheckpointsDir);
  if (name == "device") return MakeNode(NodeKind::kDeviceDir);
  if (name == "archives") return MakeNode(NodeKind::kArchivesDir);
  int pid = 0;
  if (!ParsePid(name, &pid)) return NoEntry(name);
  // Someone else's process is as absent as in the listing: its pid,
  // owner and start time are theirs.
  auto p = Process(pid);
  if (!p.ok() || (!caller.is_root() && p->creds.ruid != caller.uid)) return NoEntry(name);
  return MakeNode(NodeKind::kPidDir, "", "", pid);
}

Result<NodeId> StoreView::CheckpointListChild(const NodeId& parent, const std::string& name,
                                              const Caller& caller) {
  switch (parent.kind) {
    case NodeKind::kCheckpointsDir: {
      // Someone else's checkpoint is as absent as in the listing.
      auto head = CurrentHead(name, caller, /*device_view=*/false);
      if (!head.ok()) return NoEntry(name);
      return SnapshotNode(NodeKind::kSnapshotDir, name, head->info.key);
    }
    case NodeKind::kDeviceDir: {
      // As checkpoints/<id>, and only where the checkpoint has device state.
      auto head = CurrentHead(name, caller, /*device_view=*/true);
      if (!head.ok()) return NoEntry(name);
      return SnapshotNode(NodeKind::kDeviceSnapshotDir, name, head->info.key);
    }
    case NodeKind::kArchivesDir: {
      // As checkpoints/<id>.
      const auto id = ArchiveIdOf(name);
      if (!id) return NoEntry(name);
      auto tree = CurrentTree(*id);
      if (!tree.ok() || !Visible((*tree)->owner, caller)) return NoEntry(name);
      return SnapshotNode(NodeKind::kArchive, *id, (*tree)->info.key);
    }
    default:
      return Status::InvalidArgument("not a directory");
  }
}

Result<NodeId> StoreView::SnapshotChild(const NodeId& parent, const std::string& name,
                                        const Caller& caller) {
  if (parent.kind == NodeKind::kSnapshotDir && name == "manifest.json") {
    GPUCKPT_RETURN_IF_ERROR(VisibleHead(parent, caller).status());
    return SnapshotNode(NodeKind::kManifest, parent.snapshot, parent.key);
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, VisibleTree(parent, caller));
  const std::string path = parent.path.empty() ? name : parent.path + "/" + name;
  if (ListingOf(*tree, parent).entries.count(path) == 0) return NoEntry(name);
  const NodeKind kind =
      InDeviceView(parent.kind) ? NodeKind::kDeviceEntry : NodeKind::kSnapshotEntry;
  return SnapshotNode(kind, parent.snapshot, parent.key, path);
}

Result<NodeId> StoreView::ProcessChild(const NodeId& parent, const std::string& name) {
  if (parent.kind == NodeKind::kPidDir) {
    if (name == "ctl") return MakeNode(NodeKind::kPidCtl, "", "", parent.pid);
    if (name == "status") return MakeNode(NodeKind::kPidStatus, "", "", parent.pid);
    if (name == "status.json") return MakeNode(NodeKind::kPidStatusJson, "", "", parent.pid);
    if (name == "checkpoints") return MakeNode(NodeKind::kPidCheckpoints, "", "", parent.pid);
    return NoEntry(name);
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto ids, CheckpointsOf(parent.pid));
  int n = 0;
  if ((name == "latest" && !ids.empty()) ||
      (ParsePid(name, &n) && static_cast<size_t>(n) <= ids.size()))
    return MakeNode(NodeKind::kPidCheckpointLink, "", name, parent.pid);
  return NoEntry(name);
}

Result<StoreView::Entries> StoreView::Children(const NodeId& dir, const Caller& caller) {
  switch (dir.kind) {
    case NodeKind::kRoot:
      return RootChildren(caller);
    case NodeKind::kCheckpointsDir:
    case NodeKind::kDeviceDir:
    case NodeKind::kArchivesDir:
      return CheckpointListChildren(dir, caller);
    case NodeKind::kSnapshotDir:
    case NodeKind::kSnapshotEntry:
    case NodeKind::kDeviceSnapshotDir:
    case NodeKind::kDeviceEntry:
      return SnapshotChildren(dir, caller);
    case NodeKind::kPidDir:
    case NodeKind::kPidCheckpoints:
      return ProcessChildren(dir);
    default:
      return Status::InvalidArgument("not a directory");
  }
}

Result<StoreView::Entries> StoreView::RootChildren(const Caller& caller) {
  Entries out;
  out.push_back({"README", MakeNode(NodeKind::kReadme)});
  out.push_back({"archives", MakeNode(NodeKind::kArchivesDir)});
  out.push_back({"checkpoints", MakeNode(NodeKind::kCheckpointsDir)});
  out.push_back({"ctl", MakeNode(NodeKind::kCtl)});
  out.push_back({"device", MakeNode(NodeKind::kDeviceDir)});
  out.push_back({"metrics", MakeNode(NodeKind::kMetrics)});
  out.push_back({"restore", MakeNode(NodeKind::kRestore)});
  GPUCKPT_ASSIGN_OR_RETURN(auto processes, engine_->processes().List());
  for (const auto& p : processes) {
    if (!caller.is_root() && p.creds.ruid != caller.uid) continue;
    out.push_back({std::to_string(p.pid), MakeNode(NodeKind::kPidDir, "", "", p.pid)});
  }
  return out;
}

Result<StoreView::Entries> StoreView::CheckpointListChildren(const NodeId& dir,
                                                             const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(auto list, Snapshots());
  Entries out;
  for (auto& s : list) {
    if (!Visible(OwnerOf(s), caller)) continue;
    if (dir.kind == NodeKind::kCheckpointsDir) {
      out.push_back({s.id, SnapshotNode(NodeKind::kSnapshotDir, s.id, s.key)});
    } else if (dir.kind == NodeKind::kDeviceDir) {
      // Decided from the manifests (HasDeviceState()): building every
      // checkpoint's device files would read all their pagemaps.
      if (HasDeviceState(s))
        out.push_back({s.id, SnapshotNode(NodeKind::kDeviceSnapshotDir, s.id, s.key)});
    } else {
      out.push_back({ArchiveFileName(s.id), SnapshotNode(NodeKind::kArchive, s.id, s.key)});
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<StoreView::Entries> StoreView::SnapshotChildren(const NodeId& dir, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, VisibleTree(dir, caller));
  Entries out;
  if (dir.kind == NodeKind::kSnapshotDir)
    out.push_back({"manifest.json", SnapshotNode(NodeKind::kManifest, dir.snapshot, dir.key)});
  const Listing& listing = ListingOf(*tree, dir);
  auto it = listing.children.find(dir.path);
  if (it == listing.children.end()) return Status::InvalidArgument("not a directory");
  const NodeKind kind = InDeviceView(dir.kind) ? NodeKind::kDeviceEntry : NodeKind::kSnapshotEntry;
  for (const auto& name : it->second) {
    const std::string path = dir.path.empty() ? name : dir.path + "/" + name;
    out.push_back({name, SnapshotNode(kind, dir.snapshot, dir.key, path)});
  }
  return out;
}

Result<StoreView::Entries> StoreView::ProcessChildren(const NodeId& dir) {
  Entries out;
  if (dir.kind == NodeKind::kPidDir) {
    out.push_back({"checkpoints", MakeNode(NodeKind::kPidCheckpoints, "", "", dir.pid)});
    out.push_back({"ctl", MakeNode(NodeKind::kPidCtl, "", "", dir.pid)});
    out.push_back({"status", MakeNode(NodeKind::kPidStatus, "", "", dir.pid)});
    out.push_back({"status.json", MakeNode(NodeKind::kPidStatusJson, "", "", dir.pid)});
    return out;
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto ids, CheckpointsOf(dir.pid));
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string name = std::to_string(i + 1);
    out.push_back({name, MakeNode(NodeKind::kPidCheckpointLink, "", name, dir.pid)});
  }
  if (!ids.empty())
    out.push_back({"latest", MakeNode(NodeKind::kPidCheckpointLink, "", "latest", dir.pid)});
  return out;
}

Result<struct stat> StoreView::Attributes(const NodeId& node, const Caller& caller) {
  switch (node.kind) {
    case NodeKind::kRoot:
    case NodeKind::kCheckpointsDir:
    case NodeKind::kDeviceDir:
    case NodeKind::kArchivesDir:
    case NodeKind::kReadme:
    case NodeKind::kMetrics:
    case NodeKind::kCtl:
    case NodeKind::kRestore:
      return TopLevelAttributes(node, caller);
    case NodeKind::kSnapshotDir:
    case NodeKind::kDeviceSnapshotDir:
    case NodeKind::kManifest:
    case NodeKind::kArchive:
    case NodeKind::kSnapshotEntry:
    case NodeKind::kDeviceEntry:
      return CheckpointAttributes(node, caller);
    case NodeKind::kPidDir:
    case NodeKind::kPidCtl:
    case NodeKind::kPidStatus:
    case NodeKind::kPidStatusJson:
    case NodeKind::kPidCheckpoints:
    case NodeKind::kPidCheckpointLink:
      return ProcessAttributes(node, caller);
  }
  return Status::Internal("unknown node kind");
}

Result<struct stat> StoreView::TopLevelAttributes(const NodeId& node, const Caller& caller) {
  switch (node.kind) {
    case NodeKind::kRoot:
      return DirStat(0755);
    case NodeKind::kCheckpointsDir:
      // Sticky and writable, like /tmp: the kernel lets each owner remove
      // (rm -r) their own checkpoints and nobody else's. Nothing can be
      // created in it.
      return DirStat(01777);
    case NodeKind::kDeviceDir:
      // As checkpoints/, so that the kernel passes an owner's rmdir of
      // device/<id> to us, to be refused as what it is (EROFS), not EACCES.
      return DirStat(01777);
    case NodeKind::kArchivesDir:
      // As device/: an owner's rm of archives/<id>.tar reaches us, and is
      // refused as what it is (EROFS).
      return DirStat(01777);
    // Generated files carry the time of their content (the node_exporter
    // textfile collector and other readers judge staleness by it):
    // README and ctl's help never change while the daemon runs; `restore`
    // changes with the caller's last result; metrics are of the moment
    // they are read.
    case NodeKind::kReadme: {
      struct stat st = FileStat(0444, sizeof(kReadme) - 1);
      SetTime(&st, engine_->started_ns());
      return st;
    }
    case NodeKind::kMetrics: {
      struct stat st = FileStat(0444, 0);
      SetTime(&st, UnixNowNs());
      return st;
    }
    case NodeKind::kCtl:
    case NodeKind::kRestore: {
      // Anyone may write a command; the engine decides what the caller may do.
      struct stat st = FileStat(0666, 0);
      SetTime(&st, node.kind == NodeKind::kRestore ? engine_->RestoreResultTime(caller.uid)
                                                   : engine_->started_ns());
      return st;
    }
    default:
      return Status::Internal("unknown node kind");
  }
}

Result<struct stat> StoreView::CheckpointAttributes(const NodeId& node, const Caller& caller) {
  switch (node.kind) {
    case NodeKind::kSnapshotDir:
    case NodeKind::kDeviceSnapshotDir: {
      GPUCKPT_ASSIGN_OR_RETURN(SnapshotHead head, VisibleHead(node, caller));
      // Images hold a process's whole memory: only its owner and root.
      struct stat st = DirStat(0700);
      st.st_uid = head.owner.uid;
      st.st_gid = head.owner.gid;
      SetTime(&st, head.info.created_ns);
      return st;
    }
    case NodeKind::kManifest: {
      GPUCKPT_ASSIGN_OR_RETURN(SnapshotHead head, VisibleHead(node, caller));
      struct stat st = FileStat(0400, SnapshotManifestJson(head.info).size());
      st.st_uid = head.owner.uid;
      st.st_gid = head.owner.gid;
      SetTime(&st, head.info.created_ns);
      return st;
    }
    default:
      break;
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, VisibleTree(node, caller));
  switch (node.kind) {
    case NodeKind::kArchive: {
      if (tree->archive == nullptr) return tree->archive_status;
      const FileEntry& file = tree->archive->file();
      // Read-only and the owner's alone, like manifest.json.
      struct stat st = FileStat(file.mode, file.size);
      // A view: its bytes are the checkpoint's, which du counts already.
      st.st_blocks = 0;
      st.st_uid = file.uid;
      st.st_gid = file.gid;
      SetTime(&st, file.mtime_ns);
      return st;
    }
    default: {
      const Listing& listing = ListingOf(*tree, node);
      auto it = listing.entries.find(node.path);
      if (it == listing.entries.end()) return Status::NotFound("no entry '" + node.path + "'");
      return EntryStat(it->second);
    }
  }
}

Result<struct stat> StoreView::ProcessAttributes(const NodeId& node, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo p, Process(node.pid));
  if (!caller.is_root() && p.creds.ruid != caller.uid)
    return Status::NotFound("no process " + std::to_string(node.pid));
  struct stat st {};
  if (node.kind == NodeKind::kPidDir) st = DirStat(0700);
  if (node.kind == NodeKind::kPidCheckpoints) st = DirStat(0500);
  if (node.kind == NodeKind::kPidCtl) st = FileStat(0600, 0);
  if (node.kind == NodeKind::kPidStatus || node.kind == NodeKind::kPidStatusJson)
    st = FileStat(0400, 0);
  if (node.kind == NodeKind::kPidCheckpointLink) {
    GPUCKPT_ASSIGN_OR_RETURN(std::string target, SymlinkTarget(node));
    st.st_mode = S_IFLNK | 0777;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(target.size());
  }
  st.st_uid = p.creds.ruid;
  st.st_gid = p.creds.rgid;
  // A process's files are of the moment they are read (its state,
  // memory, the operation in flight).
  SetTime(&st, UnixNowNs());
  return st;
}

Result<std::string> StoreView::GeneratedContent(const NodeId& node, const Caller& caller) {
  switch (node.kind) {
    case NodeKind::kReadme:
      return std::string(kReadme);
    case NodeKind::kCtl:
      return std::string(kCtlHelp);
    case NodeKind::kPidCtl:
      return std::string(kPidCtlHelp);
    case NodeKind::kRestore:
      return engine_->RestoreResult(caller.uid);
    case NodeKind::kMetrics:
      return engine_->MetricsText();
    case NodeKind::kManifest: {
      GPUCKPT_ASSIGN_OR_RETURN(SnapshotHead head, VisibleHead(node, caller));
      return SnapshotManifestJson(head.info);
    }
    case NodeKind::kPidStatus: {
      GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo p, Process(node.pid));
      std::string text = engine_->ProcessStatus(p);
      auto ids = CheckpointsOf(node.pid);
      if (ids.ok())
        text += "checkpoints: " + std::to_string(ids->size()) +
                (ids->empty() ? "" : " (latest " + ids->back() + ")") + "\n";
      return text;
    }
    case NodeKind::kPidStatusJson: {
      GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo p, Process(node.pid));
      nlohmann::json j = engine_->ProcessStatusJson(p);
      auto ids = CheckpointsOf(node.pid);
      if (ids.ok())
        j["checkpoints"] = {
            {"count", ids->size()},
            {"latest", ids->empty() ? nlohmann::json() : nlohmann::json(ids->back())}};
      return j.dump(2) + "\n";
    }
    default:
      return Status::InvalidArgument("not a generated file");
  }
}

Result<std::unique_ptr<FileReader>> StoreView::OpenImage(const NodeId& node) {
  if (!IsSnapshotFile(node.kind)) return Status::InvalidArgument("not an image file");
  // Of this incarnation (Tree() checks its key), through its own listing:
  // the store reads that one file record, and only of that incarnation, so
  // an id removed and made again meanwhile is never read in its place.
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node));
  if (node.kind == NodeKind::kArchive) {
    if (tree->archive == nullptr) return tree->archive_status;
    return OpenArchive(store_, tree->archive);
  }
  if (InDeviceView(node.kind)) {
    if (auto it = tree->device_files.find(node.path); it != tree->device_files.end())
      return OpenDeviceFile(store_, node.snapshot, node.key, it->second);
  }
  const Listing& listing = ListingOf(*tree, node);
  auto it = listing.entries.find(node.path);
  if (it == listing.entries.end())
    return Status::NotFound("no file '" + node.path + "' in checkpoint " + node.snapshot);
  FileEntry stored = it->second;
  // A file of the device/ an older import stored, listed without it.
  if (InDeviceView(node.kind)) stored.path = "device/" + stored.path;
  return store_->OpenListedFile(node.snapshot, node.key, stored);
}

Result<std::string> StoreView::SymlinkTarget(const NodeId& node) {
  if (node.kind == NodeKind::kPidCheckpointLink) {
    GPUCKPT_ASSIGN_OR_RETURN(auto ids, CheckpointsOf(node.pid));
    if (ids.empty()) return Status::NotFound("no checkpoint");
    if (node.path == "latest") return "../../checkpoints/" + ids.back();
    const size_t n = std::stoul(node.path);
    if (n < 1 || n > ids.size()) return Status::NotFound("no checkpoint " + node.path);
    return "../../checkpoints/" + ids[n - 1];
  }
  if (!IsSnapshotFile(node.kind) || node.kind == NodeKind::kArchive)
    return Status::InvalidArgument("not a symlink");
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node));
  const Listing& listing = ListingOf(*tree, node);
  auto it = listing.entries.find(node.path);
  if (it == listing.entries.end() || it->second.type != FileType::kSymlink) {
    return Status::InvalidArgument("not a symlink");
  }
  return it->second.symlink_target;
}

}  // namespace gpuckpt
