#include "fs/store_view.h"

#include <unistd.h>

#include <cstring>

namespace gpuckpt {
namespace {

constexpr char kReadme[] =
    "gpuckptfs: checkpoints of processes as files.\n"
    "\n"
    "  checkpoints/<id>/manifest.json   what the checkpoint is (JSON)\n"
    "  checkpoints/<id>/images/         its files, read lazily from the store\n"
    "\n"
    "`ls -l` shows logical sizes; `du` shows what each file added to the\n"
    "deduplicated store. Copy a checkpoint out with `cp -r`.\n"
    "The store itself is managed with the `gpuckpt` command.\n";

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

}  // namespace

Result<std::vector<std::string>> StoreView::SnapshotIds() {
  {
    std::lock_guard lock(mu_);
    if (ids_read_ != std::chrono::steady_clock::time_point{} &&
        std::chrono::steady_clock::now() - ids_read_ < std::chrono::seconds(1)) {
      return ids_;
    }
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto list, store_->List());
  std::vector<std::string> ids;
  for (const auto& info : list) ids.push_back(info.id);
  std::sort(ids.begin(), ids.end());
  std::lock_guard lock(mu_);
  ids_ = ids;
  ids_read_ = std::chrono::steady_clock::now();
  return ids;
}

Result<std::shared_ptr<const StoreView::SnapshotTree>> StoreView::Tree(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    auto it = trees_.find(id);
    if (it != trees_.end()) return it->second;
  }
  auto tree = std::make_shared<SnapshotTree>();
  GPUCKPT_ASSIGN_OR_RETURN(tree->info, store_->Get(id));
  GPUCKPT_ASSIGN_OR_RETURN(auto files, store_->ListFiles(id));
  tree->children[""];
  for (auto& e : files) {
    const size_t slash = e.path.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : e.path.substr(0, slash);
    const std::string name = slash == std::string::npos ? e.path : e.path.substr(slash + 1);
    tree->children[dir].push_back(name);
    if (e.type == FileType::kDirectory) tree->children[e.path];
    tree->entries.emplace(e.path, std::move(e));
  }
  for (auto& [dir, names] : tree->children) std::sort(names.begin(), names.end());
  std::lock_guard lock(mu_);
  return trees_.emplace(id, std::move(tree)).first->second;
}

Result<NodeId> StoreView::Child(const NodeId& parent, const std::string& name) {
  auto not_found = [&] { return Status::NotFound("no entry '" + name + "'"); };
  switch (parent.kind) {
    case NodeKind::kRoot:
      if (name == "README") return NodeId{NodeKind::kReadme, "", ""};
      if (name == "checkpoints") return NodeId{NodeKind::kCheckpointsDir, "", ""};
      return not_found();
    case NodeKind::kCheckpointsDir: {
      auto tree = Tree(name);
      if (!tree.ok()) return not_found();
      return NodeId{NodeKind::kSnapshotDir, name, ""};
    }
    case NodeKind::kSnapshotDir:
      if (name == "manifest.json") return NodeId{NodeKind::kManifest, parent.snapshot, ""};
      if (name == "images") return NodeId{NodeKind::kImagesDir, parent.snapshot, ""};
      return not_found();
    case NodeKind::kImagesDir:
    case NodeKind::kImageEntry: {
      GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(parent.snapshot));
      const std::string path = parent.path.empty() ? name : parent.path + "/" + name;
      if (tree->entries.count(path) == 0) return not_found();
      return NodeId{NodeKind::kImageEntry, parent.snapshot, path};
    }
    default:
      return Status::InvalidArgument("not a directory");
  }
}

Result<std::vector<std::pair<std::string, NodeId>>> StoreView::Children(const NodeId& dir) {
  std::vector<std::pair<std::string, NodeId>> out;
  switch (dir.kind) {
    case NodeKind::kRoot:
      out.push_back({"README", NodeId{NodeKind::kReadme, "", ""}});
      out.push_back({"checkpoints", NodeId{NodeKind::kCheckpointsDir, "", ""}});
      return out;
    case NodeKind::kCheckpointsDir: {
      GPUCKPT_ASSIGN_OR_RETURN(auto ids, SnapshotIds());
      for (auto& id : ids) out.push_back({id, NodeId{NodeKind::kSnapshotDir, id, ""}});
      return out;
    }
    case NodeKind::kSnapshotDir:
      out.push_back({"images", NodeId{NodeKind::kImagesDir, dir.snapshot, ""}});
      out.push_back({"manifest.json", NodeId{NodeKind::kManifest, dir.snapshot, ""}});
      return out;
    case NodeKind::kImagesDir:
    case NodeKind::kImageEntry: {
      GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(dir.snapshot));
      auto it = tree->children.find(dir.path);
      if (it == tree->children.end()) return Status::InvalidArgument("not a directory");
      for (const auto& name : it->second) {
        const std::string path = dir.path.empty() ? name : dir.path + "/" + name;
        out.push_back({name, NodeId{NodeKind::kImageEntry, dir.snapshot, path}});
      }
      return out;
    }
    default:
      return Status::InvalidArgument("not a directory");
  }
}

Result<struct stat> StoreView::Attributes(const NodeId& node) {
  switch (node.kind) {
    case NodeKind::kRoot:
    case NodeKind::kCheckpointsDir:
      return DirStat(0755);
    case NodeKind::kReadme:
      return FileStat(0444, sizeof(kReadme) - 1);
    case NodeKind::kSnapshotDir:
    case NodeKind::kImagesDir: {
      // Images hold a process's whole memory: only the store's owner (root)
      // may enter, whatever the modes of the files inside.
      GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node.snapshot));
      struct stat st = DirStat(0700);
      SetTime(&st, tree->info.created_ns);
      return st;
    }
    case NodeKind::kManifest: {
      GPUCKPT_ASSIGN_OR_RETURN(auto content, GeneratedContent(node));
      GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node.snapshot));
      struct stat st = FileStat(0400, content.size());
      SetTime(&st, tree->info.created_ns);
      return st;
    }
    case NodeKind::kImageEntry: {
      GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node.snapshot));
      auto it = tree->entries.find(node.path);
      if (it == tree->entries.end()) return Status::NotFound("no entry '" + node.path + "'");
      const FileEntry& e = it->second;
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
          // du shows what this file added to the store, not its length.
          st.st_blocks = static_cast<blkcnt_t>((e.stored_bytes + 511) / 512);
          break;
      }
      st.st_uid = e.uid;
      st.st_gid = e.gid;
      SetTime(&st, e.mtime_ns);
      return st;
    }
  }
  return Status::Internal("unknown node kind");
}

Result<std::string> StoreView::GeneratedContent(const NodeId& node) {
  if (node.kind == NodeKind::kReadme) return std::string(kReadme);
  if (node.kind == NodeKind::kManifest) {
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node.snapshot));
    return SnapshotManifestJson(tree->info);
  }
  return Status::InvalidArgument("not a generated file");
}

Result<std::unique_ptr<FileReader>> StoreView::OpenImage(const NodeId& node) {
  if (node.kind != NodeKind::kImageEntry) return Status::InvalidArgument("not an image file");
  return store_->OpenFile(node.snapshot, node.path);
}

Result<std::string> StoreView::SymlinkTarget(const NodeId& node) {
  if (node.kind != NodeKind::kImageEntry) return Status::InvalidArgument("not a symlink");
  GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node.snapshot));
  auto it = tree->entries.find(node.path);
  if (it == tree->entries.end() || it->second.type != FileType::kSymlink) {
    return Status::InvalidArgument("not a symlink");
  }
  return it->second.symlink_target;
}

}  // namespace gpuckpt
