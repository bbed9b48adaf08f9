// StoreView: the tree gpuckptfs shows (README.md, "gpuckptfs"), as plain data the
// FUSE layer can serve: which nodes exist for whom, their attributes, their
// children, and the bytes of generated files. No FUSE types here.
//
//   /README /ctl /restore /metrics       help, global commands, restore, metrics
//   /checkpoints/<id>/manifest.json      the manifest (JSON)
//   /checkpoints/<id>/images/...         the snapshot's files, read lazily
//   /checkpoints/<id>/device/...         device state (fs/device_view.h)
//   /<pid>/{ctl,status}                  one directory per process shown
//   /<pid>/checkpoints/{1,2,..,latest}   symlinks to ../../checkpoints/<id>
//
// Who sees what: a process's directory and a checkpoint belong to the
// process's owner (dirs 0700, files 0600; the kernel enforces the modes,
// default_permissions), and listings show a caller only their own (root
// all). A checkpoint of someone else, and everything below it, is also
// absent (kNotFound) to the caller's lookups and attributes, so that
// neither its owner nor its time shows. Control files are writable by
// anyone; the engine checks each request against the caller.
//
// Node identities are (kind, snapshot id and key, path, pid) and stable
// for the life of the process. The key (SnapshotInfo::key, never reused)
// tells incarnations of a reused id apart: a node of a removed checkpoint
// stays kNotFound even once a new checkpoint has the same id. Snapshot
// listings are cached (snapshots never change once published); the list
// of snapshots is re-read at most once a second, and at once after a
// change made through the mount; a lookup of checkpoints/<id> asks the
// store which incarnation is current.
//
// Thread-safe. Borrows the Store and the Engine, which must outlive it.
#ifndef GPUCKPT_FS_STORE_VIEW_H_
#define GPUCKPT_FS_STORE_VIEW_H_

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "fs/device_view.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

enum class NodeKind {
  kRoot,
  kReadme,
  kCtl,                // global commands
  kRestore,            // write a path; read the caller's last result
  kMetrics,            // Prometheus text
  kCheckpointsDir,     // checkpoints/
  kSnapshotDir,        // checkpoints/<id>
  kManifest,           // checkpoints/<id>/manifest.json
  kSnapshotEntry,      // checkpoints/<id>/<path> (images/..., device/...)
  kPidDir,             // <pid>
  kPidCtl,             // <pid>/ctl
  kPidStatus,          // <pid>/status
  kPidCheckpoints,     // <pid>/checkpoints
  kPidCheckpointLink,  // <pid>/checkpoints/<n|latest>
};

struct NodeId {
  NodeKind kind = NodeKind::kRoot;
  std::string snapshot;  // snapshot nodes: the id
  uint64_t key = 0;      // snapshot nodes: SnapshotInfo::key, the incarnation of the id
  std::string path;      // snapshot entries: path inside; pid links: the link name
  int pid = 0;           // process nodes
  auto operator<=>(const NodeId&) const = default;
};

class StoreView {
 public:
  StoreView(Store* store, Engine* engine) : store_(store), engine_(engine) {}

  // The child `name` of `parent`, or kNotFound (also where `caller` may
  // not see it).
  Result<NodeId> Child(const NodeId& parent, const std::string& name, const Caller& caller);
  // Names and ids of a directory's children as `caller` may list them, sorted.
  Result<std::vector<std::pair<std::string, NodeId>>> Children(const NodeId& dir,
                                                               const Caller& caller);
  // Attributes as `caller` may see them: kNotFound for a removed
  // checkpoint's nodes, and for someone else's checkpoint. st_ino is left 0
  // for the caller to fill.
  Result<struct stat> Attributes(const NodeId& node, const Caller& caller);
  // Attributes as root sees them (for tests; the FUSE layer always asks as
  // the caller).
  Result<struct stat> Attributes(const NodeId& node) { return Attributes(node, Caller{}); }
  // Contents of generated files (README, manifest.json, status, ...), as
  // `caller` sees them.
  Result<std::string> GeneratedContent(const NodeId& node, const Caller& caller);
  // Opens a snapshot entry that is a regular file.
  Result<std::unique_ptr<FileReader>> OpenImage(const NodeId& node);
  // Target of a snapshot entry that is a symlink, or of a checkpoint link.
  Result<std::string> SymlinkTarget(const NodeId& node);
  // Whether a node is a control file (writes are commands).
  static bool IsControl(NodeKind kind) {
    return kind == NodeKind::kCtl || kind == NodeKind::kRestore || kind == NodeKind::kPidCtl;
  }
  // Whether a node is a checkpoint or inside one (read-only contents).
  static bool InCheckpoint(NodeKind kind) {
    return kind == NodeKind::kSnapshotDir || kind == NodeKind::kManifest ||
           kind == NodeKind::kSnapshotEntry;
  }
  // Forgets cached listings (after a checkpoint, import or delete).
  void Invalidate();
  // Deletes the checkpoint `node` (a kSnapshotDir) for `caller` (its owner
  // or root); kNotFound if that incarnation is gone.
  Status RemoveSnapshot(const NodeId& node, const Caller& caller);

 private:
  struct SnapshotTree {
    SnapshotInfo info;
    SnapshotOwner owner;
    std::map<std::string, FileEntry> entries;                  // by path
    std::map<std::string, std::vector<std::string>> children;  // dir path ("" = top) -> names
    // device/ files that are views of the images (fs/device_view.h), by path.
    std::map<std::string, std::shared_ptr<const DeviceFile>> device_files;
  };
  // The checkpoint published as `id` now (asks the store which one it is).
  Result<std::shared_ptr<const SnapshotTree>> CurrentTree(const std::string& id);
  // The incarnation `node` belongs to, or kNotFound once it is removed.
  Result<std::shared_ptr<const SnapshotTree>> Tree(const NodeId& node);
  // Tree(node), and kNotFound where `caller` may not see it.
  Result<std::shared_ptr<const SnapshotTree>> VisibleTree(const NodeId& node, const Caller& caller);
  Result<std::vector<SnapshotInfo>> Snapshots();
  // This pid's checkpoints, oldest first.
  Result<std::vector<std::string>> CheckpointsOf(int pid);
  Result<ProcessInfo> Process(int pid);
  static bool Visible(const SnapshotOwner& owner, const Caller& caller) {
    return caller.is_root() || owner.uid == caller.uid;
  }

  Store* store_;
  Engine* engine_;
  std::mutex mu_;  // guards the caches below; never held across Store calls
  std::map<std::string, std::shared_ptr<const SnapshotTree>> trees_;  // by id, latest seen
  std::vector<SnapshotInfo> snapshots_;
  std::chrono::steady_clock::time_point snapshots_read_{};
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STORE_VIEW_H_
