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
// all). Control files are writable by anyone; the engine checks each
// request against the caller.
//
// Node identities are (kind, snapshot id, path, pid) and stable for the
// life of the process. Snapshot listings are cached (snapshots never change
// once published); the list of snapshots is re-read at most once a second,
// and at once after a change made through the mount.
//
// Thread-safe. Borrows the Store and the Engine, which must outlive it.
#ifndef GPUCKPT_FS_STORE_VIEW_H_
#define GPUCKPT_FS_STORE_VIEW_H_

#include <sys/stat.h>

#include <chrono>
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
  std::string snapshot;  // snapshot nodes
  std::string path;      // snapshot entries: path inside; pid links: the link name
  int pid = 0;           // process nodes
  auto operator<=>(const NodeId&) const = default;
};

class StoreView {
 public:
  StoreView(Store* store, Engine* engine) : store_(store), engine_(engine) {}

  // The child `name` of `parent`, or kNotFound.
  Result<NodeId> Child(const NodeId& parent, const std::string& name, const Caller& caller);
  // Names and ids of a directory's children as `caller` may list them, sorted.
  Result<std::vector<std::pair<std::string, NodeId>>> Children(const NodeId& dir,
                                                               const Caller& caller);
  // Attributes (st_ino is left 0 for the caller to fill).
  Result<struct stat> Attributes(const NodeId& node);
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
  // Forgets cached listings (after a checkpoint, import or delete).
  void Invalidate();
  // Deletes a snapshot for `caller` (its owner or root).
  Status RemoveSnapshot(const std::string& id, const Caller& caller);

 private:
  struct SnapshotTree {
    SnapshotInfo info;
    SnapshotOwner owner;
    std::map<std::string, FileEntry> entries;                  // by path
    std::map<std::string, std::vector<std::string>> children;  // dir path ("" = top) -> names
    // device/ files that are views of the images (fs/device_view.h), by path.
    std::map<std::string, std::shared_ptr<const DeviceFile>> device_files;
  };
  Result<std::shared_ptr<const SnapshotTree>> Tree(const std::string& id);
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
  std::map<std::string, std::shared_ptr<const SnapshotTree>> trees_;
  std::vector<SnapshotInfo> snapshots_;
  std::chrono::steady_clock::time_point snapshots_read_{};
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STORE_VIEW_H_
