// StoreView: the tree gpuckptfs shows (docs/gpuckptfs.md, "The tree"), as plain
// data the FUSE layer can serve: which nodes exist for whom, their attributes, their
// children, and the bytes of generated files. No FUSE types here.
//
//   /README /ctl /restore /metrics       help, global commands, restore, metrics
//   /checkpoints/<id>/manifest.json      the manifest (JSON)
//   /checkpoints/<id>/images/...         the snapshot's files, read lazily
//   /device/<id>/...                     device state, views of the images
//                                        (core/engine/device_view.h)
//   /archives/<id>.tar                   the checkpoint as a Podman/CRI-O
//                                        checkpoint archive, made on reads
//                                        (fs/archive_view.h)
//   /<pid>/{ctl,status,status.json}      one directory per process shown
//   /<pid>/checkpoints/{1,2,..,latest}   symlinks to ../../checkpoints/<id>
//
// checkpoints/<id>/ holds what a restore needs, each byte once, so that a
// `cp -r` (tar, rsync) of it is its logical size; device/<id>/ shows the
// device memory again, as slices of the pages image, for whoever wants to
// look at it (it is never part of a copy); archives/<id>.tar gives it
// again as one tar, generated from the store on each read (st_blocks 0:
// `du` of the mount counts no checkpoint twice). A device/ that older versions
// imported with a copy is shown under device/<id>/ too, never under
// checkpoints/<id>/.
//
// Who sees what: a process's directory and a checkpoint belong to the
// process's owner (dirs 0700, files 0600; the kernel enforces the modes,
// default_permissions), and listings show a caller only their own (root
// all); device/<id> and archives/<id>.tar follow their checkpoint. A
// checkpoint of someone else, everything below it and below its
// device/<id>, and its archives/<id>.tar, are also absent
// (kNotFound) to the caller's lookups and attributes, so that neither its
// owner nor its time shows. Control files are writable by anyone; the
// engine checks each request against the caller.
//
// Node identities are (kind, snapshot id and key, path, pid) and stable
// for the life of the process. The key (SnapshotInfo::key, never reused)
// tells incarnations of a reused id apart: a node of a removed checkpoint
// (device/<id> and archives/<id>.tar included) stays kNotFound even once a new checkpoint has the
// same id. Snapshot listings are cached (snapshots never change once
// published); the list of snapshots is re-read at most once a second, and
// at once after a change made through the mount; a lookup of
// checkpoints/<id>, device/<id> or archives/<id>.tar asks the store which
// incarnation is current.
//
// Thread-safe. Borrows the Store and the Engine, which must outlive it.
#ifndef GPUCKPT_FS_STORE_VIEW_H_
#define GPUCKPT_FS_STORE_VIEW_H_

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/base/mutex.h"
#include "core/engine/device_view.h"
#include "core/engine/engine.h"
#include "fs/archive_view.h"
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

class StoreView {
 public:
  StoreView(Store* store, Engine* engine) : store_(store), engine_(engine) {}

  // The child `name` of `parent`, or kNotFound (also where `caller` may
  // not see it).
  Result<NodeId> Child(const NodeId& parent, const std::string& name, const Caller& caller)
      EXCLUDES(mu_);
  using Entries = std::vector<std::pair<std::string, NodeId>>;
  // Names and ids of a directory's children as `caller` may list them, sorted.
  Result<Entries> Children(const NodeId& dir, const Caller& caller) EXCLUDES(mu_);
  // Attributes as `caller` may see them: kNotFound for a removed
  // checkpoint's nodes, and for someone else's checkpoint. st_ino is left 0
  // for the caller to fill.
  Result<struct stat> Attributes(const NodeId& node, const Caller& caller) EXCLUDES(mu_);
  // Attributes as root sees them (for tests; the FUSE layer always asks as
  // the caller).
  Result<struct stat> Attributes(const NodeId& node) EXCLUDES(mu_) {
    return Attributes(node, Caller{});
  }
  // Contents of generated files (README, manifest.json, status, ...), as
  // `caller` sees them.
  Result<std::string> GeneratedContent(const NodeId& node, const Caller& caller) EXCLUDES(mu_);
  // Opens a snapshot or device entry that is a regular file, or an archive.
  Result<std::unique_ptr<FileReader>> OpenImage(const NodeId& node) EXCLUDES(mu_);
  // Target of a snapshot or device entry that is a symlink, or of a
  // checkpoint link.
  Result<std::string> SymlinkTarget(const NodeId& node) EXCLUDES(mu_);
  // Whether a node is a control file (writes are commands).
  static bool IsControl(NodeKind kind) {
    return kind == NodeKind::kCtl || kind == NodeKind::kRestore || kind == NodeKind::kPidCtl;
  }
  // Whether a node is a checkpoint or inside one (read-only contents).
  static bool InCheckpoint(NodeKind kind) {
    return kind == NodeKind::kSnapshotDir || kind == NodeKind::kManifest ||
           kind == NodeKind::kSnapshotEntry;
  }
  // Whether a node is a checkpoint's device/<id> or inside it (read-only
  // contents, like a checkpoint's; removing it removes nothing).
  static bool InDeviceView(NodeKind kind) {
    return kind == NodeKind::kDeviceSnapshotDir || kind == NodeKind::kDeviceEntry;
  }
  // Whether a node is a checkpoint's archives/<id>.tar (read-only: its
  // bytes are the checkpoint's).
  static bool InArchiveView(NodeKind kind) { return kind == NodeKind::kArchive; }
  // Whether a node is a file or directory of a checkpoint's, or its
  // archive, whose reads go through OpenImage() (never generated).
  static bool IsSnapshotFile(NodeKind kind) {
    return kind == NodeKind::kSnapshotEntry || kind == NodeKind::kDeviceEntry ||
           kind == NodeKind::kArchive;
  }
  // Forgets cached listings (after a checkpoint, import or delete).
  void Invalidate() EXCLUDES(mu_);
  // Deletes the checkpoint `node` (a kSnapshotDir) for `caller` (its owner
  // or root); kNotFound if that incarnation is gone.
  Status RemoveSnapshot(const NodeId& node, const Caller& caller) EXCLUDES(mu_);

 private:
  // The files of one directory tree, with paths relative to its top.
  struct Listing {
    std::map<std::string, FileEntry> entries;                  // by path
    std::map<std::string, std::vector<std::string>> children;  // dir path ("" = top) -> names
  };
  struct SnapshotTree {
    SnapshotInfo info;
    SnapshotOwner owner;
    Listing files;  // checkpoints/<id>/: what is stored, but manifest.json and device/
    // device/<id>/, which exists where HasDeviceState(info): the stored
    // device/ of an older import, else the views of the images.
    bool has_device = false;
    Listing device;
    // The device files that are views of the images (core/engine/device_view.h), by path.
    std::map<std::string, std::shared_ptr<const DeviceFile>> device_files;
    // archives/<id>.tar (fs/archive_view.h): where its members are. Built
    // with the tree, from the listing alone; a layout that could not be
    // built (libarchive failed) leaves archives/<id>.tar listed, and its
    // stat and open fail with `archive_status`.
    std::shared_ptr<const ArchiveLayout> archive;
    Status archive_status;
  };
  // Child(), Children() and Attributes() by part of the tree: the mount's
  // top (its files and the directories of all checkpoints), the
  // checkpoints/, device/ and archives/ directories, a checkpoint's own
  // files, and a process's <pid>/.
  Result<NodeId> RootChild(const std::string& name, const Caller& caller) EXCLUDES(mu_);
  Result<NodeId> CheckpointListChild(const NodeId& parent, const std::string& name,
                                     const Caller& caller) EXCLUDES(mu_);
  Result<NodeId> SnapshotChild(const NodeId& parent, const std::string& name, const Caller& caller)
      EXCLUDES(mu_);
  Result<NodeId> ProcessChild(const NodeId& parent, const std::string& name) EXCLUDES(mu_);
  Result<Entries> RootChildren(const Caller& caller) EXCLUDES(mu_);
  Result<Entries> CheckpointListChildren(const NodeId& dir, const Caller& caller) EXCLUDES(mu_);
  Result<Entries> SnapshotChildren(const NodeId& dir, const Caller& caller) EXCLUDES(mu_);
  Result<Entries> ProcessChildren(const NodeId& dir) EXCLUDES(mu_);
  Result<struct stat> TopLevelAttributes(const NodeId& node, const Caller& caller) EXCLUDES(mu_);
  Result<struct stat> CheckpointAttributes(const NodeId& node, const Caller& caller) EXCLUDES(mu_);
  Result<struct stat> ProcessAttributes(const NodeId& node, const Caller& caller) EXCLUDES(mu_);
  // Adds `files` to `listing`, with the parents that they lack shown as
  // private directories of the checkpoint's owner.
  static void AddToListing(std::vector<FileEntry> files, const SnapshotTree& tree,
                           Listing* listing);
  // Fills tree->device, tree->device_files from the stored `files`.
  void BuildDeviceListing(const std::vector<FileEntry>& files, SnapshotTree* tree) EXCLUDES(mu_);
  // The listing that `node` (a checkpoint's or a device/<id> node) is in.
  static const Listing& ListingOf(const SnapshotTree& tree, const NodeId& node) {
    return InDeviceView(node.kind) ? tree.device : tree.files;
  }
  // The checkpoint published as `id` now (asks the store which one it is).
  Result<std::shared_ptr<const SnapshotTree>> CurrentTree(const std::string& id) EXCLUDES(mu_);
  // The incarnation `node` belongs to, or kNotFound once it is removed.
  Result<std::shared_ptr<const SnapshotTree>> Tree(const NodeId& node) EXCLUDES(mu_);
  // What a checkpoint's directory and manifest.json show, from its
  // manifest alone: no file is listed, so that a checkpoint that is only in
  // the shared pool is not fetched for a stat or an ls -l.
  struct SnapshotHead {
    SnapshotInfo info;
    SnapshotOwner owner;
  };
  // The checkpoint published as `id` now, if `caller` may see it (and, for
  // a device/<id> name, where it has device state); else kNotFound.
  Result<SnapshotHead> CurrentHead(const std::string& id, const Caller& caller, bool device_view);
  // CurrentHead() of the incarnation `node` belongs to.
  Result<SnapshotHead> VisibleHead(const NodeId& node, const Caller& caller);
  // Tree(node), and kNotFound where `caller` may not see it (or, for a
  // device/<id> node, where the checkpoint has no device/<id>).
  Result<std::shared_ptr<const SnapshotTree>> VisibleTree(const NodeId& node, const Caller& caller)
      EXCLUDES(mu_);
  Result<std::vector<SnapshotInfo>> Snapshots() EXCLUDES(mu_);
  // This pid's checkpoints, oldest first.
  Result<std::vector<std::string>> CheckpointsOf(int pid) EXCLUDES(mu_);
  Result<ProcessInfo> Process(int pid) EXCLUDES(mu_);
  static bool Visible(const SnapshotOwner& owner, const Caller& caller) {
    return caller.is_root() || owner.uid == caller.uid;
  }

  Store* store_;
  Engine* engine_;
  Mutex mu_;  // guards the caches below; never held across Store calls
  // By id, latest seen.
  std::map<std::string, std::shared_ptr<const SnapshotTree>> trees_ GUARDED_BY(mu_);
  std::vector<SnapshotInfo> snapshots_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point snapshots_read_ GUARDED_BY(mu_){};
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STORE_VIEW_H_
