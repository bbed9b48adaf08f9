// StoreView: the read-only tree that gpuckptfs shows for a Store, as plain
// data the FUSE layer can serve: which nodes exist, their attributes, their
// children, and the bytes of generated files. No FUSE types here.
//
//   /README                         help text
//   /checkpoints/                   one directory per snapshot
//   /checkpoints/<id>/manifest.json the manifest (JSON)
//   /checkpoints/<id>/images/...    the snapshot's files, read lazily
//
// Node identities are (kind, snapshot id, path) and stable for the life of
// the process. Snapshot listings are cached (snapshots never change once
// published); the list of snapshots is re-read at most once a second.
//
// Thread-safe. Borrows the Store, which must outlive it.
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

#include "gpuckpt/store.h"

namespace gpuckpt {

enum class NodeKind {
  kRoot,
  kReadme,
  kCheckpointsDir,
  kSnapshotDir,  // checkpoints/<id>
  kManifest,     // checkpoints/<id>/manifest.json
  kImagesDir,    // checkpoints/<id>/images
  kImageEntry,   // checkpoints/<id>/images/<path>
};

struct NodeId {
  NodeKind kind = NodeKind::kRoot;
  std::string snapshot;  // for snapshot nodes
  std::string path;      // for image entries: path inside the snapshot
  auto operator<=>(const NodeId&) const = default;
};

class StoreView {
 public:
  explicit StoreView(Store* store) : store_(store) {}

  // The child `name` of `parent`, or kNotFound.
  Result<NodeId> Child(const NodeId& parent, const std::string& name);
  // Names and ids of a directory's children, sorted.
  Result<std::vector<std::pair<std::string, NodeId>>> Children(const NodeId& dir);
  // Attributes (st_ino is left 0 for the caller to fill).
  Result<struct stat> Attributes(const NodeId& node);
  // Contents of generated files (README, manifest.json).
  Result<std::string> GeneratedContent(const NodeId& node);
  // Opens an image entry that is a regular file.
  Result<std::unique_ptr<FileReader>> OpenImage(const NodeId& node);
  // Target of an image entry that is a symlink.
  Result<std::string> SymlinkTarget(const NodeId& node);

 private:
  struct SnapshotTree {
    SnapshotInfo info;
    std::map<std::string, FileEntry> entries;                  // by path
    std::map<std::string, std::vector<std::string>> children;  // dir path ("" = images/) -> names
  };
  Result<std::shared_ptr<const SnapshotTree>> Tree(const std::string& id);
  Result<std::vector<std::string>> SnapshotIds();

  Store* store_;
  std::mutex mu_;  // guards the caches below; never held across Store calls
  std::map<std::string, std::shared_ptr<const SnapshotTree>> trees_;
  std::vector<std::string> ids_;
  std::chrono::steady_clock::time_point ids_read_{};
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STORE_VIEW_H_
