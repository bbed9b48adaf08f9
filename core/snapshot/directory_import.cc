// Store::ImportDirectory: walks a source tree with one directory fd per
// level (openat with O_NOFOLLOW), so a symlink swapped in during the walk is
// stored as a symlink, never followed out of the tree.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/base/unique_fd.h"
#include "core/snapshot/fd_source.h"
#include "core/snapshot/store_impl.h"

namespace gpuckpt {
namespace {

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// Sorted names of a directory, without "." and "..".
Result<std::vector<std::string>> ReadNames(int dir_fd, const std::string& shown) {
  const int dup_fd = dup(dir_fd);
  if (dup_fd < 0) return StatusFromErrno(errno, "reading directory '" + shown + "'");
  DIR* d = fdopendir(dup_fd);
  if (d == nullptr) {
    close(dup_fd);
    return StatusFromErrno(errno, "reading directory '" + shown + "'");
  }
  rewinddir(d);
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
    errno = 0;
  }
  const int err = errno;
  closedir(d);
  if (err != 0) return StatusFromErrno(err, "reading directory '" + shown + "'");
  std::sort(names.begin(), names.end());
  return names;
}

FileEntry EntryFromStat(const std::string& path, const struct stat& st) {
  FileEntry e;
  e.path = path;
  e.mode = st.st_mode & 07777;
  e.uid = st.st_uid;
  e.gid = st.st_gid;
  e.size = static_cast<uint64_t>(st.st_size);
  e.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return e;
}

bool SameVersion(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_dev == b.st_dev && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
         a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

struct Walk {
  SnapshotWriter* writer;     // null while measuring
  DirectoryMeasure* measure;  // what the walk counts instead of adding
  const std::string& root;
  const ProgressFn& progress;
  uint64_t total;
  std::string dest_prefix;                              // prepended to every stored path
  std::optional<uint32_t> owner;                        // every entry must belong to this uid
  std::function<bool(const std::string&)> include_top;  // empty: all

  Status CheckOwner(const std::string& shown, const struct stat& st) const {
    if (!owner || st.st_uid == *owner) return Status::Ok();
    return Status::PermissionDenied(shown + " belongs to uid " + std::to_string(st.st_uid) +
                                    ", not to uid " + std::to_string(*owner));
  }

  // The tree's top directory `st`, under `dest_prefix` when there is one.
  Status Top(int dir_fd, const struct stat& st, const std::string& prefix) {
    GPUCKPT_RETURN_IF_ERROR(CheckOwner(root, st));
    if (!prefix.empty()) {
      FileEntry e = EntryFromStat(prefix, st);
      e.type = FileType::kDirectory;
      GPUCKPT_RETURN_IF_ERROR(Add(e));
    }
    return Dir(dir_fd, "", 0);
  }

  Status Dir(int dir_fd, const std::string& rel, int depth) {
    if (depth > 256)
      return Status::InvalidArgument("directory tree under " + root + " is too deep");
    GPUCKPT_ASSIGN_OR_RETURN(auto names, ReadNames(dir_fd, Join(root, rel)));
    for (const auto& name : names) {
      if (depth == 0 && include_top && !include_top(name)) continue;
      const std::string path = Join(rel, name);
      const std::string shown = root + "/" + path;
      struct stat st {};
      if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        return StatusFromErrno(errno, shown);
      }
      GPUCKPT_RETURN_IF_ERROR(CheckOwner(shown, st));
      FileEntry e = EntryFromStat(Join(dest_prefix, path), st);
      if (S_ISDIR(st.st_mode)) {
        e.type = FileType::kDirectory;
        GPUCKPT_RETURN_IF_ERROR(Add(e));
        UniqueFd sub(openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (sub.get() < 0) return StatusFromErrno(errno, shown);
        GPUCKPT_RETURN_IF_ERROR(Dir(sub.get(), path, depth + 1));
      } else if (S_ISLNK(st.st_mode)) {
        std::vector<char> target(PATH_MAX + 1);
        const ssize_t n = readlinkat(dir_fd, name.c_str(), target.data(), target.size());
        if (n < 0) return StatusFromErrno(errno, shown);
        if (static_cast<size_t>(n) >= target.size())
          return Status::InvalidArgument(shown + ": symlink target too long");
        e.type = FileType::kSymlink;
        e.size = 0;
        e.symlink_target.assign(target.data(), static_cast<size_t>(n));
        GPUCKPT_RETURN_IF_ERROR(Add(e));
      } else if (S_ISREG(st.st_mode)) {
        GPUCKPT_RETURN_IF_ERROR(File(dir_fd, name, shown, e, st));
      } else {
        return Status::InvalidArgument(shown +
                                       " is not a regular file, directory or symlink; "
                                       "snapshots hold only those");
      }
    }
    return Status::Ok();
  }

  Status Add(const FileEntry& e) {
    if (measure == nullptr) return writer->AddEntry(e);
    ++measure->entries;
    return Status::Ok();
  }

  // The bytes AddFile() would read of `fd`, without reading them.
  Status Measure(int fd, const std::string& shown, const struct stat& st) {
    FdSource source(fd, shown);
    for (;;) {
      GPUCKPT_ASSIGN_OR_RETURN(const SnapshotWriter::SparseSource::Run run, source.NextRun());
      if (run.end) break;
      GPUCKPT_ASSIGN_OR_RETURN(const uint64_t n, source.SkipRun());
      measure->data_bytes += n;
    }
    ++measure->entries;
    measure->logical_bytes += static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }

  Status File(int dir_fd, const std::string& name, const std::string& shown, FileEntry e,
              const struct stat& walked) {
    // Non-blocking: a FIFO swapped in since the walk saw a file must not
    // hold the daemon (the type is checked on the descriptor below).
    UniqueFd fd(
        openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    if (fd.get() < 0) return StatusFromErrno(errno, shown);
    struct stat before {};
    if (fstat(fd.get(), &before) != 0) return StatusFromErrno(errno, shown);
    if (!S_ISREG(before.st_mode) || !SameVersion(before, walked)) {
      return Status::Aborted(shown + " changed during import; nothing was stored, try again");
    }
    if (measure != nullptr) return Measure(fd.get(), shown, before);
    posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    // Holes included: a sparse file's holes are taken without reading.
    const uint64_t read_before = writer->bytes_read();
    GPUCKPT_RETURN_IF_ERROR(writer->AddFile(e, fd.get()));
    struct stat after {};
    if (fstat(fd.get(), &after) != 0) return StatusFromErrno(errno, shown);
    if (!SameVersion(before, after) ||
        writer->bytes_read() - read_before != static_cast<uint64_t>(before.st_size)) {
      return Status::Aborted(shown + " changed during import; nothing was stored, try again");
    }
    if (progress) progress(writer->bytes_read(), total);
    return Status::Ok();
  }
};

}  // namespace

namespace {
std::string CanonicalDir(const std::string& p) {
  char* real = realpath(p.c_str(), nullptr);
  std::string out = real != nullptr ? real : p;
  free(real);
  if (out.empty() || out.back() != '/') out += '/';
  return out;
}
}  // namespace

bool IsInside(const std::string& path, const std::string& dir) {
  const std::string p = CanonicalDir(path);
  const std::string d = CanonicalDir(dir);
  return p.compare(0, d.size(), d) == 0;
}

bool PathsOverlap(const std::string& a, const std::string& b) {
  return IsInside(a, b) || IsInside(b, a);
}

Status AddDirectoryToSnapshot(SnapshotWriter* writer, int dir_fd, const std::string& shown_root,
                              const AddDirectoryOptions& options) {
  struct stat st {};
  if (fstat(dir_fd, &st) != 0) return StatusFromErrno(errno, shown_root);
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(shown_root + " is not a directory");
  Walk walk{writer,
            nullptr,
            shown_root,
            nullptr,
            0,
            options.dest_prefix,
            options.required_owner,
            options.include_top};
  return walk.Top(dir_fd, st, options.dest_prefix);
}

Result<DirectoryMeasure> MeasureDirectory(int dir_fd, const std::string& shown_root,
                                          const AddDirectoryOptions& options) {
  struct stat st {};
  if (fstat(dir_fd, &st) != 0) return StatusFromErrno(errno, shown_root);
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(shown_root + " is not a directory");
  DirectoryMeasure measure;
  Walk walk{nullptr,
            &measure,
            shown_root,
            nullptr,
            0,
            options.dest_prefix,
            options.required_owner,
            options.include_top};
  GPUCKPT_RETURN_IF_ERROR(walk.Top(dir_fd, st, options.dest_prefix));
  return measure;
}

Result<SnapshotInfo> StoreImpl::ImportDirectory(const std::string& src_dir,
                                                const SnapshotSpec& spec_in,
                                                const ProgressFn& progress) {
  UniqueFd root(open(src_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (root.get() < 0) {
    if (errno == ENOTDIR)
      return Status::InvalidArgument("source " + src_dir + " is not a directory");
    return StatusFromErrno(errno, "source " + src_dir);
  }
  SnapshotSpec spec = spec_in;
  char* real = realpath(src_dir.c_str(), nullptr);
  const std::string real_src = real != nullptr ? real : src_dir;
  free(real);
  if (PathsOverlap(real_src, dir())) {
    return Status::InvalidArgument("source " + src_dir + " and the store " + dir() + " overlap");
  }
  if (spec.source.empty()) spec.source = real_src;
  // The total for progress: what the files say, holes included, as the
  // writer counts what it read. A tree that cannot be measured fails the
  // walk below for the same reason.
  uint64_t total = 0;
  if (progress) {
    auto measure = MeasureDirectory(root.get(), src_dir, AddDirectoryOptions{});
    if (measure.ok()) total = measure->logical_bytes;
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto writer, BeginSnapshot(spec));
  if (progress) writer->SetProgress(progress, total);
  Walk walk{writer.get(), nullptr, src_dir, progress, total, "", std::nullopt, nullptr};
  GPUCKPT_RETURN_IF_ERROR(walk.Dir(root.get(), "", 0));
  return writer->Commit();
}

}  // namespace gpuckpt
