// Store::Export: writes a snapshot into a new directory tree. The tree is
// built under a hidden temporary name beside the destination, synced, and
// renamed into place, so the destination never shows half a snapshot.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/base/full_io.h"
#include "core/base/scope_exit.h"
#include "core/base/unique_fd.h"
#include "core/base/work_queue.h"
#include "core/catalog/extent_index.h"
#include "core/catalog/records.h"
#include "core/snapshot/store_impl.h"

namespace gpuckpt {
namespace {

// Bytes of a file one export task reads and writes.
constexpr uint64_t kRunBytes = 1u << 20;
// How often progress is reported, in bytes written.
constexpr uint64_t kProgressBytes = 64u << 20;

using FileRecords = std::vector<std::pair<uint32_t, FileEntry>>;

std::string ParentOf(const std::string& path) {
  std::filesystem::path p(path);
  auto parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

Result<std::string> WithoutTrailingSlashes(std::string dest_dir) {
  while (dest_dir.size() > 1 && dest_dir.back() == '/') dest_dir.pop_back();
  if (dest_dir.empty()) return Status::InvalidArgument("destination is empty");
  return dest_dir;
}

// The destination may be missing or an empty directory, nothing else.
Status CheckDestinationIsFree(const std::string& dest_dir) {
  struct stat st {};
  if (lstat(dest_dir.c_str(), &st) == 0) {
    std::error_code ec;
    if (!S_ISDIR(st.st_mode) || !std::filesystem::is_empty(dest_dir, ec)) {
      return Status::AlreadyExists("destination " + dest_dir +
                                   " exists and is not an empty directory");
    }
  } else if (errno != ENOENT) {
    return StatusFromErrno(errno, "destination " + dest_dir);
  }
  return Status::Ok();
}

// A new hidden directory beside the destination, on the same filesystem so
// that it can be renamed into place.
Result<std::string> MakeTemporaryTree(const std::string& dest_dir, const std::string& store_dir) {
  const std::string parent = ParentOf(dest_dir);
  if (IsInside(parent, store_dir)) {
    return Status::InvalidArgument("destination " + dest_dir + " is inside the store " + store_dir);
  }
  std::random_device rd;
  const std::string tmp = parent + "/." + std::filesystem::path(dest_dir).filename().string() +
                          ".gpuckpt-tmp-" + std::to_string(getpid()) + "-" + std::to_string(rd());
  if (mkdir(tmp.c_str(), 0700) != 0) return StatusFromErrno(errno, "creating " + tmp);
  return tmp;
}

// Directories (still writable, their modes come last) and symlinks.
// `records` are sorted by path, so parents come before their children.
Status CreateDirectoriesAndSymlinks(const std::string& tmp, const FileRecords& records,
                                    bool as_root) {
  for (const auto& [index, e] : records) {
    const std::string path = tmp + "/" + e.path;
    if (e.type == FileType::kDirectory) {
      if (mkdir(path.c_str(), 0700) != 0) return StatusFromErrno(errno, "creating " + path);
    } else if (e.type == FileType::kSymlink) {
      if (symlink(e.symlink_target.c_str(), path.c_str()) != 0) {
        return StatusFromErrno(errno, "creating " + path);
      }
      if (as_root && lchown(path.c_str(), e.uid, e.gid) != 0) return StatusFromErrno(errno, path);
    }
  }
  return Status::Ok();
}

Status SetFileAttributes(int fd, const FileEntry& e, const std::string& path, bool as_root) {
  if (as_root && fchown(fd, e.uid, e.gid) != 0) return StatusFromErrno(errno, "chown " + path);
  if (fchmod(fd, e.mode) != 0) return StatusFromErrno(errno, "chmod " + path);
  timespec times[2] = {{0, UTIME_OMIT}, {e.mtime_ns / 1000000000, e.mtime_ns % 1000000000}};
  if (futimens(fd, times) != 0) return StatusFromErrno(errno, "setting the time of " + path);
  return Status::Ok();
}

// Directory modes last, deepest first, so a read-only directory does not
// stop its children from being created.
Status SetDirectoryAttributes(const std::string& tmp, const FileRecords& records, bool as_root) {
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    const FileEntry& e = it->second;
    if (e.type != FileType::kDirectory) continue;
    const std::string path = tmp + "/" + e.path;
    if (as_root && chown(path.c_str(), e.uid, e.gid) != 0)
      return StatusFromErrno(errno, "chown " + path);
    if (chmod(path.c_str(), e.mode) != 0) return StatusFromErrno(errno, "chmod " + path);
    timespec times[2] = {{0, UTIME_OMIT}, {e.mtime_ns / 1000000000, e.mtime_ns % 1000000000}};
    utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW);
  }
  return Status::Ok();
}

// Durable before visible: one syncfs() of the destination's filesystem
// instead of an fsync per file.
Status SyncTree(const std::string& tmp) {
  UniqueFd dir(open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return StatusFromErrno(errno, "opening " + tmp);
  if (syncfs(dir.get()) != 0) return StatusFromErrno(errno, "syncing " + tmp);
  return Status::Ok();
}

Status MoveIntoPlace(const std::string& tmp, const std::string& dest_dir) {
  if (rename(tmp.c_str(), dest_dir.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST) {
      return Status::AlreadyExists("destination " + dest_dir + " appeared during the export");
    }
    return StatusFromErrno(errno, "moving the export into " + dest_dir);
  }
  return Status::Ok();
}

// Writes the bytes of a snapshot's regular files from their extents.
// Chunks are fetched, decompressed and verified on the workers, each
// writing its piece in place.
class ContentWriter {
 public:
  ContentWriter(const SnapshotCatalog* catalog, const ChunkStore* chunks,
                const ChunkDomainKey* domain, const StoreOptions& options,
                const ProgressFn& progress, uint64_t total)
      : catalog_(catalog),
        chunks_(chunks),
        domain_(domain),
        options_(options),
        progress_(progress),
        total_(total) {}

  // The contents of regular file `index` of snapshot `info`, into `fd`.
  Status Write(const SnapshotInfo& info, uint32_t index, const FileEntry& e, int fd,
               const std::string& path) {
    WorkQueue queue(options_.read_threads, options_.max_in_flight_bytes);
    // The file is already its full size (ftruncate): holes stay holes, only
    // the extents' bytes are written.
    ExtentIndex extents(*catalog_, ExtentIndex::Scope::File(info.key, index, e.holes));
    Status submit_status = SubmitExtents(info.id, e, &extents, &queue, fd, path);
    Status finish = queue.Finish();
    GPUCKPT_RETURN_IF_ERROR(extents.status("reading the extent index"));
    GPUCKPT_RETURN_IF_ERROR(submit_status);
    GPUCKPT_RETURN_IF_ERROR(finish);
    if (extents.covered_to() != e.size) {
      return Status::Corruption("snapshot '" + info.id + "' file '" + e.path + "': extents cover " +
                                std::to_string(extents.covered_to()) + " of " +
                                std::to_string(e.size) + " bytes");
    }
    if (!extents.crossed_every_hole()) {
      return Status::Corruption("snapshot '" + info.id + "' file '" + e.path +
                                "': a hole lies inside its extents");
    }
    return Status::Ok();
  }

 private:
  // Extents go to the workers in runs of about kRunBytes: each worker
  // fills one buffer and writes it with one pwrite(), so writers don't
  // queue on the file's lock once per 16 KiB chunk.
  Status SubmitExtents(const std::string& id, const FileEntry& e, ExtentIndex* extents,
                       WorkQueue* queue, int fd, const std::string& path) {
    std::vector<Extent> run;
    uint64_t run_bytes = 0;
    extents->SeekToFirst();
    for (;;) {
      GPUCKPT_ASSIGN_OR_RETURN(std::optional<ExtentIndex::Step> step, extents->NextInOrder());
      if (!step) break;
      if (step->join == ExtentJoin::kAfterHole) {
        // A run is written with one pwrite(): it ends where a hole begins.
        GPUCKPT_RETURN_IF_ERROR(SubmitRun(std::move(run), run_bytes, queue, fd, path));
        run = {};
        run_bytes = 0;
      } else if (step->join != ExtentJoin::kContiguous) {
        return Status::Corruption("snapshot '" + id + "' file '" + e.path +
                                  "': gap in the extent index at " +
                                  std::to_string(step->expected));
      }
      run_bytes += step->extent.length;
      run.push_back(std::move(step->extent));
      if (run_bytes >= kRunBytes) {
        GPUCKPT_RETURN_IF_ERROR(SubmitRun(std::move(run), run_bytes, queue, fd, path));
        run = {};
        run_bytes = 0;
      }
      ReportProgress();
    }
    return SubmitRun(std::move(run), run_bytes, queue, fd, path);
  }

  Status SubmitRun(std::vector<Extent> run, uint64_t run_bytes, WorkQueue* queue, int fd,
                   const std::string& path) {
    if (run.empty()) return Status::Ok();
    return queue->Submit(
        run_bytes, [this, extents = std::move(run), run_bytes, fd, &path](unsigned) -> Status {
          std::vector<ChunkStore::ChunkRef> refs;
          refs.reserve(extents.size());
          for (const Extent& x : extents) {
            refs.push_back(ChunkStore::ChunkRef{x.hash, x.seq, x.length, /*use_cache=*/false});
          }
          std::vector<ChunkStore::ChunkBytes> chunks;
          GPUCKPT_RETURN_IF_ERROR(chunks_->ReadMany(refs, domain_, &chunks));
          std::string buf;
          buf.reserve(run_bytes);
          for (const auto& chunk : chunks) buf.append(chunk.bytes);
          GPUCKPT_RETURN_IF_ERROR(
              PwriteFully(fd, buf.data(), buf.size(), extents.front().offset, path));
          done_.fetch_add(buf.size(), std::memory_order_relaxed);
          return Status::Ok();
        });
  }

  void ReportProgress() {
    if (progress_ && done_.load() - reported_ >= kProgressBytes) {
      reported_ = done_.load();
      progress_(reported_, total_);
    }
  }

  const SnapshotCatalog* catalog_;
  const ChunkStore* chunks_;
  const ChunkDomainKey* domain_;  // what kFullHash verification names the chunks with
  const StoreOptions& options_;
  const ProgressFn& progress_;
  const uint64_t total_;
  std::atomic<uint64_t> done_{0};  // bytes written, by the workers
  uint64_t reported_ = 0;
};

Status ExportRegularFile(ContentWriter* writer, const SnapshotInfo& info, uint32_t index,
                         const FileEntry& e, const std::string& tmp, bool as_root) {
  const std::string path = tmp + "/" + e.path;
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return StatusFromErrno(errno, "creating " + path);
  if (ftruncate(fd.get(), static_cast<off_t>(e.size)) != 0) {
    return StatusFromErrno(errno, "sizing " + path);
  }
  GPUCKPT_RETURN_IF_ERROR(writer->Write(info, index, e, fd.get(), path));
  return SetFileAttributes(fd.get(), e, path, as_root);
}

// A file still spooled: copied through a reader of its spool file (which
// falls back to its extents when it settled meanwhile).
Status ExportThroughReader(FileReader& reader, const FileEntry& e, const std::string& tmp,
                           bool as_root) {
  const std::string path = tmp + "/" + e.path;
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return StatusFromErrno(errno, "creating " + path);
  constexpr size_t kCopyBytes = 4u << 20;
  std::unique_ptr<char[]> buf(new char[kCopyBytes]);
  for (uint64_t at = 0; at < e.size;) {
    GPUCKPT_ASSIGN_OR_RETURN(const size_t n, reader.Pread(at, kCopyBytes, buf.get()));
    if (n == 0) return Status::Corruption("'" + e.path + "' ended before its size");
    GPUCKPT_RETURN_IF_ERROR(PwriteFully(fd.get(), buf.get(), n, at, path));
    at += n;
  }
  return SetFileAttributes(fd.get(), e, path, as_root);
}

uint64_t TotalBytes(const FileRecords& records) {
  uint64_t total = 0;
  for (const auto& [index, e] : records) total += e.size;
  return total;
}

}  // namespace

Status StoreImpl::Export(const std::string& id, const std::string& dest_dir_in,
                         const ProgressFn& progress) {
  GPUCKPT_ASSIGN_OR_RETURN(const std::string dest_dir, WithoutTrailingSlashes(dest_dir_in));
  // Pinned: a Remove() (and Gc()) while the export runs leaves it whole.
  GPUCKPT_ASSIGN_OR_RETURN(auto pinned, PinSnapshot(id));
  const SnapshotInfo& info = pinned.first;
  GPUCKPT_ASSIGN_OR_RETURN(FileRecords records, catalog_->ReadFiles(info.key));
  const std::optional<ChunkDomainKey> domain_key = db_->domain_key(info.dedup_domain);
  GPUCKPT_RETURN_IF_ERROR(CheckDestinationIsFree(dest_dir));
  GPUCKPT_ASSIGN_OR_RETURN(const std::string tmp, MakeTemporaryTree(dest_dir, dir()));
  ScopeExit remove_tmp([&tmp] {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
  });

  const bool as_root = geteuid() == 0;
  const uint64_t total = TotalBytes(records);
  // Directories first (records are in insertion order, which for an import
  // is parents before children, but a writer may add them in any order).
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.second.path < b.second.path; });
  GPUCKPT_RETURN_IF_ERROR(CreateDirectoriesAndSymlinks(tmp, records, as_root));
  ContentWriter writer(catalog_.get(), chunk_store_.get(), domain_key ? &*domain_key : nullptr,
                       options_, progress, total);
  for (const auto& [index, e] : records) {
    if (e.type != FileType::kRegular) continue;
    if (e.spooled) {
      GPUCKPT_ASSIGN_OR_RETURN(auto reader, MakeReader(PinAgain(info.key), info, index, e));
      GPUCKPT_RETURN_IF_ERROR(ExportThroughReader(*reader, e, tmp, as_root));
      continue;
    }
    GPUCKPT_RETURN_IF_ERROR(ExportRegularFile(&writer, info, index, e, tmp, as_root));
  }
  GPUCKPT_RETURN_IF_ERROR(SetDirectoryAttributes(tmp, records, as_root));
  if (options_.sync_export) GPUCKPT_RETURN_IF_ERROR(SyncTree(tmp));
  GPUCKPT_RETURN_IF_ERROR(MoveIntoPlace(tmp, dest_dir));
  remove_tmp.Dismiss();
  if (progress) progress(total, total);
  return Status::Ok();
}

}  // namespace gpuckpt
