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
// FIFOs, sockets, a name twice, and an archive without
// checkpoint/pstree.img.
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

struct ContainerImportOptions {
  // Owner of every stored entry: the importer.
  uint32_t uid = 0;
  uint32_t gid = 0;
  // The most read of the members kept whole for parsing (pstree.img,
  // config.dump, manifest.json); a larger one is refused.
  uint64_t max_parsed_bytes = 64u << 20;
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
// rules above; the writer's own errors as they are.
Result<ContainerImport> AddContainerArchiveToSnapshot(SnapshotWriter* writer, int fd,
                                                      const std::string& shown,
                                                      const ContainerImportOptions& options);

// Whether `name` is a member of the archive's top level that the import
// stores under container/ (not checkpoint/ nor manifest.json): for the
// walk of an extracted directory.
bool IsContainerFile(const std::string& top_level_name);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_CONTAINER_ARCHIVE_H_
