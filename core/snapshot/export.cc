// Store::Export: writes a snapshot into a new directory tree. The tree is
// built under a hidden temporary name beside the destination, synced, and
// renamed into place, so the destination never shows half a snapshot.
#include <fcntl.h>
#include <rocksdb/db.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <random>
#include <string>

#include "core/base/full_io.h"
#include "core/base/work_queue.h"
#include "core/snapshot/records.h"
#include "core/snapshot/store_impl.h"
#include "core/store/keys.h"

namespace gpuckpt {
namespace {

// Bytes of a file one export task reads and writes.
constexpr uint64_t kRunBytes = 1u << 20;

std::string ParentOf(const std::string& path) {
  std::filesystem::path p(path);
  auto parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

Status StoreImpl::Export(const std::string& id, const std::string& dest_dir_in,
                         const ProgressFn& progress) {
  std::string dest_dir = dest_dir_in;
  while (dest_dir.size() > 1 && dest_dir.back() == '/') dest_dir.pop_back();
  if (dest_dir.empty()) return Status::InvalidArgument("destination is empty");
  // Pinned: a Remove() (and Gc()) while the export runs leaves it whole.
  GPUCKPT_ASSIGN_OR_RETURN(auto pinned, PinSnapshot(id));
  const SnapshotInfo& info = pinned.first;
  GPUCKPT_ASSIGN_OR_RETURN(auto records, ReadFileRecords(info.key));
  // What kFullHash verification names the chunks with.
  const std::optional<ChunkDomainKey> domain_key = db_->domain_key(info.dedup_domain);
  const ChunkDomainKey* const domain = domain_key ? &*domain_key : nullptr;

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

  const std::string parent = ParentOf(dest_dir);
  if (IsInside(parent, dir())) {
    return Status::InvalidArgument("destination " + dest_dir + " is inside the store " + dir());
  }
  std::random_device rd;
  const std::string tmp = parent + "/." + std::filesystem::path(dest_dir).filename().string() +
                          ".gpuckpt-tmp-" + std::to_string(getpid()) + "-" + std::to_string(rd());
  if (mkdir(tmp.c_str(), 0700) != 0) return StatusFromErrno(errno, "creating " + tmp);
  // Removes the temporary tree unless the export completes.
  struct Cleanup {
    std::string path;
    bool armed = true;
    ~Cleanup() {
      if (!armed) return;
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } cleanup{tmp};

  const bool as_root = geteuid() == 0;
  uint64_t total = 0;
  for (const auto& [index, e] : records) total += e.size;
  std::atomic<uint64_t> done{0};
  uint64_t reported = 0;

  // Directories first (records are in insertion order, which for an import
  // is parents before children, but a writer may add them in any order).
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.second.path < b.second.path; });
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

  for (const auto& [index, e] : records) {
    if (e.type != FileType::kRegular) continue;
    const std::string path = tmp + "/" + e.path;
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return StatusFromErrno(errno, "creating " + path);
    struct CloseFd {
      int fd;
      ~CloseFd() { close(fd); }
    } close_fd{fd};
    if (ftruncate(fd, static_cast<off_t>(e.size)) != 0)
      return StatusFromErrno(errno, "sizing " + path);

    // Chunks are fetched, decompressed and verified on the workers, each
    // writing its piece in place.
    WorkQueue queue(options_.read_threads, options_.max_in_flight_bytes);
    const std::string lower = keys::ExtentKey(info.key, index, 0);
    const std::string upper = keys::FileKey(info.key, index + 1);
    rocksdb::Slice upper_slice(upper);
    rocksdb::ReadOptions r;
    r.iterate_upper_bound = &upper_slice;
    std::unique_ptr<rocksdb::Iterator> it(db_->db()->NewIterator(r, db_->extents()));
    uint64_t expect = 0;
    Status submit_status;
    // Extents go to the workers in runs of about kRunBytes: each worker
    // fills one buffer and writes it with one pwrite(), so writers don't
    // queue on the file's lock once per 16 KiB chunk.
    std::vector<Extent> run;
    uint64_t run_bytes = 0;
    auto submit_run = [&]() -> Status {
      if (run.empty()) return Status::Ok();
      Status s = queue.Submit(
          run_bytes,
          [this, extents = std::move(run), run_bytes, fd, &path, &done,
           domain](unsigned) -> Status {
            std::vector<ChunkStore::ChunkRef> refs;
            refs.reserve(extents.size());
            for (const Extent& x : extents) {
              refs.push_back(ChunkStore::ChunkRef{x.hash, x.seq, x.length, /*use_cache=*/false});
            }
            std::vector<std::shared_ptr<const std::string>> chunks;
            GPUCKPT_RETURN_IF_ERROR(chunk_store_->ReadMany(refs, domain, &chunks));
            std::string buf;
            buf.reserve(run_bytes);
            for (const auto& chunk : chunks) buf.append(*chunk);
            GPUCKPT_RETURN_IF_ERROR(
                PwriteFully(fd, buf.data(), buf.size(), extents.front().offset, path));
            done.fetch_add(buf.size(), std::memory_order_relaxed);
            return Status::Ok();
          });
      run = {};
      run_bytes = 0;
      return s;
    };
    for (it->Seek(lower); it->Valid(); it->Next()) {
      GPUCKPT_ASSIGN_OR_RETURN(Extent x,
                               DecodeExtentRecord(keys::ExtentOffsetOf(it->key().ToStringView()),
                                                  it->value().ToStringView()));
      if (x.offset != expect) {
        submit_status =
            Status::Corruption("snapshot '" + id + "' file '" + e.path +
                               "': gap in the extent index at " + std::to_string(expect));
        break;
      }
      expect += x.length;
      run.push_back(x);
      run_bytes += x.length;
      if (run_bytes >= kRunBytes) {
        submit_status = submit_run();
        if (!submit_status.ok()) break;
      }
      if (progress && done.load() - reported >= (64u << 20)) {
        reported = done.load();
        progress(reported, total);
      }
    }
    if (submit_status.ok()) submit_status = submit_run();
    Status finish = queue.Finish();
    GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "reading the extent index"));
    GPUCKPT_RETURN_IF_ERROR(submit_status);
    GPUCKPT_RETURN_IF_ERROR(finish);
    if (expect != e.size) {
      return Status::Corruption("snapshot '" + id + "' file '" + e.path + "': extents cover " +
                                std::to_string(expect) + " of " + std::to_string(e.size) +
                                " bytes");
    }
    if (as_root && fchown(fd, e.uid, e.gid) != 0) return StatusFromErrno(errno, "chown " + path);
    if (fchmod(fd, e.mode) != 0) return StatusFromErrno(errno, "chmod " + path);
    timespec times[2] = {{0, UTIME_OMIT}, {e.mtime_ns / 1000000000, e.mtime_ns % 1000000000}};
    if (futimens(fd, times) != 0) return StatusFromErrno(errno, "setting the time of " + path);
  }

  // Directory modes last, deepest first, so a read-only directory does not
  // stop its children from being created.
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

  // Durable before visible: one syncfs() of the destination's filesystem
  // instead of an fsync per file.
  if (options_.sync_export) {
    const int dfd = open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return StatusFromErrno(errno, "opening " + tmp);
    const int rc = syncfs(dfd);
    const int err = errno;
    close(dfd);
    if (rc != 0) return StatusFromErrno(err, "syncing " + tmp);
  }
  if (rename(tmp.c_str(), dest_dir.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST) {
      return Status::AlreadyExists("destination " + dest_dir + " appeared during the export");
    }
    return StatusFromErrno(errno, "moving the export into " + dest_dir);
  }
  cleanup.armed = false;
  if (progress) progress(total, total);
  return Status::Ok();
}

}  // namespace gpuckpt
