// CheckpointManifest: what gpuckpt records with every checkpoint about the
// process tree, its owner, its GPUs and how to bring it back. It is the
// snapshot's `extra` (SnapshotInfo::extra_json), shown as manifest.json's
// "extra" and copied with every `cp -r` of a checkpoint, so it outlives
// the gpuckpt that wrote it: this is the one place that reads and writes
// it. The JSON is described in core/manifest/FORMAT.md.
//
// Versions: 1 is every manifest written before the `version` field
// existed (read as such); EncodeManifest writes kManifestVersion. A newer
// version is refused (kUnavailable): its fields may mean what this
// reader cannot know, and who may restore a checkpoint is decided from it.
//
// Reading is lenient per field, as copies are edited by hand: a field of
// the wrong type, or an element of a list that is malformed (a GPU without
// a uuid, a device range that is not pid > 0 and start < end), reads as
// absent, and its path is added to `dropped` (for messages).
//
// Thread-safety: plain values; the functions are pure and reentrant.
#ifndef GPUCKPT_CORE_MANIFEST_CHECKPOINT_MANIFEST_H_
#define GPUCKPT_CORE_MANIFEST_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

inline constexpr int kManifestVersion = 2;

// How the process was left once its checkpoint was stored.
enum class CheckpointMode : uint8_t { kLeaveRunning, kKill };
std::string_view CheckpointModeName(CheckpointMode mode);  // "leave-running", "kill"

struct ManifestIds {
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// The user who asked for the checkpoint or import, with their groups: a
// restore never gives the tasks more than they had.
struct ManifestMaker {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
};

struct ManifestGpu {
  std::string name;
  std::string uuid;
  std::optional<uint64_t> memory_bytes;
};

// Device memory the driver moved into host memory: [start, end) of `pid`'s
// address space, that is, bytes of its pages image.
struct ManifestDeviceRange {
  int pid = 0;
  uint64_t start = 0;
  uint64_t end = 0;
};

// How long the checkpoint's steps took, in seconds.
struct ManifestStages {
  double dump_s = 0;
  std::optional<double> frozen_s;  // how long the job stood still
  std::string frozen_by;           // how that was measured ("" when not)
  std::optional<double> criu_frozen_s;
};

// A tree with a mount namespace of its own: the host path of its root
// directory, nullopt where it is not known (an imported container).
struct ManifestMountNamespace {
  std::optional<std::string> root;
};

// What a container engine's config.dump says of the container.
struct ManifestContainer {
  std::optional<std::string> name;
  std::optional<std::string> id;
  std::optional<std::string> image;
};

struct CheckpointManifest {
  int version = kManifestVersion;
  int pid = 0;  // the tree's root; 0 where none is known
  std::optional<std::string> command;
  // Who may read and restore it; absent: root.
  std::optional<ManifestIds> owner;
  // Absent in manifests written before it existed.
  std::optional<ManifestMaker> made_by;
  std::vector<int> tree;  // the pids CRIU dumped (own dumps only)
  std::optional<CheckpointMode> mode;
  std::optional<bool> shell_job;  // CRIU needed --shell-job
  std::optional<std::string> criu_version;
  // The GPU stacks it was made with; absent: unknown (plain image dirs).
  std::optional<GpuStacks> gpu_backend;
  std::optional<std::string> driver_version;
  std::optional<uint32_t> lock_timeout_ms;
  std::optional<ManifestMountNamespace> mount_namespace;
  std::vector<ManifestGpu> gpus;
  std::optional<uint64_t> device_memory_bytes;
  std::optional<std::string> parent;  // the previous checkpoint of the process
  std::vector<ManifestDeviceRange> cuda_host_ranges;
  std::optional<std::string> device_error;  // why no ranges were found
  std::optional<ManifestStages> stages;
  std::optional<uint64_t> staging_memory_bytes;
  std::optional<std::string> imported_from;  // absent: gpuckpt's own dump
  // Imports only: made by a restore of a copy from outside the mount (the
  // copy's checkpoint in this store), not by `import`.
  bool imported_by_restore = false;
  // Imports only: the fields of the copy's manifest that were malformed
  // and so not taken over (its `dropped`), so that a hand-edited copy
  // that lost something says what it lost.
  std::vector<std::string> import_dropped;
  std::optional<ManifestContainer> container;

  // Set by DecodeManifest: the paths of fields it read as absent because
  // they were malformed ("gpus[2]", "stages.dump_s"). Never encoded.
  std::vector<std::string> dropped;

  // Who may read and restore it (root where the manifest names nobody).
  ManifestIds OwnerOrRoot() const { return owner.value_or(ManifestIds{}); }
  // Who made it: made_by, else (manifests older than the field) the owner.
  ManifestMaker MakerOrOwner() const;
  bool IsOwnDump() const { return !imported_from.has_value(); }
};

// The JSON object text of `manifest` (version kManifestVersion).
std::string EncodeManifest(const CheckpointManifest& manifest);

// Reads a manifest's JSON object text. kCorruption when it is not a JSON
// object; kUnavailable when its version is newer than kManifestVersion.
// An empty text is an empty manifest (snapshots written without one).
Result<CheckpointManifest> DecodeManifest(std::string_view json);

// The manifest of a snapshot as the permission checks must see it: one
// that cannot be read names nobody (owner root, maker root), so that a
// damaged or newer manifest never grants anything.
CheckpointManifest ManifestOrEmpty(std::string_view json);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_MANIFEST_CHECKPOINT_MANIFEST_H_
