// NodeKind and NodeId: what a node of the gpuckptfs tree is, as plain
// values. The FUSE layer keeps them in its inode table; each kind has one
// handler (fs/node_handler.h) that answers for it.
#ifndef GPUCKPT_FS_NODE_ID_H_
#define GPUCKPT_FS_NODE_ID_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace gpuckpt {

enum class NodeKind {
  kRoot,
  kReadme,
  kCtl,                // global commands
  kRestore,            // write a path; read the caller's last result
  kMetrics,            // Prometheus text
  kReport,             // report.html: the caller's checkpoints and the store, drawn
  kCheckpointsDir,     // checkpoints/
  kSnapshotDir,        // checkpoints/<id>
  kManifest,           // checkpoints/<id>/manifest.json
  kSnapshotEntry,      // checkpoints/<id>/<path> (images/...)
  kDeviceDir,          // device/
  kDeviceSnapshotDir,  // device/<id>
  kDeviceEntry,        // device/<id>/<path>
  kArchivesDir,        // archives/
  kArchive,            // archives/<id>.tar
  kPidDir,             // <pid>
  kPidCtl,             // <pid>/ctl
  kPidStatus,          // <pid>/status
  kPidStatusJson,      // <pid>/status.json
  kPidCheckpoints,     // <pid>/checkpoints
  kPidCheckpointLink,  // <pid>/checkpoints/<n|latest>
};
// How many kinds there are: kPidCheckpointLink is the last.
inline constexpr size_t kNodeKindCount = static_cast<size_t>(NodeKind::kPidCheckpointLink) + 1;

struct NodeId {
  NodeKind kind = NodeKind::kRoot;
  std::string snapshot;  // snapshot nodes: the id
  uint64_t key = 0;      // snapshot nodes: SnapshotInfo::key, the incarnation of the id
  std::string path;      // snapshot and device entries: path inside; pid links: the link name
  int pid = 0;           // process nodes
  // Control files: the thread whose lookup found it (filesystem.cc), so
  // that each caller writes through a node of its own.
  int writer = 0;
  auto operator<=>(const NodeId&) const = default;
};

// A node of the top of the tree or of a process (no checkpoint).
inline NodeId MakeNode(NodeKind kind, int pid = 0, std::string path = "") {
  return NodeId{kind, "", 0, std::move(path), pid};
}

// A node of the checkpoint `id` in its incarnation `key`.
inline NodeId SnapshotNode(NodeKind kind, const std::string& id, uint64_t key,
                           std::string path = "") {
  return NodeId{kind, id, key, std::move(path), 0};
}

// Whether a node is a checkpoint's device/<id> or inside it.
inline bool InDeviceView(NodeKind kind) {
  return kind == NodeKind::kDeviceSnapshotDir || kind == NodeKind::kDeviceEntry;
}

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_NODE_ID_H_
