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
// (device/<id> and archives/<id>.tar included) stays kNotFound even once a
// new checkpoint has the same id (fs/checkpoint_trees.h says what is
// cached and for how long).
//
// Each NodeKind has one handler (fs/node_handler.h); StoreView hands each
// call to the handler of the node's kind.
//
// Thread-safe. Borrows the Store and the Engine, which must outlive it.
#ifndef GPUCKPT_FS_STORE_VIEW_H_
#define GPUCKPT_FS_STORE_VIEW_H_

#include <sys/stat.h>

#include <memory>
#include <string>

#include "core/engine/engine.h"
#include "fs/checkpoint_trees.h"
#include "fs/node_handler.h"
#include "fs/node_id.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class StoreView {
 public:
  StoreView(Store* store, Engine* engine);

  // The child `name` of `parent`, or kNotFound (also where `caller` may
  // not see it).
  Result<NodeId> Child(const NodeId& parent, const std::string& name, const Caller& caller) {
    return HandlerOf(parent).Child(parent, name, caller);
  }
  using Entries = NodeEntries;
  // Names and ids of a directory's children as `caller` may list them.
  Result<Entries> Children(const NodeId& dir, const Caller& caller) {
    return HandlerOf(dir).Children(dir, caller);
  }
  // Attributes as `caller` may see them: kNotFound for a removed
  // checkpoint's nodes, and for someone else's checkpoint. st_ino is left 0
  // for the caller to fill.
  Result<struct stat> Attributes(const NodeId& node, const Caller& caller) {
    return HandlerOf(node).Attributes(node, caller);
  }
  // Attributes as root sees them (for tests; the FUSE layer always asks as
  // the caller).
  Result<struct stat> Attributes(const NodeId& node) { return Attributes(node, Caller{}); }
  // Contents of generated files (README, manifest.json, status, ...), as
  // `caller` sees them.
  Result<std::string> GeneratedContent(const NodeId& node, const Caller& caller) {
    return HandlerOf(node).Content(node, caller);
  }
  // Opens a snapshot or device entry that is a regular file, or an archive.
  Result<std::unique_ptr<FileReader>> OpenImage(const NodeId& node) {
    return HandlerOf(node).Open(node);
  }
  // Target of a snapshot or device entry that is a symlink, or of a
  // checkpoint link.
  Result<std::string> SymlinkTarget(const NodeId& node) { return HandlerOf(node).Target(node); }
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
  static bool InDeviceView(NodeKind kind) { return gpuckpt::InDeviceView(kind); }
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
  void Invalidate() { trees_.Invalidate(); }
  // Deletes the checkpoint `node` (a kSnapshotDir) for `caller` (its owner
  // or root); kNotFound if that incarnation is gone, kBusy while a lazily
  // restored tree's memory still comes from it (Engine::CheckRemovable).
  Status RemoveSnapshot(const NodeId& node, const Caller& caller);
  // kBusy while the checkpoint `node` is in (any node of it) cannot be
  // removed now (Engine::CheckRemovable); the caller's right to see it is
  // checked elsewhere.
  Status CheckRemovable(const NodeId& node) const;

 private:
  NodeHandler& HandlerOf(const NodeId& node) { return *handlers_[static_cast<size_t>(node.kind)]; }

  CheckpointTrees trees_;
  const NodeContext context_;
  NodeHandlers handlers_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_STORE_VIEW_H_
