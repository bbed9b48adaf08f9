// Engine::Import: a checkpoint from outside the mount into the store, as a
// checkpoint of its own (deduplication makes that cost only what is new).
// What it takes:
//  - a copy of a checkpoint (manifest.json, images/), as `cp -r` of
//    checkpoints/<id> makes it;
//  - CRIU's own directory of images (pstree.img at its top);
//  - a container checkpoint as Podman and CRI-O write it: the archive (tar,
//    tar.gz, tar.zst) or its extracted directory (checkpoint/pstree.img),
//    stored as images/ and container/ (core/snapshot/container_archive.h);
//    the mount's own archives/<id>.tar are such archives.
//
// The path is the caller's to resolve, with their rights (ActingAs), so it
// tells nobody what lies in directories they cannot read; nothing is
// followed or opened blocking. Rights follow the data: what it names (the
// archive, or every directory, file and symlink below the directory) must
// belong to one user, whose checkpoint the import becomes: the caller's
// own files for an ordinary user, and for root whoever owns them (root
// only for root's files), so that root's import of a user's copy is that
// user's and is restored with their rights only. A path that reaches into
// this daemon's own mount (a symlink included) is that checkpoint, with
// its recorded owner and maker. A copied manifest is believed only for how
// to restore (the GPU stack, its GPUs, --shell-job; the root directory of
// a mount namespace only where root made the copy), never for owners or
// sizes.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/base/display_text.h"
#include "core/base/log.h"
#include "core/base/small_file.h"
#include "core/base/unique_fd.h"
#include "core/criu/images.h"
#include "core/engine/engine_impl.h"
#include "core/engine/engine_internal.h"
#include "core/proc/acting_as.h"
#include "core/snapshot/container_archive.h"

namespace gpuckpt {
namespace {

// Image records gpuckpt parses are small; a bigger one is not CRIU's.
constexpr uint64_t kMaxParsedImage = 64u << 20;
// A checkpoint's manifest is a few KiB (a few hundred bytes per GPU and
// per range of device memory); what a copy brings is read only this far.
constexpr uint64_t kMaxCopiedManifest = 1u << 20;
// How many "-2", "-3", ... an import named after its file tries.
constexpr int kNameAttempts = 100;

// Takes over into `manifest` what a copied manifest (its text) says of how
// to restore the checkpoint, each field as DecodeManifest reads it (a
// malformed one is left out); the rest (owner, sizes) is the import's own.
Status TakeOverManifest(const std::string& text, const std::string& shown,
                        const ManifestMaker& made_by, CheckpointManifest* manifest) {
  auto copied = nlohmann::json::parse(text, nullptr, false);
  if (copied.is_discarded()) return Status::InvalidArgument(shown + " is not JSON");
  const nlohmann::json* from = nullptr;
  if (copied.is_object() && copied.contains("extra") && copied["extra"].is_object())
    from = &copied["extra"];
  else if (copied.is_object())
    from = &copied;
  if (from == nullptr) return Status::Ok();
  Result<CheckpointManifest> read = DecodeManifest(from->dump());
  if (!read.ok()) return read.status().WithContext(shown);
  const CheckpointManifest& c = *read;
  manifest->gpu_backend = c.gpu_backend;
  manifest->driver_version = c.driver_version;
  manifest->shell_job = c.shell_job;
  manifest->gpus = c.gpus;
  // Where a tree with a mount namespace of its own had its root: a
  // directory that root's restore mounts, so taken over only from what
  // root made (anyone else's restore cannot make a mount namespace anyway).
  if (c.mount_namespace)
    manifest->mount_namespace =
        ManifestMountNamespace{made_by.uid == 0 ? c.mount_namespace->root : std::nullopt};
  // The device memory ranges, from which the mount shows device/<id> again
  // (a copy's own device/ is never imported: it is the same bytes as its
  // pages image). Checked for their form only: they name bytes of the
  // copy's own images, which core/engine/device_view.h reads.
  manifest->cuda_host_ranges = c.cuda_host_ranges;
  // A malformed field was read as absent rather than failing the import
  // (a copy edited by hand still restores); the new manifest and the log
  // say which, since a range or a GPU left out changes what is shown.
  manifest->import_dropped = c.dropped;
  if (!c.dropped.empty())
    spdlog::warn("import uid={} manifest={} ignored={}", made_by.uid, LogValue(DisplayText(shown)),
                 LogValue(DisplayText(fmt::format("{}", fmt::join(c.dropped, ",")))));
  return Status::Ok();
}

// What Podman's config.dump says of the container, for people reading the
// manifest: its name, id and image, strings only, each cut short.
ManifestContainer ContainerSummary(const std::optional<std::string>& config) {
  ManifestContainer out;
  if (!config) return out;
  auto parsed = nlohmann::json::parse(*config, nullptr, false);
  if (!parsed.is_object()) return out;
  auto field = [&](const char* name) -> std::optional<std::string> {
    if (!parsed.contains(name) || !parsed[name].is_string()) return std::nullopt;
    return DisplayText(parsed[name].get<std::string>().substr(0, 256));
  };
  out.name = field("name");
  out.id = field("id");
  out.image = field("rootfsImageName");
  return out;
}

// The whole of `name` in `dir_fd`, a file a user handed in: the name is not
// followed if it is a symlink, a FIFO or device is not opened blocking, and
// the descriptor must be a regular file of `owner` (when given) no larger
// than `max_bytes`.
Result<std::string> ReadWholeFile(int dir_fd, const std::string& name, const std::string& shown,
                                  std::optional<uint32_t> owner, uint64_t max_bytes) {
  SmallFileRead how(shown, max_bytes);
  how.too_large = StatusCode::kInvalidArgument;
  how.owner = owner;
  return ReadSmallFileNoFollowAt(dir_fd, name, how);
}

// The root task's pid of CRIU's pstree.img. Bytes that are no pstree image
// are the caller's bad input (kInvalidArgument), not damage to the store.
Result<int> RootPidOf(const std::string& pstree, const std::string& shown) {
  auto tasks = ParsePstreeImage(pstree, shown);
  if (!tasks.ok())
    return Status::InvalidArgument(shown + " is not a CRIU process tree image (" +
                                   tasks.status().message() + ")");
  auto root =
      std::find_if(tasks->begin(), tasks->end(), [](const CriuTask& t) { return t.ppid == 0; });
  if (root == tasks->end()) return Status::InvalidArgument(shown + " names no process");
  return static_cast<int>(root->pid);
}

// The name a container checkpoint gets when the caller gives none: its
// file's name without the archive's extensions ("ctr.tar.zst" -> "ctr"),
// other characters than a name may hold replaced by '_'; "container" when
// nothing is left that a name may be.
std::string NameFromPath(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  for (const char* ext : {".tar.gz", ".tar.zst", ".tar.xz", ".tgz", ".tzst", ".tar"}) {
    const std::string e = ext;
    if (base.size() > e.size() && base.compare(base.size() - e.size(), e.size(), e) == 0) {
      base.resize(base.size() - e.size());
      break;
    }
  }
  for (char& c : base)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  base = base.substr(0, 100);
  // "1002.web" is the form of uid 1002's id for their name "web", which a
  // name of root's must not take: "1002_web".
  if (HasUserIdForm(base)) base[base.find('.')] = '_';
  if (base.empty() || base[0] == '.' || !CheckCheckpointName(base).ok()) return "container";
  return base;
}

// Whether the file starts as a tar archive (ustar or GNU magic), or as
// gzip, zstd or xz data (libarchive then tells whether a tar is inside):
// anything else is refused before its owner is even looked at.
bool LooksLikeArchive(int fd) {
  unsigned char head[512] = {};
  const ssize_t n = pread(fd, head, sizeof head, 0);
  if (n < 6) return false;
  auto starts = [&](std::initializer_list<unsigned char> magic) {
    return std::equal(magic.begin(), magic.end(), head);
  };
  if (starts({0x1f, 0x8b}) || starts({0x28, 0xb5, 0x2f, 0xfd}) ||
      starts({0xfd, '7', 'z', 'X', 'Z', 0x00}))
    return true;
  return n == sizeof head && std::memcmp(head + 257, "ustar", 5) == 0;
}

// Whether CRIU dumped a mount namespace into the directory of images
// (mountpoints-<id>.img).
bool HasMountpointsImage(int images_fd) {
  const int fd = dup(images_fd);
  if (fd < 0) return false;
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    close(fd);
    return false;
  }
  rewinddir(dir);
  bool found = false;
  while (dirent* e = readdir(dir))
    if (std::strncmp(e->d_name, "mountpoints-", 12) == 0) found = true;
  closedir(dir);
  return found;
}

}  // namespace

Result<SnapshotInfo> EngineImpl::Import(const std::string& path, const std::string& name,
                                        const Caller& caller) {
  if (path.empty() || path[0] != '/')
    return Status::InvalidArgument("import needs an absolute path");
  auto info = ImportFrom(path, name, caller);
  NoteStoreChanged();
  metrics_.CountOperation("import", info.ok() ? "ok" : ResultLabel(info.status().code()));
  if (info.ok()) {
    spdlog::info(
        "import uid={} path={} id={} result=ok logical_bytes={} new_bytes={} stored_bytes={} "
        "total_s={:.3f}",
        caller.uid, LogValue(DisplayText(path)), LogValue(info->id), info->logical_bytes,
        info->new_bytes, info->stored_bytes, info->duration_s);
  } else {
    LogOperationEnd(info.status(), "import uid={} path={} result={} error={}", caller.uid,
                    LogValue(DisplayText(path)), ResultLabel(info.status().code()),
                    LogValue(info.status().message()));
  }
  return info;
}

Result<SnapshotInfo> EngineImpl::ImportFrom(const std::string& path, const std::string& name,
                                            const Caller& caller, bool for_restore) {
  if (!name.empty()) GPUCKPT_RETURN_IF_ERROR(CheckCheckpointName(name));
  // The path is the caller's to resolve: with their rights, so that it
  // reaches nothing they could not, and its error says no more than theirs
  // would.
  UniqueFd top;
  {
    GPUCKPT_ASSIGN_OR_RETURN(auto as_caller, ActingAs::Begin(caller));
    top = UniqueFd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  }
  const std::string shown = DisplayText(path);
  if (top.get() < 0) return StatusFromErrno(errno, shown);
  struct stat st {};
  if (fstat(top.get(), &st) != 0) return StatusFromErrno(errno, shown);
  if (!S_ISDIR(st.st_mode) && !(S_ISREG(st.st_mode) && LooksLikeArchive(top.get())))
    return Status::InvalidArgument(shown +
                                   " is neither a directory of images nor a container checkpoint "
                                   "archive (tar, tar.gz, tar.zst)");
  GPUCKPT_ASSIGN_OR_RETURN(ImportSource source,
                           AttributeImport(top.get(), st.st_uid, path, name, caller));
  source.for_restore = for_restore;
  // A directory's entries are checked as they are read, each its owner's.
  if (S_ISDIR(st.st_mode)) return ImportDirectory(top.get(), source);
  return ImportContainerArchive(top.get(), source);
}

Result<EngineImpl::ImportSource> EngineImpl::AttributeImport(int top_fd, uint32_t file_uid,
                                                             const std::string& path,
                                                             const std::string& name,
                                                             const Caller& caller) {
  ImportSource source{path, DisplayText(path), name, caller, caller, MakerRecordOf(caller)};
  // One of this mount's checkpoints (or its archives/<id>.tar), reached
  // through whatever path: it stays what it was, its owner's and made by
  // whoever made it.
  GPUCKPT_ASSIGN_OR_RETURN(std::optional<std::string> in_mount, MountRelativePath(top_fd, path));
  if (in_mount) {
    GPUCKPT_ASSIGN_OR_RETURN(const std::string id, CheckpointAt(*in_mount, path, caller));
    GPUCKPT_ASSIGN_OR_RETURN(const SnapshotInfo info, store_->Get(id));
    const SnapshotOwner owner = OwnerOf(info);
    const SnapshotMaker maker = MakerOf(info);
    source.owner = Caller{.uid = owner.uid, .gid = owner.gid};
    source.made_by = ManifestMaker{maker.uid, maker.gid, maker.groups};
    return source;
  }
  if (!caller.is_root()) {
    // Someone else's checkpoint is absent to a user, as in the mount's
    // listings (ENOENT), whoever's it is.
    if (file_uid != caller.uid)
      return Status::NotFound("no checkpoint of yours at " + source.shown);
    return source;
  }
  // Root's import of files root does not own is their owner's checkpoint;
  // every entry below must then be theirs too (ImportDirectory).
  if (file_uid == 0) return source;
  auto owner = UserCaller(file_uid);
  if (!owner.ok())
    return Status::PermissionDenied(
        fmt::format("{} belongs to uid {}, whose checkpoint it would be: {}", source.shown,
                    file_uid, owner.status().message()));
  source.owner = *owner;
  source.made_by = MakerRecordOf(*owner);
  return source;
}

Result<SnapshotInfo> EngineImpl::ImportDirectory(int top_fd, const ImportSource& source) {
  const std::string& shown = source.shown;
  const std::optional<uint32_t> owner = source.owner.uid;
  // A copy of a checkpoint (images/; older versions' copies also hold
  // device/, never read: the same bytes as its pages image), an extracted
  // container checkpoint (checkpoint/), or CRIU's own directory of images.
  struct stat st {};
  std::string images_name;  // "" for the top itself
  bool container = false;
  if (fstatat(top_fd, "images/pstree.img", &st, AT_SYMLINK_NOFOLLOW) == 0) {
    images_name = "images";
  } else if (fstatat(top_fd, "checkpoint/pstree.img", &st, AT_SYMLINK_NOFOLLOW) == 0) {
    images_name = kContainerImagesDir;
    container = true;
  } else if (fstatat(top_fd, "pstree.img", &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return Status::InvalidArgument(shown +
                                   " is not a checkpoint: it has no pstree.img (nor "
                                   "images/pstree.img, nor a container checkpoint's "
                                   "checkpoint/pstree.img)");
  }
  UniqueFd images_fd(images_name.empty()
                         ? dup(top_fd)
                         : openat(top_fd, images_name.c_str(),
                                  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  const std::string images_shown = images_name.empty() ? shown : shown + "/" + images_name;
  if (images_fd.get() < 0) return StatusFromErrno(errno, images_shown);
  GPUCKPT_ASSIGN_OR_RETURN(
      std::string pstree, ReadWholeFile(images_fd.get(), "pstree.img", images_shown + "/pstree.img",
                                        owner, kMaxParsedImage));
  GPUCKPT_ASSIGN_OR_RETURN(const int pid, RootPidOf(pstree, images_shown + "/pstree.img"));

  CheckpointManifest manifest = ImportManifest(source, pid);
  std::optional<std::string> config;
  if (container) {
    auto text =
        ReadWholeFile(top_fd, "config.dump", shown + "/config.dump", owner, kMaxCopiedManifest);
    if (text.ok()) config = std::move(*text);
    manifest.container = ContainerSummary(config);
  }
  if (!images_name.empty()) {
    auto copied =
        ReadWholeFile(top_fd, "manifest.json", shown + "/manifest.json", owner, kMaxCopiedManifest);
    // A copy may lack its manifest (it is advisory: CRIU's images are the
    // checkpoint), but one that is there must be a plain, small file of the
    // caller's that parses.
    if (!copied.ok() && copied.status().code() != StatusCode::kNotFound) return copied.status();
    if (copied.ok())
      GPUCKPT_RETURN_IF_ERROR(
          TakeOverManifest(*copied, shown + "/manifest.json", source.made_by, &manifest));
  }
  // A tree with a mount namespace of its own needs its root directory to
  // be restored, which CRIU's images do not say (nor a container engine's
  // files): a restore then asks for --root.
  if (HasMountpointsImage(images_fd.get()) && !manifest.mount_namespace)
    manifest.mount_namespace = ManifestMountNamespace{};
  // Bounded before anything is read: at most its data (holes cost
  // nothing) can be new.
  const AddDirectoryOptions images{"images", owner, nullptr};
  const AddDirectoryOptions rest{kContainerFilesDir, owner, IsContainerFile};
  GPUCKPT_ASSIGN_OR_RETURN(DirectoryMeasure measure,
                           MeasureDirectory(images_fd.get(), images_shown, images));
  if (container) {
    GPUCKPT_ASSIGN_OR_RETURN(DirectoryMeasure files, MeasureDirectory(top_fd, shown, rest));
    measure.data_bytes += files.data_bytes;
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto reserved, ReserveForImport(source, measure.data_bytes));
  const std::string auto_name = container ? NameFromPath(source.path) : "";
  return CommitImport(source, auto_name, pid, manifest,
                      [&](SnapshotWriter* writer, CheckpointManifest*) -> Status {
                        GPUCKPT_RETURN_IF_ERROR(
                            AddDirectoryToSnapshot(writer, images_fd.get(), images_shown, images));
                        if (!container) return Status::Ok();
                        return AddDirectoryToSnapshot(writer, top_fd, shown, rest);
                      });
}

Result<SnapshotInfo> EngineImpl::ImportContainerArchive(int fd, const ImportSource& source) {
  ContainerImportOptions options;
  options.uid = source.owner.uid;
  options.gid = source.owner.gid;
  options.max_parsed_bytes = kMaxParsedImage;
  // How much it expands to is known only as it is read: an ordinary
  // user's may add what their quota has room for, and stops there (root's,
  // what the archive could expand to, for the owner's quota's sake).
  struct stat st {};
  if (fstat(fd, &st) != 0) return StatusFromErrno(errno, source.shown);
  const uint64_t expands_to = static_cast<uint64_t>(st.st_size) * options.max_expansion;
  uint64_t room = expands_to;
  if (!source.caller.is_root()) {
    GPUCKPT_ASSIGN_OR_RETURN(room, quota_.Remaining(source.owner.uid));
    options.max_member_bytes = std::max<uint64_t>(room, 1);  // 0 would mean no limit
    if (room == std::numeric_limits<uint64_t>::max()) {      // no quota
      room = expands_to;
      options.max_member_bytes = 0;
    }
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto reserved, ReserveForImport(source, room));
  // The archive is read once, as it comes: its root task (for the
  // manifest) is known only once its pstree.img has gone by.
  return CommitImport(
      source, NameFromPath(source.path), /*pid=*/0, ImportManifest(source, 0),
      [&](SnapshotWriter* writer, CheckpointManifest* manifest) -> Status {
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        GPUCKPT_ASSIGN_OR_RETURN(ContainerImport found,
                                 AddContainerArchiveToSnapshot(writer, fd, source.shown, options));
        GPUCKPT_ASSIGN_OR_RETURN(const int pid,
                                 RootPidOf(found.pstree, source.shown + ": checkpoint/pstree.img"));
        manifest->pid = pid;
        if (found.manifest) {
          GPUCKPT_RETURN_IF_ERROR(TakeOverManifest(
              *found.manifest, source.shown + ": manifest.json", source.made_by, manifest));
        }
        // One of the mount's own archives of a checkpoint made through
        // `ctl` holds no container files: it is a plain checkpoint again.
        if (found.config || !found.manifest) manifest->container = ContainerSummary(found.config);
        if (found.mount_namespace && !manifest->mount_namespace)
          manifest->mount_namespace = ManifestMountNamespace{};
        return Status::Ok();
      });
}

Result<std::unique_ptr<QuotaLedger::Reservation>> EngineImpl::ReserveForImport(
    const ImportSource& source, uint64_t worst_case_bytes) {
  return quota_.Reserve(source.caller, source.owner.uid, worst_case_bytes,
                        "the import of " + source.shown);
}

CheckpointManifest EngineImpl::ImportManifest(const ImportSource& source, int pid) const {
  CheckpointManifest m;
  m.pid = pid;
  m.owner = ManifestIds{source.owner.uid, source.owner.gid};
  m.made_by = source.made_by;
  m.imported_from = source.shown;
  m.imported_by_restore = source.for_restore;
  return m;
}

Result<SnapshotInfo> EngineImpl::CommitImport(const ImportSource& source,
                                              const std::string& auto_name, int pid,
                                              CheckpointManifest manifest, const ImportFill& fill) {
  // Names, dedup domain and quota are the owner's: root's import of a
  // user's copy is theirs as if they had imported it.
  const Caller& caller = source.owner;
  for (int attempt = 0;; ++attempt) {
    std::string id;
    if (!source.name.empty()) {
      GPUCKPT_ASSIGN_OR_RETURN(id, CheckpointIdForName(source.name, caller));
    } else if (!auto_name.empty()) {
      GPUCKPT_ASSIGN_OR_RETURN(
          id,
          CheckpointIdForName(
              attempt == 0 ? auto_name : auto_name + "-" + std::to_string(attempt + 1), caller));
    } else {
      GPUCKPT_ASSIGN_OR_RETURN(id, NextCheckpointName(pid));
    }
    // No extra yet: `fill` may complete the manifest, which the writer is
    // given before its commit; nothing reads it before.
    // A restore's import says so where listings show the source.
    auto writer =
        store_->BeginSnapshot({id, source.for_restore ? "restore of " + source.shown : source.shown,
                               /*extra_json=*/"", /*base=*/"", DedupDomainFor(caller.uid)});
    if (!writer.ok()) {
      // The name is taken (by another checkpoint of this pid meanwhile, or
      // by an earlier import of a file of the same name): the next one.
      const int attempts = auto_name.empty() ? 8 : kNameAttempts;
      if (writer.status().code() == StatusCode::kAlreadyExists && source.name.empty() &&
          attempt < attempts)
        continue;
      return writer.status();
    }
    // The caller may give up (interrupt their write): the writer then
    // stops reading at once, and nothing is stored.
    (*writer)->SetCancel([cancel = source.caller.interrupted] {
      return cancel && cancel->load(std::memory_order_relaxed);
    });
    GPUCKPT_RETURN_IF_ERROR(fill(writer->get(), &manifest));
    (*writer)->SetExtraJson(EncodeManifest(manifest));
    GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, (*writer)->Commit());
    catalog_.Add(info);
    NoteStoreChanged();
    // What an import adds is known only once it is stored: one that took
    // its owner beyond their quota after all is removed again (what it
    // came from is where it was).
    if (Status quota = quota_.CheckHeld(source.caller, caller.uid, "the import of " + source.shown);
        !quota.ok()) {
      store_->Remove(info.id).PermitUnchecked();
      NoteRemoved(info.id, info.key);
      return quota;
    }
    return info;
  }
}

}  // namespace gpuckpt
