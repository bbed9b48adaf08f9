// The files of device/<id>/ in the mount (fs/store_view.h): views of a
// checkpoint's images, kept out of checkpoints/<id>/ so that a copy of a
// checkpoint holds its device memory once (in the pages image), not twice:
//
//  - CUDA: the device memory the driver moved into the process's host
//    memory at the checkpoint step. cuda-checkpoint recorded those ranges
//    (manifest "extra.device.cuda_host_ranges"); their bytes are already in
//    CRIU's pages image, so each range is shown as a file made of slices of
//    images/pages-<id>.img, found through images/pagemap-<pid>.img (pages
//    CRIU did not dump read as zeros), plus cuda-ranges.json listing them.
//    Nothing is stored twice: `du` shows 0 for them.
//  - AMD: the amdgpu plugin's image files (images/amdgpu-*), shown again
//    under device/<id>/ with the same bytes.
//
// Snapshots imported by older versions from a copy store device/ files
// themselves; those are shown as stored instead (see BuildDeviceFiles()).
//
// Thread-safety: DeviceFile is immutable once built; the readers are as
// safe for concurrent Pread() as the Store's.
#ifndef GPUCKPT_FS_DEVICE_VIEW_H_
#define GPUCKPT_FS_DEVICE_VIEW_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "gpuckpt/file_reader.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

// Stored files are named as Store::ListFiles() listed them (path and
// index), so that they are opened with Store::OpenListedFile(): only ever
// of the incarnation of the checkpoint the view was built from.
struct DeviceFile {
  FileEntry entry;                    // "<name>" in device/<id>/, the logical size, the owner
  std::optional<FileEntry> alias_of;  // AMD: the stored file read in its place
  std::string content;                // generated: cuda-ranges.json
  // CUDA: slices of `source` (a stored pages image), in file order.
  struct Segment {
    uint64_t length = 0;
    int64_t source_offset = -1;  // -1: zeros
  };
  std::optional<FileEntry> source;
  std::vector<Segment> segments;
};

// Whether device/<id> exists for snapshot `info`: decided from its manifest
// alone, since listing device/ asks it of every checkpoint, and building
// the files reads pagemaps. True where the manifest records device memory
// ranges (extra.device.cuda_host_ranges, not empty) or says the checkpoint
// was made with a GPU (extra.gpu_backend "cuda" or "rocm"): that also
// covers AMD's plugin files, and the device/ that older imports of copies
// stored (their manifests keep gpu_backend). A GPU checkpoint whose files
// cannot be built (no ranges recorded, a damaged pagemap) has an empty
// device/<id>, so that what device/ lists can always be looked up.
bool HasDeviceState(const SnapshotInfo& info);

// Whether `path`, a stored file's path, is in the device/ that older
// imports of copies stored.
bool IsStoredDevicePath(const std::string& path);

// The device/<id>/ files of snapshot `info`, whose stored files are `files`.
// Empty when it has none, or stores device/ itself.
Result<std::vector<std::shared_ptr<const DeviceFile>>> BuildDeviceFiles(
    Store* store, const SnapshotInfo& info, const SnapshotOwner& owner,
    const std::vector<FileEntry>& files);

// A reader of one device file of snapshot `id` whose key was `key` when
// the files were built (SnapshotInfo::key); kNotFound once that snapshot
// is gone, even if its id has been made again.
Result<std::unique_ptr<FileReader>> OpenDeviceFile(Store* store, const std::string& id,
                                                   uint64_t key,
                                                   std::shared_ptr<const DeviceFile> file);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_DEVICE_VIEW_H_
