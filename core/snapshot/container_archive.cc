#include "core/snapshot/container_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "gpuckpt/store_types.h"

namespace gpuckpt {
namespace {

constexpr char kManifestName[] = "manifest.json";
constexpr char kPstreeName[] = "checkpoint/pstree.img";
constexpr char kConfigName[] = "config.dump";
constexpr char kMountpointsPrefix[] = "checkpoint/mountpoints-";
// Longer names are no container engine's.
constexpr size_t kMaxName = 4096;
// Holes of sparse members shorter than this are stored as zeros, as
// AddFile() does with a sparse file's (core/snapshot/fd_source.h).
constexpr uint64_t kMinHoleBytes = 64u << 10;
// An archive is never refused for its ratio before its members hold this
// much: a small archive of small members may be all zeros.
constexpr uint64_t kRatioFloorBytes = 64u << 20;

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveFree>;

std::string ArchiveError(archive* a) {
  const char* text = archive_error_string(a);
  return text != nullptr ? text : "unreadable archive";
}

// "./a//b/" -> "a/b"; "" for the archive's own top ("./"); nullopt for a
// name that is absolute, too long or climbs out with "..".
std::optional<std::string> CleanName(const char* raw) {
  if (raw == nullptr || raw[0] == '/' || std::strlen(raw) > kMaxName) return std::nullopt;
  std::string out;
  const std::string name = raw;
  size_t i = 0;
  while (i <= name.size()) {
    size_t j = name.find('/', i);
    if (j == std::string::npos) j = name.size();
    const std::string part = name.substr(i, j - i);
    if (part == "..") return std::nullopt;
    if (!part.empty() && part != ".") out += (out.empty() ? "" : "/") + part;
    i = j + 1;
  }
  return out;
}

// 'name', for messages. (Appended piece by piece: GCC 12 at -O3 warns,
// wrongly, that "'" + std::string(...) may overlap itself.)
std::string Quoted(const std::string& name) {
  std::string out = "'";
  out += name;
  out += '\'';
  return out;
}

// Where a member of the archive goes in the snapshot ("" for
// manifest.json, which is not stored).
std::string StoredPath(const std::string& name) {
  const std::string images = kContainerImagesDir;
  if (name == images) return "images";
  if (name.compare(0, images.size() + 1, images + "/") == 0)
    return "images/" + name.substr(images.size() + 1);
  if (name == kManifestName) return "";
  return std::string(kContainerFilesDir) + "/" + name;
}

class MemberSource;

class Importer {
 public:
  Importer(SnapshotWriter* writer, archive* a, const std::string& shown,
           const ContainerImportOptions& options)
      : writer_(writer), archive_(a), shown_(shown), options_(options) {}

  Status Member(archive_entry* entry) {
    const std::optional<std::string> name = CleanName(archive_entry_pathname(entry));
    const char* raw = archive_entry_pathname(entry);
    const std::string quoted = Quoted(raw != nullptr ? raw : "");
    if (!name) return Refuse(quoted + " is a name outside the archive's tree");
    if (name->empty()) return Status::Ok();  // "./"
    if (archive_entry_hardlink(entry) != nullptr)
      return Refuse(quoted + " is a hard link; container checkpoints hold none");
    const std::string path = StoredPath(*name);
    FileEntry e;
    e.path = path;
    e.mode = archive_entry_perm(entry) & 0777;
    e.uid = options_.uid;
    e.gid = options_.gid;
    e.mtime_ns = int64_t{archive_entry_mtime(entry)} * 1000000000 + archive_entry_mtime_nsec(entry);
    switch (archive_entry_filetype(entry)) {
      case AE_IFDIR:
        if (path.empty()) return Refuse(quoted + " is a directory");
        if (dirs_.count(path) > 0) return Status::Ok();  // made already for what it holds
        GPUCKPT_RETURN_IF_ERROR(Parents(path, e.mtime_ns));
        if (!paths_.insert(path).second) return Refuse(quoted + " is in the archive twice");
        dirs_.insert(path);
        e.type = FileType::kDirectory;
        return writer_->AddEntry(e);
      case AE_IFLNK: {
        if (path.empty()) return Refuse(quoted + " is a symlink");
        GPUCKPT_RETURN_IF_ERROR(Parents(path, e.mtime_ns));
        if (!paths_.insert(path).second) return Refuse(quoted + " is in the archive twice");
        const char* target = archive_entry_symlink(entry);
        e.type = FileType::kSymlink;
        e.symlink_target = target != nullptr ? target : "";
        return writer_->AddEntry(e);
      }
      case AE_IFREG:
        // A sparse member's size counts its holes; its data may end before.
        return File(*name, quoted, e,
                    archive_entry_size_is_set(entry) != 0 && archive_entry_size(entry) > 0
                        ? static_cast<uint64_t>(archive_entry_size(entry))
                        : 0);
      default:
        return Refuse(quoted +
                      " is not a regular file, directory or symlink; container checkpoints "
                      "hold only those");
    }
  }

  ContainerImport& result() { return result_; }

 private:
  friend class MemberSource;

  Status Refuse(const std::string& what) const {
    return Status::InvalidArgument(shown_ + ": " + what + "; nothing was imported");
  }

  // The directories above `path` that the archive has not named (yet):
  // made, owner-only, so that everything below them shows.
  Status Parents(const std::string& path, int64_t mtime_ns) {
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      const std::string dir = path.substr(0, slash);
      if (dirs_.count(dir) > 0) continue;
      if (paths_.count(dir) > 0) return Refuse(Quoted(dir) + " is a file and a directory");
      FileEntry e;
      e.path = dir;
      e.type = FileType::kDirectory;
      e.mode = 0700;
      e.uid = options_.uid;
      e.gid = options_.gid;
      e.mtime_ns = mtime_ns;
      GPUCKPT_RETURN_IF_ERROR(writer_->AddEntry(e));
      dirs_.insert(dir);
      paths_.insert(dir);
    }
    return Status::Ok();
  }

  Result<size_t> Read(char* buf, size_t len) {
    const la_ssize_t n = archive_read_data(archive_, buf, len);
    if (n < 0) return Status::InvalidArgument(shown_ + ": " + ArchiveError(archive_));
    GPUCKPT_RETURN_IF_ERROR(Expanded(static_cast<uint64_t>(n)));
    return static_cast<size_t>(n);
  }

 public:
  // Counts `n` more bytes of member data, and stops the import as soon as
  // there is more than the options allow.
  Status Expanded(uint64_t n) {
    expanded_ += n;
    if (options_.max_member_bytes != 0 && expanded_ > options_.max_member_bytes) {
      return Status::NoSpace(
          shown_ + ": its members hold more than " + std::to_string(options_.max_member_bytes) +
          " bytes of data, more than this import may take; nothing was imported");
    }
    if (options_.max_expansion == 0 || expanded_ <= kRatioFloorBytes ||
        archive_filter_code(archive_, 0) == ARCHIVE_FILTER_NONE) {
      return Status::Ok();
    }
    const la_int64_t read = archive_filter_bytes(archive_, -1);
    if (read > 0 && expanded_ / options_.max_expansion > static_cast<uint64_t>(read)) {
      return Status::InvalidArgument(
          shown_ + " expands more than " + std::to_string(options_.max_expansion) + " times (" +
          std::to_string(expanded_) + " bytes of data from the first " + std::to_string(read) +
          " bytes of the archive): a checkpoint's images do not; nothing was imported");
    }
    return Status::Ok();
  }

  // Reads the data of the current member, block by block as libarchive
  // gives it with its offsets: a sparse member's holes stay holes.
  Status Fetch(const void** data, size_t* len, la_int64_t* offset, bool* eof) {
    const int r = archive_read_data_block(archive_, data, len, offset);
    *eof = r == ARCHIVE_EOF;
    if (*eof) return Status::Ok();
    if (r < ARCHIVE_WARN || *offset < 0)
      return Status::InvalidArgument(shown_ + ": " + ArchiveError(archive_));
    return Status::Ok();
  }

 private:
  // The whole of a member that the import parses.
  Result<std::string> ReadWhole(const std::string& quoted) {
    std::string data;
    char buf[1 << 16];
    for (;;) {
      GPUCKPT_ASSIGN_OR_RETURN(size_t n, Read(buf, sizeof buf));
      if (n == 0) return data;
      if (data.size() + n > options_.max_parsed_bytes)
        return Refuse(quoted + " is larger than such a file can be");
      data.append(buf, n);
    }
  }

  // A regular member: stored from the stream, or read whole to be parsed.
  Status File(const std::string& name, const std::string& quoted, FileEntry e, uint64_t size);

  SnapshotWriter* writer_;
  archive* archive_;
  const std::string& shown_;
  const ContainerImportOptions& options_;
  std::set<std::string> paths_;  // every stored path so far
  std::set<std::string> dirs_;   // the directories among them
  uint64_t expanded_ = 0;        // member data given so far
  ContainerImport result_;
};

// A member's data as the writer reads it: runs of data where libarchive
// gives blocks at offsets past the end of the one before, the gaps holes
// (up to kMaxFileHoles, from kMinHoleBytes; others are given as zeros), the
// member's size its end. An all-hole member of N bytes is N zeros.
class MemberSource final : public SnapshotWriter::SparseSource {
 public:
  MemberSource(Importer* importer, uint64_t size) : importer_(importer), size_(size) {}

  Result<Run> NextRun() override {
    GPUCKPT_RETURN_IF_ERROR(Fill());
    const uint64_t next = eof_ ? std::max(size_, pos_) : offset_;
    if (next < pos_) return importer_->Refuse("a sparse member's data goes backwards");
    const uint64_t gap = next - pos_;
    if (gap > 0 && (gap < kMinHoleBytes || holes_ == kMaxFileHoles)) {
      zeros_to_ = next;  // given as data
      return Run{pos_, false};
    }
    if (gap > 0) ++holes_;
    pos_ = next;
    return Run{pos_, eof_};
  }

  Result<size_t> Read(char* buf, size_t len) override {
    size_t n = 0;
    if (pos_ < zeros_to_) {
      n = static_cast<size_t>(std::min<uint64_t>(len, zeros_to_ - pos_));
      std::memset(buf, 0, n);
    } else {
      GPUCKPT_RETURN_IF_ERROR(Fill());
      if (eof_ || offset_ != pos_) return size_t{0};  // the run ends here
      n = std::min(len, left_);
      std::memcpy(buf, data_, n);
      data_ += n;
      left_ -= n;
      offset_ += n;
    }
    pos_ += n;
    GPUCKPT_RETURN_IF_ERROR(importer_->Expanded(n));
    return n;
  }

 private:
  // A block with bytes left to give, unless the member's data has ended.
  Status Fill() {
    while (left_ == 0 && !eof_) {
      const void* data = nullptr;
      size_t len = 0;
      la_int64_t offset = 0;
      GPUCKPT_RETURN_IF_ERROR(importer_->Fetch(&data, &len, &offset, &eof_));
      if (eof_) break;
      data_ = static_cast<const char*>(data);
      left_ = len;
      offset_ = static_cast<uint64_t>(offset);
    }
    return Status::Ok();
  }

  Importer* const importer_;
  const uint64_t size_;
  uint64_t pos_ = 0;       // where the data given so far ends
  uint64_t zeros_to_ = 0;  // a gap given as zeros ends here
  uint64_t holes_ = 0;
  const char* data_ = nullptr;  // the block's bytes not given yet
  size_t left_ = 0;
  uint64_t offset_ = 0;  // their offset in the member
  bool eof_ = false;
};

Status Importer::File(const std::string& name, const std::string& quoted, FileEntry e,
                      uint64_t size) {
  if (name.compare(0, sizeof(kMountpointsPrefix) - 1, kMountpointsPrefix) == 0)
    result_.mount_namespace = true;
  const bool parsed = name == kPstreeName || name == kConfigName || e.path.empty();
  if (!parsed) {
    GPUCKPT_RETURN_IF_ERROR(Parents(e.path, e.mtime_ns));
    if (!paths_.insert(e.path).second) return Refuse(quoted + " is in the archive twice");
    MemberSource source(this, size);
    return writer_->AddSparse(e, &source);
  }
  GPUCKPT_ASSIGN_OR_RETURN(std::string data, ReadWhole(quoted));
  if (e.path.empty()) {  // manifest.json: read, not stored
    if (result_.manifest) return Refuse(quoted + " is in the archive twice");
    result_.manifest = std::move(data);
    return Status::Ok();
  }
  GPUCKPT_RETURN_IF_ERROR(Parents(e.path, e.mtime_ns));
  if (!paths_.insert(e.path).second) return Refuse(quoted + " is in the archive twice");
  size_t given = 0;
  GPUCKPT_RETURN_IF_ERROR(writer_->AddStream(e, [&](char* buf, size_t len) -> Result<size_t> {
    const size_t n = std::min(len, data.size() - given);
    std::memcpy(buf, data.data() + given, n);
    given += n;
    return n;
  }));
  if (name == kPstreeName)
    result_.pstree = std::move(data);
  else
    result_.config = std::move(data);
  return Status::Ok();
}

}  // namespace

bool IsContainerFile(const std::string& top_level_name) {
  return top_level_name != kContainerImagesDir && top_level_name != kManifestName;
}

Result<ContainerImport> AddContainerArchiveToSnapshot(SnapshotWriter* writer, int fd,
                                                      const std::string& shown,
                                                      const ContainerImportOptions& options) {
  ArchivePtr a(archive_read_new());
  if (!a) return Status::IOError("out of memory for reading " + shown);
  // Any of libarchive's decompressors, found from the bytes; tar only (the
  // pax, ustar and GNU forms container engines write).
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_fd(a.get(), fd, 1 << 20) != ARCHIVE_OK)
    return Status::InvalidArgument(shown + " is not a tar archive: " + ArchiveError(a.get()));
  Importer importer(writer, a.get(), shown, options);
  for (bool first = true;; first = false) {
    archive_entry* entry = nullptr;
    const int r = archive_read_next_header(a.get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      return Status::InvalidArgument(
          shown + (first ? " is not a tar archive (plain, gzip or zstd): " : ": ") +
          ArchiveError(a.get()) + "; nothing was imported");
    }
    GPUCKPT_RETURN_IF_ERROR(importer.Member(entry));
  }
  if (importer.result().pstree.empty())
    return Status::InvalidArgument(shown + " is not a container checkpoint: it has no " +
                                   std::string(kPstreeName));
  return std::move(importer.result());
}

}  // namespace gpuckpt
