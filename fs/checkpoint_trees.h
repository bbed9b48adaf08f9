// CheckpointTrees: the checkpoints as the mount shows them. The list of
// published snapshots, re-read at most once a second (and at once after a
// change made through the mount), and each checkpoint's tree: its files
// as checkpoints/<id>/ lists them, its device/<id>/ and the layout of its
// archives/<id>.tar, built once per incarnation and cached (snapshots never
// change once published). Who may see a checkpoint is decided here too:
// its owner and root; for anyone else it is absent (kNotFound), never
// forbidden, so that neither its owner nor its time shows.
//
// An incarnation is an id with its key (SnapshotInfo::key, never reused):
// a tree asked for by id and key is kNotFound once that incarnation is
// removed, even when a new checkpoint has the same id.
//
// Thread-safe. Borrows the Store, which must outlive it.
#ifndef GPUCKPT_FS_CHECKPOINT_TREES_H_
#define GPUCKPT_FS_CHECKPOINT_TREES_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/mutex.h"
#include "core/engine/device_view.h"
#include "core/engine/engine.h"
#include "fs/archive_view.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

class CheckpointTrees {
 public:
  explicit CheckpointTrees(Store* store) : store_(store) {}

  // The files of one directory tree, with paths relative to its top.
  struct Listing {
    std::map<std::string, FileEntry> entries;                  // by path
    std::map<std::string, std::vector<std::string>> children;  // dir path ("" = top) -> names
  };
  struct Tree {
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

    // checkpoints/<id>/'s listing, or device/<id>/'s.
    const Listing& listing(bool device_view) const { return device_view ? device : files; }
  };
  // What a checkpoint's directory and manifest.json show, from its
  // manifest alone: no file is listed, so that a checkpoint that is only in
  // the shared pool is not fetched for a stat or an ls -l.
  struct Head {
    SnapshotInfo info;
    SnapshotOwner owner;
  };

  // Every published snapshot, as last read.
  Result<std::vector<SnapshotInfo>> Snapshots() EXCLUDES(mu_);
  // Forgets the list of snapshots (after a checkpoint, import or delete).
  void Invalidate() EXCLUDES(mu_);

  // The checkpoint published as `id` now (asks the store which one it is).
  Result<std::shared_ptr<const Tree>> Current(const std::string& id) EXCLUDES(mu_);
  // The incarnation (`id`, `key`), or kNotFound once it is removed.
  Result<std::shared_ptr<const Tree>> Incarnation(const std::string& id, uint64_t key)
      EXCLUDES(mu_);
  // Incarnation(), and kNotFound where `caller` may not see it (or, for
  // `device_view`, where the checkpoint has no device/<id>).
  Result<std::shared_ptr<const Tree>> Visible(const std::string& id, uint64_t key,
                                              const Caller& caller, bool device_view) EXCLUDES(mu_);
  // The head of the checkpoint published as `id` now, if `caller` may see
  // it (and, for `device_view`, where it has device state); else kNotFound.
  Result<Head> CurrentHead(const std::string& id, const Caller& caller, bool device_view);
  // CurrentHead() of the incarnation (`id`, `key`).
  Result<Head> VisibleHead(const std::string& id, uint64_t key, const Caller& caller,
                           bool device_view);
  // Deletes the incarnation (`id`, `key`) for `caller` (its owner or root);
  // kNotFound if it is gone or not theirs. Returns what was deleted.
  Result<std::shared_ptr<const Tree>> Remove(const std::string& id, uint64_t key,
                                             const Caller& caller) EXCLUDES(mu_);

  static bool MaySee(const SnapshotOwner& owner, const Caller& caller) {
    return caller.is_root() || owner.uid == caller.uid;
  }

 private:
  // Adds `files` to `listing`, with the parents that they lack shown as
  // private directories of the checkpoint's owner.
  static void AddToListing(std::vector<FileEntry> files, const Tree& tree, Listing* listing);
  // Fills tree->device, tree->device_files from the stored `files`.
  void BuildDeviceListing(const std::vector<FileEntry>& files, Tree* tree);
  // A tree of the current incarnation of `info.id`, built from the store.
  Result<std::shared_ptr<Tree>> Build(SnapshotInfo info);

  Store* store_;
  Mutex mu_;  // guards the caches below; never held across Store calls
  // By id, latest seen.
  std::map<std::string, std::shared_ptr<const Tree>> trees_ GUARDED_BY(mu_);
  std::vector<SnapshotInfo> snapshots_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point snapshots_read_ GUARDED_BY(mu_){};
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_CHECKPOINT_TREES_H_
