// Which checkpoint a path written to `restore` (or `import`ed) names.
//
// A path inside this daemon's mount is one of its checkpoints, whatever
// way it was written: as the mount's own path, or through a symlink or any
// other path that resolves into the mount (resolved with the caller's
// rights, as the kernel resolves it for them). It is restored as the
// checkpoint it is, with its recorded owner and maker, never imported anew
// as the caller's. Anything else is imported (import.cc).
//
// <pid>/checkpoints/<n|latest> names one of the checkpoints of that
// process, as its directory lists them (IsCheckpointOfProcess): made by
// the process's owner or by root for them, never one somebody else made
// or imported claiming that pid. For a process that is gone, a user's
// request means their own; root's the checkpoints of the process that last
// had that pid, told by the newest checkpoint gpuckpt's own dump made of
// it (an import says nothing of which process it was).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/base/display_text.h"
#include "core/base/unique_fd.h"
#include "core/engine/engine_impl.h"
#include "core/engine/engine_internal.h"
#include "core/proc/acting_as.h"
#include "core/proc/mount_table.h"

namespace gpuckpt {
namespace {

// "/a//b/./c/../d/" -> "/a/b/d"; only for recognising paths in the mount.
std::string Normalize(const std::string& path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    const std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

std::vector<std::string> Split(const std::string& rel) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= rel.size()) {
    size_t j = rel.find('/', i);
    if (j == std::string::npos) j = rel.size();
    if (j > i) parts.push_back(rel.substr(i, j - i));
    i = j + 1;
  }
  return parts;
}

// `path` relative to the directory `dir` (both normalized) when it lies
// below it; nullopt otherwise.
std::optional<std::string> Below(const std::string& path, const std::string& dir) {
  if (path.compare(0, dir.size() + 1, dir + "/") != 0) return std::nullopt;
  return path.substr(dir.size() + 1);
}

// The device of the gpuckpt mount at `mountpoint`; nullopt when none is
// mounted there (an engine without a mount, as in tests).
std::optional<dev_t> MountDevice(const std::string& mountpoint) {
  auto mounts = ReadMountTable();
  if (!mounts.ok()) return std::nullopt;
  std::optional<dev_t> device;
  for (const MountEntry& m : *mounts) {
    if (m.mountpoint != mountpoint) continue;
    device.reset();  // the last mount at a place hides those before it
    unsigned major_number = 0;
    unsigned minor_number = 0;
    if (m.type == kGpuckptMountType &&
        std::sscanf(m.device.c_str(), "%u:%u", &major_number, &minor_number) == 2)
      device = makedev(major_number, minor_number);
  }
  return device;
}

// The pid of "<pid>" in a mount path, or 0.
int PidOf(const std::string& part) {
  char* end = nullptr;
  const long pid = std::strtol(part.c_str(), &end, 10);
  if (part.empty() || *end != '\0' || pid <= 0 || pid > (1 << 22)) return 0;
  return static_cast<int>(pid);
}

// "<id>.tar" -> "<id>"; "" for anything else.
std::string ArchiveId(const std::string& name) {
  constexpr std::string_view kTar = ".tar";
  if (name.size() <= kTar.size() || !name.ends_with(kTar)) return "";
  return name.substr(0, name.size() - kTar.size());
}

}  // namespace

Result<std::optional<std::string>> EngineImpl::MountRelativePath(int fd,
                                                                 const std::string& path) const {
  const std::string mnt = Normalize(options_.mountpoint);
  struct stat st {};
  if (fstat(fd, &st) != 0) return StatusFromErrno(errno, DisplayText(path));
  const std::optional<dev_t> device = MountDevice(mnt);
  if (!device || st.st_dev != *device) return std::optional<std::string>();
  // Where the kernel resolved it to: the descriptor's own path.
  char target[PATH_MAX + 1];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), target, PATH_MAX);
  if (n < 0) return StatusFromErrno(errno, link);
  const std::string resolved = Normalize(std::string(target, static_cast<size_t>(n)));
  if (resolved == mnt) return std::optional<std::string>(std::string());
  if (auto rel = Below(resolved, mnt)) return rel;
  return Status::InvalidArgument(
      fmt::format("{} leads into gpuckpt's mount through another mount point ({}): name the "
                  "checkpoint by its path under {}",
                  DisplayText(path), DisplayText(resolved), mnt));
}

Result<std::string> EngineImpl::CheckpointAt(const std::string& relative, const std::string& path,
                                             const Caller& caller) {
  const auto parts = Split(relative);
  const auto not_a_checkpoint = [&] {
    return Status::InvalidArgument(DisplayText(path) +
                                   " is not a checkpoint directory of this mount");
  };
  std::string id;
  if (parts.size() >= 2 && parts[0] == "checkpoints" &&
      (parts.size() == 2 || (parts.size() == 3 && parts[2] == "images"))) {
    id = parts[1];
  } else if (parts.size() == 2 && parts[0] == "archives") {
    id = ArchiveId(parts[1]);
  } else if (parts.size() == 3 && parts[1] == "checkpoints") {
    const int pid = PidOf(parts[0]);
    if (pid == 0) return not_a_checkpoint();
    GPUCKPT_ASSIGN_OR_RETURN(id, CheckpointOfProcess(pid, parts[2], caller));
  }
  if (id.empty()) return not_a_checkpoint();
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store_->Get(id));
  // Somebody else's checkpoint is absent to the caller, as in the mount.
  if (!caller.is_root() && OwnerOf(info).uid != caller.uid)
    return Status::NotFound("no checkpoint " + id);
  return id;
}

Result<std::string> EngineImpl::CheckpointOfProcess(int pid, const std::string& which,
                                                    const Caller& caller) {
  std::optional<uint32_t> owner;
  if (auto process = processes_->Get(pid); process.ok()) {
    owner = process->creds.ruid;
  } else if (!caller.is_root()) {
    owner = caller.uid;
  }
  // For root, of a pid no process has: the process that last had it, the
  // owner of the newest checkpoint gpuckpt itself dumped of it.
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<std::string> mine,
                           catalog_.CheckpointsOfProcess(pid, owner));
  if (which == "latest" && !mine.empty()) return mine.back();
  char* end = nullptr;
  const unsigned long n = std::strtoul(which.c_str(), &end, 10);
  if (!which.empty() && *end == '\0' && n >= 1 && n <= mine.size()) return mine[n - 1];
  return Status::InvalidArgument(
      fmt::format("{}/checkpoints/{} is not a checkpoint directory of this mount: process {} has "
                  "{} checkpoint{}",
                  pid, DisplayText(which), pid, mine.size(), mine.size() == 1 ? "" : "s"));
}

Result<std::string> EngineImpl::ResolveRestoreSource(const RestoreRequest& request,
                                                     bool* imported) {
  *imported = false;
  const std::string& path = request.path;
  if (path.empty()) return Status::InvalidArgument("write the path of a checkpoint to restore");
  if (path[0] != '/')
    return Status::InvalidArgument("'" + DisplayText(path) + "' is not an absolute path");
  // The mount's own paths are known without asking the filesystem.
  if (auto rel = Below(Normalize(path), Normalize(options_.mountpoint)))
    return CheckpointAt(*rel, path, request.caller);
  // Any other path that the caller's own lookup leads into the mount.
  UniqueFd found;
  {
    GPUCKPT_ASSIGN_OR_RETURN(auto as_caller, ActingAs::Begin(request.caller));
    found = UniqueFd(open(path.c_str(), O_PATH | O_CLOEXEC));
  }
  if (found.get() >= 0) {
    GPUCKPT_ASSIGN_OR_RETURN(std::optional<std::string> rel, MountRelativePath(found.get(), path));
    if (rel) return CheckpointAt(*rel, path, request.caller);
  }
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info,
                           ImportFrom(path, "", request.caller, /*for_restore=*/true));
  *imported = true;
  return info.id;
}

}  // namespace gpuckpt
