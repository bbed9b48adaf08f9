#include "fs/checkpoint_trees.h"

#include <algorithm>

#include "core/base/log.h"

namespace gpuckpt {

Result<std::vector<SnapshotInfo>> CheckpointTrees::Snapshots() {
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

void CheckpointTrees::Invalidate() {
  MutexLock lock(&mu_);
  snapshots_read_ = {};
}

void CheckpointTrees::AddToListing(std::vector<FileEntry> files, const Tree& tree,
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

void CheckpointTrees::BuildDeviceListing(const std::vector<FileEntry>& files, Tree* tree) {
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

Result<std::shared_ptr<CheckpointTrees::Tree>> CheckpointTrees::Build(SnapshotInfo info) {
  auto tree = std::make_shared<Tree>();
  tree->info = std::move(info);
  tree->owner = OwnerOf(tree->info);
  const std::string& id = tree->info.id;
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
  return tree;
}

Result<std::shared_ptr<const CheckpointTrees::Tree>> CheckpointTrees::Current(
    const std::string& id) {
  // One point read: an id removed and reused since the tree was cached
  // has another key, and gets its own tree.
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store_->Get(id));
  {
    MutexLock lock(&mu_);
    auto it = trees_.find(id);
    if (it != trees_.end() && it->second->info.key == info.key) return it->second;
  }
  GPUCKPT_ASSIGN_OR_RETURN(std::shared_ptr<Tree> tree, Build(std::move(info)));
  MutexLock lock(&mu_);
  // Two threads may build the same tree: the first one stays.
  auto& cached = trees_[id];
  if (cached == nullptr || cached->info.key != tree->info.key) cached = std::move(tree);
  return cached;
}

Result<std::shared_ptr<const CheckpointTrees::Tree>> CheckpointTrees::Incarnation(
    const std::string& id, uint64_t key) {
  {
    MutexLock lock(&mu_);
    auto it = trees_.find(id);
    if (it != trees_.end() && it->second->info.key == key) return it->second;
  }
  auto removed = [&] { return Status::NotFound("checkpoint " + id + " was removed"); };
  auto tree = Current(id);
  if (!tree.ok()) {
    if (tree.status().code() == StatusCode::kNotFound) return removed();
    return tree.status();
  }
  if ((*tree)->info.key != key) return removed();
  return tree;
}

Result<std::shared_ptr<const CheckpointTrees::Tree>> CheckpointTrees::Visible(const std::string& id,
                                                                              uint64_t key,
                                                                              const Caller& caller,
                                                                              bool device_view) {
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, Incarnation(id, key));
  // Absent rather than forbidden: EACCES would say that it exists.
  if (!MaySee(tree->owner, caller)) return Status::NotFound("no checkpoint " + id);
  if (device_view && !tree->has_device)
    return Status::NotFound("checkpoint " + id + " has no device state");
  return tree;
}

Result<CheckpointTrees::Head> CheckpointTrees::CurrentHead(const std::string& id,
                                                           const Caller& caller, bool device_view) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store_->Get(id));
  Head head{std::move(info), {}};
  head.owner = OwnerOf(head.info);
  // Absent rather than forbidden: EACCES would say that it exists.
  if (!MaySee(head.owner, caller)) return Status::NotFound("no checkpoint " + id);
  if (device_view && !HasDeviceState(head.info))
    return Status::NotFound("checkpoint " + id + " has no device state");
  return head;
}

Result<CheckpointTrees::Head> CheckpointTrees::VisibleHead(const std::string& id, uint64_t key,
                                                           const Caller& caller, bool device_view) {
  GPUCKPT_ASSIGN_OR_RETURN(Head head, CurrentHead(id, caller, device_view));
  if (head.info.key != key) return Status::NotFound("checkpoint " + id + " was removed");
  return head;
}

Result<std::shared_ptr<const CheckpointTrees::Tree>> CheckpointTrees::Remove(const std::string& id,
                                                                             uint64_t key,
                                                                             const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, Visible(id, key, caller, /*device_view=*/false));
  if (Status s = store_->Remove(id); !s.ok()) {
    LogOperationEnd(s, "rm uid={} id={} result={} error={}", caller.uid, LogValue(id),
                    ResultLabel(s.code()), LogValue(s.message()));
    return s;
  }
  spdlog::info("rm uid={} id={} result=ok logical_bytes={} stored_bytes={}", caller.uid,
               LogValue(id), tree->info.logical_bytes, tree->info.stored_bytes);
  MutexLock lock(&mu_);
  if (auto it = trees_.find(id); it != trees_.end() && it->second == tree) trees_.erase(it);
  snapshots_read_ = {};
  return tree;
}

}  // namespace gpuckpt
