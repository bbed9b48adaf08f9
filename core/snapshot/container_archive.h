// Container checkpoints as Podman and CRI-O write them (a tar, perhaps
// gzip- or zstd-compressed, or its extracted directory) into a snapshot:
//
//   checkpoint/X    CRIU's images          -> images/X
//   manifest.json   gpuckpt's, when the archive is one the mount made
//                   (archives/<id>.tar)    -> not stored, handed back
//   anything else   config.dump, spec.dump, network.status, stats-dump,
//                   ctr.log, artifacts/, devshm-checkpoint.tar,
//                   rootfs-diff.tar, deleted.files, volumes/, ...
//                                          -> container/X
//
// An archive is read once, as a stream: every member goes from the
// decompressor straight into the writer (nothing is staged on disk), so a
// compressed archive's images deduplicate like those of any checkpoint.
// What the archive says of owners is not believed: every stored entry
// belongs to the importer; permission bits beyond 0777 are dropped.
// Refused, with nothing stored: absolute names, "..", hard links, devices,
// FIFOs, sockets, a name twice, an archive without checkpoint/pstree.img,
// and one whose members hold more data than the options allow (checked as
// it is decompressed). Sparse members keep their holes and their size
// (SnapshotWriter::AddSparse()).
//
// Stateless functions; the writer is borrowed (one thread adds to it).
#ifndef GPUCKPT_CORE_SNAPSHOT_CONTAINER_ARCHIVE_H_
#define GPUCKPT_CORE_SNAPSHOT_CONTAINER_ARCHIVE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "gpuckpt/snapshot_writer.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// Where a container checkpoint's members go in a snapshot.
inline constexpr char kContainerImagesDir[] = "checkpoint";  // in the archive
inline constexpr char kContainerFilesDir[] = "container";    // in the snapshot

// The default of ContainerImportOptions::max_expansion. CRIU's images of
// real processes compress a few times (tests/bench's page mix: 1.9x at
// zstd level 1). Zero pages compress far better (zstd: about 30000:1), so
// the ratio of a checkpoint grows with its share of zeroed memory: to
// cross 2000, the zeroed pages must outnumber the others more than 700
// to 1 (10 MB of a process's own data beside 7 GB of zeros). A GPU
// process whose device memory, copied to the host, is mostly zeros comes
// closest: 130 GB reserved beside 2 GB of data is about 200:1. gzip
// cannot pass about 1032:1 (deflate's longest match), so no gzip archive
// is refused by the ratio (max_member_bytes bounds those); zstd and xz
// archives of zeros are (4 GiB in a .tar.zst of 143 KB is 30000:1),
// after about 2000 times what was read of them.
inline constexpr uint64_t kDefaultMaxExpansion = 2000;

struct ContainerImportOptions {
  // Owner of every stored entry: the importer.
  uint32_t uid = 0;
  uint32_t gid = 0;
  // The most read of the members kept whole for parsing (pstree.img,
  // config.dump, manifest.json); a larger one is refused.
  uint64_t max_parsed_bytes = 64u << 20;
  // The most bytes of data the members may hold together, as they are
  // decompressed: what the import reads, chunks and stores, holes of
  // sparse members excluded. Crossing it stops the import at once with
  // kNoSpace (the caller's quota or the store's free space, say), not
  // after reading everything. 0: no limit. Default: 0.
  uint64_t max_member_bytes = 0;
  // Compressed archives: the most bytes of data (as for max_member_bytes)
  // per byte of the archive read so far. Crossing it stops the import at
  // once with kInvalidArgument: an archive that decompresses to that much
  // more than it is is made to, not a checkpoint. Never refused before
  // 64 MiB. 0: no limit. Default: kDefaultMaxExpansion.
  uint64_t max_expansion = kDefaultMaxExpansion;
};

// The members an import needs to read, kept whole.
struct ContainerImport {
  std::string pstree;                   // checkpoint/pstree.img
  std::optional<std::string> manifest;  // manifest.json, when there is one
  std::optional<std::string> config;    // config.dump (Podman's container config)
  // CRIU dumped a mount namespace of the tree's (checkpoint/mountpoints-*.img).
  bool mount_namespace = false;
};

// Streams the archive read from `fd` (a regular file; tar, tar.gz or
// tar.zst, told apart by their bytes) into `writer`. `shown` names it in
// messages. kInvalidArgument for what is not such an archive or breaks the
// rules above, or expands more than options.max_expansion; kNoSpace for
// members beyond options.max_member_bytes; the writer's own errors as
// they are (kCancelled once the writer is cancelled:
// SnapshotWriter::SetCancel()).
Result<ContainerImport> AddContainerArchiveToSnapshot(SnapshotWriter* writer, int fd,
                                                      const std::string& shown,
                                                      const ContainerImportOptions& options);

// Whether `name` is a member of the archive's top level that the import
// stores under container/ (not checkpoint/ nor manifest.json): for the
// walk of an extracted directory.
bool IsContainerFile(const std::string& top_level_name);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_CONTAINER_ARCHIVE_H_
