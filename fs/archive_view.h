// The files of archives/ in the mount (fs/store_view.h): each checkpoint as
// one tar, <id>.tar, in the layout of a Podman/CRI-O checkpoint archive, so
// that `podman container restore --import` and checkpointctl read it
// straight from the mount. Generated on every read from the store, never
// staged: no temporary file, no buffer of the whole archive; like the
// device/ views it takes no space (st_blocks 0).
//
// Members, in this order (stored path -> member):
//   gpuckpt's manifest (SnapshotManifestJson)  -> manifest.json
//   container/X  (what a Podman import keeps: config.dump, spec.dump,
//                network.status, ctr.log, rootfs-diff.tar, ...)  -> X
//   images, images/X  (CRIU's images)           -> checkpoint/, checkpoint/X
// each group in path order, a directory before what is in it. Directories
// that the snapshot holds no entry for (a writer may add files only) are
// members all the same, private to the checkpoint's owner, as in
// checkpoints/<id>/. Everything else stored (an older import's device/) is
// left out, and so are container/manifest.json and container/checkpoint...,
// which would shadow gpuckpt's own members on extraction.
//
// Format: POSIX pax, restricted (plain ustar headers unless a field does
// not fit: long or non-ASCII names, sizes of 8 GiB and more, large ids).
// libarchive encodes each header; the layout around them is ours: header,
// the file's bytes, zeros to a multiple of 512, and two zero blocks at the
// end. Headers carry only what FileEntry gives (type, mode, uid, gid,
// mtime, size, link target; no names of users, no atime or ctime), so the
// same member always gets the same bytes, and the size of the archive, and
// where each member starts, are known from the listing alone.
//
// Thread-safety: an ArchiveLayout is immutable once built (share it); a
// reader from OpenArchive() may be read from several threads at once (it
// only reads its own immutable state and the Store's readers).
#ifndef GPUCKPT_FS_ARCHIVE_VIEW_H_
#define GPUCKPT_FS_ARCHIVE_VIEW_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "gpuckpt/file_reader.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

struct ArchiveMember {
  // What the header says: `path` is the member's name in the archive,
  // `size` its data's length (0 but for regular files).
  FileEntry entry;
  // Regular files: the stored file read for the data, as
  // Store::ListFiles() listed it (its path and index); none for the
  // manifest, which is generated (ArchiveLayout::manifest()), and for
  // what has no data.
  std::optional<FileEntry> stored;
  uint64_t offset = 0;       // of the header, in the archive
  uint64_t header_size = 0;  // a multiple of 512; the data follows
  // Where the next member starts: data padded to a multiple of 512.
  uint64_t end() const { return offset + header_size + (entry.size + 511) / 512 * 512; }
};

class ArchiveLayout {
 public:
  // The archive of snapshot `info`, owned by `owner`, whose stored files
  // are `files` (Store::ListFiles). Runs libarchive once per member to
  // learn the size of its header; reads nothing from the store.
  static Result<std::shared_ptr<const ArchiveLayout>> Build(const SnapshotInfo& info,
                                                            const SnapshotOwner& owner,
                                                            const std::vector<FileEntry>& files);

  const std::string& id() const { return id_; }
  uint64_t key() const { return key_; }  // SnapshotInfo::key
  // The archive as a file: "<id>.tar", 0400, the owner's, the checkpoint's
  // creation time, its exact size.
  const FileEntry& file() const { return file_; }
  uint64_t size() const { return file_.size; }
  // In archive order; members()[0] is manifest.json at offset 0.
  const std::vector<ArchiveMember>& members() const { return members_; }
  const std::string& manifest() const { return manifest_; }

 private:
  ArchiveLayout() = default;
  std::string id_;
  uint64_t key_ = 0;
  FileEntry file_;
  std::vector<ArchiveMember> members_;
  std::string manifest_;
};

// The header of one member as libarchive writes it (pax restricted):
// 512 bytes for a plain ustar header, more where a pax extended header
// comes first. Deterministic: the same entry always gives the same bytes.
Result<std::string> TarHeader(const FileEntry& entry);

// A reader of the whole archive `layout`. Opens now a Store reader of
// every regular member, and checks that the checkpoint is still the
// incarnation `layout` was built for (kNotFound otherwise): the readers
// keep it readable, so an open archive goes on reading the checkpoint it
// was opened on after it is removed, or its id reused. Also makes every
// header now (kept with the reader, about 512 bytes a member), so that a
// read allocates nothing. Borrows the Store, which must outlive it.
Result<std::unique_ptr<FileReader>> OpenArchive(Store* store,
                                                std::shared_ptr<const ArchiveLayout> layout);

// The name in archives/ of checkpoint `id`'s archive, and the id that a
// name in archives/ stands for (nullopt for a name without ".tar").
std::string ArchiveFileName(const std::string& id);
std::optional<std::string> ArchiveIdOf(const std::string& name);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_ARCHIVE_VIEW_H_
