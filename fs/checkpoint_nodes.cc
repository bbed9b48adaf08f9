// A checkpoint's nodes: checkpoints/<id>/ with its manifest.json and
// stored files, device/<id>/ with its files, and archives/<id>.tar.
// checkpoints/<id> and device/<id> are shown from the manifest alone
// (CheckpointTrees::Head); whatever lists or opens their files builds
// the checkpoint's tree.
#include "fs/node_handler.h"

namespace gpuckpt {
namespace {

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

// What checkpoints/<id>/ and device/<id>/ and the directories and files
// below them share: their children are their listing's.
class ListedNode : public NodeHandler {
 public:
  // `device_view`: of device/<id>/, else of checkpoints/<id>/.
  ListedNode(const NodeContext* context, bool device_view)
      : NodeHandler(context), device_view_(device_view) {}

  Result<NodeId> Child(const NodeId& dir, const std::string& name, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, VisibleTree(dir, caller));
    const std::string path = dir.path.empty() ? name : dir.path + "/" + name;
    if (tree->listing(device_view_).entries.count(path) == 0) return NoEntry(name);
    return SnapshotNode(EntryKind(), dir.snapshot, dir.key, path);
  }

  Result<NodeEntries> Children(const NodeId& dir, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, VisibleTree(dir, caller));
    const auto& children = tree->listing(device_view_).children;
    auto it = children.find(dir.path);
    if (it == children.end()) return Status::InvalidArgument("not a directory");
    NodeEntries out;
    for (const auto& name : it->second) {
      const std::string path = dir.path.empty() ? name : dir.path + "/" + name;
      out.push_back({name, SnapshotNode(EntryKind(), dir.snapshot, dir.key, path)});
    }
    return out;
  }

 protected:
  NodeKind EntryKind() const {
    return device_view_ ? NodeKind::kDeviceEntry : NodeKind::kSnapshotEntry;
  }
  Result<std::shared_ptr<const CheckpointTrees::Tree>> VisibleTree(const NodeId& node,
                                                                   const Caller& caller) {
    return context_.trees->Visible(node.snapshot, node.key, caller, device_view_);
  }
  // The incarnation `node` belongs to, whoever asks: opens and symlinks
  // follow a lookup, which checked the caller.
  Result<std::shared_ptr<const CheckpointTrees::Tree>> Tree(const NodeId& node) {
    return context_.trees->Incarnation(node.snapshot, node.key);
  }

  const bool device_view_;
};

// checkpoints/<id> and device/<id>.
class SnapshotDirNode : public ListedNode {
 public:
  using ListedNode::ListedNode;

  Result<NodeId> Child(const NodeId& dir, const std::string& name, const Caller& caller) override {
    if (!device_view_ && name == "manifest.json") {
      GPUCKPT_RETURN_IF_ERROR(
          context_.trees->VisibleHead(dir.snapshot, dir.key, caller, device_view_).status());
      return SnapshotNode(NodeKind::kManifest, dir.snapshot, dir.key);
    }
    return ListedNode::Child(dir, name, caller);
  }

  Result<NodeEntries> Children(const NodeId& dir, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(NodeEntries listed, ListedNode::Children(dir, caller));
    if (device_view_) return listed;
    NodeEntries out{{"manifest.json", SnapshotNode(NodeKind::kManifest, dir.snapshot, dir.key)}};
    out.insert(out.end(), listed.begin(), listed.end());
    return out;
  }

  Result<struct stat> Attributes(const NodeId& node, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(
        auto head, context_.trees->VisibleHead(node.snapshot, node.key, caller, device_view_));
    // Images hold a process's whole memory: only its owner and root.
    struct stat st = DirStat(0700);
    st.st_uid = head.owner.uid;
    st.st_gid = head.owner.gid;
    SetTime(&st, head.info.created_ns);
    return st;
  }
};

// A stored directory, file or symlink below checkpoints/<id>/, or a
// device file below device/<id>/.
class EntryNode : public ListedNode {
 public:
  using ListedNode::ListedNode;

  Result<struct stat> Attributes(const NodeId& node, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, VisibleTree(node, caller));
    const auto& entries = tree->listing(device_view_).entries;
    auto it = entries.find(node.path);
    if (it == entries.end()) return Status::NotFound("no entry '" + node.path + "'");
    return EntryStat(it->second);
  }

  Result<std::unique_ptr<FileReader>> Open(const NodeId& node) override {
    // Of this incarnation, through its own listing: the store reads that
    // one file record, and only of that incarnation, so an id removed and
    // made again meanwhile is never read in its place.
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node));
    if (device_view_) {
      if (auto it = tree->device_files.find(node.path); it != tree->device_files.end())
        return OpenDeviceFile(context_.store, node.snapshot, node.key, it->second);
    }
    const auto& entries = tree->listing(device_view_).entries;
    auto it = entries.find(node.path);
    if (it == entries.end())
      return Status::NotFound("no file '" + node.path + "' in checkpoint " + node.snapshot);
    FileEntry stored = it->second;
    // A file of the device/ an older import stored, listed without it.
    if (device_view_) stored.path = "device/" + stored.path;
    return context_.store->OpenListedFile(node.snapshot, node.key, stored);
  }

  Result<std::string> Target(const NodeId& node) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, Tree(node));
    const auto& entries = tree->listing(device_view_).entries;
    auto it = entries.find(node.path);
    if (it == entries.end() || it->second.type != FileType::kSymlink)
      return Status::InvalidArgument("not a symlink");
    return it->second.symlink_target;
  }
};

// checkpoints/<id>/manifest.json, generated from the snapshot's record.
class ManifestNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;

  Result<struct stat> Attributes(const NodeId& node, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto head, Head(node, caller));
    struct stat st = FileStat(0400, SnapshotManifestJson(head.info).size());
    st.st_uid = head.owner.uid;
    st.st_gid = head.owner.gid;
    SetTime(&st, head.info.created_ns);
    return st;
  }

  Result<std::string> Content(const NodeId& node, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto head, Head(node, caller));
    return SnapshotManifestJson(head.info);
  }

 private:
  Result<CheckpointTrees::Head> Head(const NodeId& node, const Caller& caller) {
    return context_.trees->VisibleHead(node.snapshot, node.key, caller, /*device_view=*/false);
  }
};

// archives/<id>.tar: the checkpoint as one tar, made on reads.
class ArchiveNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;

  Result<struct stat> Attributes(const NodeId& node, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, context_.trees->Visible(node.snapshot, node.key, caller,
                                                                /*device_view=*/false));
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

  Result<std::unique_ptr<FileReader>> Open(const NodeId& node) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto tree, context_.trees->Incarnation(node.snapshot, node.key));
    if (tree->archive == nullptr) return tree->archive_status;
    return OpenArchive(context_.store, tree->archive);
  }
};

}  // namespace

void AddCheckpointNodes(const NodeContext* context, NodeHandlers* handlers) {
  PutHandler<SnapshotDirNode>(NodeKind::kSnapshotDir, context, handlers, /*device_view=*/false);
  PutHandler<EntryNode>(NodeKind::kSnapshotEntry, context, handlers, /*device_view=*/false);
  PutHandler<SnapshotDirNode>(NodeKind::kDeviceSnapshotDir, context, handlers,
                              /*device_view=*/true);
  PutHandler<EntryNode>(NodeKind::kDeviceEntry, context, handlers, /*device_view=*/true);
  PutHandler<ManifestNode>(NodeKind::kManifest, context, handlers);
  PutHandler<ArchiveNode>(NodeKind::kArchive, context, handlers);
}

}  // namespace gpuckpt
