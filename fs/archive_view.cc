#include "fs/archive_view.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

namespace gpuckpt {
namespace {

constexpr uint64_t kBlock = 512;
// The end of a tar: two zero blocks.
constexpr uint64_t kTrailerBytes = 2 * kBlock;

constexpr char kContainerPrefix[] = "container/";
constexpr char kImagesDir[] = "images";
constexpr char kCheckpointDir[] = "checkpoint";

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// Which group a stored path's member is in (0: top level, from
// container/; 1: checkpoint/, from images/) and its name in the archive,
// or nullopt where the archive leaves it out.
std::optional<std::pair<int, std::string>> MemberOf(const std::string& path) {
  if (StartsWith(path, kContainerPrefix)) {
    std::string name = path.substr(sizeof(kContainerPrefix) - 1);
    // gpuckpt's own members: a stored one of the same name would overwrite
    // them, or mix into them, on extraction.
    if (name == "manifest.json" || name == kCheckpointDir ||
        StartsWith(name, std::string(kCheckpointDir) + "/"))
      return std::nullopt;
    return std::make_pair(0, std::move(name));
  }
  if (path == kImagesDir) return std::make_pair(1, std::string(kCheckpointDir));
  if (StartsWith(path, std::string(kImagesDir) + "/"))
    return std::make_pair(1, kCheckpointDir + path.substr(sizeof(kImagesDir) - 1));
  return std::nullopt;
}

// A directory the snapshot holds no entry for, shown as checkpoints/<id>/
// shows it: private to the owner, of the checkpoint's time.
FileEntry OwnerDirectory(const std::string& name, const SnapshotInfo& info,
                         const SnapshotOwner& owner) {
  FileEntry e;
  e.path = name;
  e.type = FileType::kDirectory;
  e.mode = 0700;
  e.uid = owner.uid;
  e.gid = owner.gid;
  e.mtime_ns = info.created_ns;
  return e;
}

// libarchive's output for one header, appended to a std::string: no fixed
// buffer to size for a header whose length (long names go into a pax
// header) is not known in advance.
struct HeaderOutput {
  std::string bytes;
  // Set once the header is written: what libarchive writes after it (the
  // entry's data as zeros, gigabytes for a pages image, then the end of
  // the archive) is refused, so that closing the writer ends at once.
  bool header_done = false;
};

la_ssize_t AppendHeader(struct archive*, void* client, const void* buf, size_t n) {
  auto* out = static_cast<HeaderOutput*>(client);
  if (out->header_done) return -1;
  out->bytes.append(static_cast<const char*>(buf), n);
  return static_cast<la_ssize_t>(n);
}

// Closes the writer, whose output refuses everything after the header
// (its close stops at the first write), then frees it. Freeing without a
// close (archive_write_fail) would skip freeing the writer's output state.
struct ArchiveWriterClose {
  HeaderOutput* out;
  void operator()(struct archive* a) const {
    out->header_done = true;
    archive_write_close(a);
    archive_write_free(a);
  }
};

class ArchiveReader final : public FileReader {
 public:
  ArchiveReader(std::shared_ptr<const ArchiveLayout> layout, std::string headers,
                std::vector<uint64_t> header_at, std::vector<std::unique_ptr<FileReader>> readers)
      : layout_(std::move(layout)),
        headers_(std::move(headers)),
        header_at_(std::move(header_at)),
        readers_(std::move(readers)) {}

  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override {
    const uint64_t size = layout_->size();
    if (offset >= size || len == 0) return size_t{0};
    len = static_cast<size_t>(std::min<uint64_t>(len, size - offset));
    const auto& members = layout_->members();
    // The last member starting at or before `offset` (members[0] starts
    // at 0); past the last one's end are the two zero blocks.
    size_t i = static_cast<size_t>(std::upper_bound(members.begin(), members.end(), offset,
                                                    [](uint64_t off, const ArchiveMember& m) {
                                                      return off < m.offset;
                                                    }) -
                                   members.begin()) -
               1;
    size_t done = 0;
    while (done < len) {
      const uint64_t pos = offset + done;
      const uint64_t want = len - done;
      if (i < members.size() && pos >= members[i].end()) {
        ++i;
        continue;
      }
      if (i == members.size()) {  // the trailer
        std::memset(buf + done, 0, static_cast<size_t>(want));
        done = len;
        break;
      }
      const ArchiveMember& m = members[i];
      uint64_t at = pos - m.offset;
      size_t n = 0;
      if (at < m.header_size) {
        n = static_cast<size_t>(std::min(want, m.header_size - at));
        std::memcpy(buf + done, headers_.data() + header_at_[i] + at, n);
      } else if (at -= m.header_size; at < m.entry.size) {
        n = static_cast<size_t>(std::min(want, m.entry.size - at));
        if (readers_[i] != nullptr) {
          GPUCKPT_ASSIGN_OR_RETURN(size_t got, readers_[i]->Pread(at, n, buf + done));
          if (got != n)
            return Status::Corruption("checkpoint " + layout_->id() + ": " + m.stored->path +
                                      " is shorter than its listing says");
        } else {
          std::memcpy(buf + done, layout_->manifest().data() + at, n);
        }
      } else {  // padding to the next block
        n = static_cast<size_t>(std::min(want, m.end() - pos));
        std::memset(buf + done, 0, n);
      }
      done += n;
    }
    return done;
  }

  const FileEntry& entry() const override { return layout_->file(); }

 private:
  std::shared_ptr<const ArchiveLayout> layout_;
  std::string headers_;              // every member's header, in order
  std::vector<uint64_t> header_at_;  // where member i's header is in headers_
  // Member i's stored file (regular files); null for the manifest and for
  // directories and symlinks.
  std::vector<std::unique_ptr<FileReader>> readers_;
};

}  // namespace

Result<std::string> TarHeader(const FileEntry& e) {
  HeaderOutput out;
  std::unique_ptr<struct archive, ArchiveWriterClose> a(archive_write_new(),
                                                        ArchiveWriterClose{&out});
  if (a == nullptr) return Status::NoMemory("libarchive: no memory for a writer");
  auto failed = [&](const char* what) {
    const char* why = archive_error_string(a.get());
    return Status::Internal(std::string("libarchive: ") + what + " of '" + e.path +
                            "': " + (why != nullptr ? why : "failed"));
  };
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK)
    return failed("setting the format");
  // Unblocked: every byte reaches AppendHeader() as it is written,
  // nothing is held back in a 10 KiB block, and nothing pads the output.
  if (archive_write_set_bytes_per_block(a.get(), 0) != ARCHIVE_OK)
    return failed("setting the block size");
  if (archive_write_open2(a.get(), &out, nullptr, AppendHeader, nullptr, nullptr) != ARCHIVE_OK)
    return failed("opening");

  std::unique_ptr<struct archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(),
                                                                             archive_entry_free);
  if (entry == nullptr) return Status::NoMemory("libarchive: no memory for an entry");
  struct archive_entry* en = entry.get();
  // Every field set here, and only these: nothing of the host (user
  // names, device and inode numbers, atime, ctime) that could change what
  // the same member's header says from one open to the next.
  archive_entry_set_pathname(en, e.path.c_str());
  switch (e.type) {
    case FileType::kRegular:
      archive_entry_set_filetype(en, AE_IFREG);
      archive_entry_set_size(en, static_cast<la_int64_t>(e.size));
      break;
    case FileType::kDirectory:
      archive_entry_set_filetype(en, AE_IFDIR);
      archive_entry_set_size(en, 0);
      break;
    case FileType::kSymlink:
      archive_entry_set_filetype(en, AE_IFLNK);
      archive_entry_set_symlink(en, e.symlink_target.c_str());
      archive_entry_set_size(en, 0);
      break;
  }
  archive_entry_set_perm(en, static_cast<mode_t>(e.mode & 07777));
  archive_entry_set_uid(en, e.uid);
  archive_entry_set_gid(en, e.gid);
  // Floor division: a time before 1970 has a negative second and a
  // nanosecond in [0, 1e9).
  int64_t sec = e.mtime_ns / 1000000000;
  int64_t nsec = e.mtime_ns % 1000000000;
  if (nsec < 0) {
    sec -= 1;
    nsec += 1000000000;
  }
  archive_entry_set_mtime(en, static_cast<time_t>(sec), static_cast<long>(nsec));
  // ARCHIVE_WARN: written, with a name that could not be converted to
  // UTF-8 kept as its bytes (hdrcharset=BINARY).
  if (archive_write_header(a.get(), en) < ARCHIVE_WARN) return failed("writing the header");
  if (out.bytes.empty() || out.bytes.size() % kBlock != 0)
    return Status::Internal("libarchive wrote a header of " + std::to_string(out.bytes.size()) +
                            " bytes for '" + e.path + "'");
  return std::move(out.bytes);
}

Result<std::shared_ptr<const ArchiveLayout>> ArchiveLayout::Build(
    const SnapshotInfo& info, const SnapshotOwner& owner, const std::vector<FileEntry>& files) {
  std::shared_ptr<ArchiveLayout> layout(new ArchiveLayout());
  layout->id_ = info.id;
  layout->key_ = info.key;
  layout->manifest_ = SnapshotManifestJson(info);

  ArchiveMember manifest;
  manifest.entry.path = "manifest.json";
  manifest.entry.type = FileType::kRegular;
  manifest.entry.mode = 0400;  // as checkpoints/<id>/manifest.json
  manifest.entry.uid = owner.uid;
  manifest.entry.gid = owner.gid;
  manifest.entry.size = layout->manifest_.size();
  manifest.entry.mtime_ns = info.created_ns;
  layout->members_.push_back(std::move(manifest));

  // By name within each group: a directory sorts before what is in it.
  std::map<std::string, ArchiveMember> groups[2];
  for (const auto& f : files) {
    auto where = MemberOf(f.path);
    if (!where) continue;
    ArchiveMember m;
    m.entry = f;
    m.entry.path = where->second;
    if (f.type == FileType::kRegular) {
      m.stored = f;
    } else {
      m.entry.size = 0;
    }
    groups[where->first].emplace(where->second, std::move(m));
  }
  groups[1].try_emplace(kCheckpointDir, ArchiveMember{OwnerDirectory(kCheckpointDir, info, owner),
                                                      std::nullopt, 0, 0});
  for (auto& group : groups) {
    std::vector<std::string> names;
    for (const auto& [name, m] : group) names.push_back(name);
    for (const auto& name : names) {
      for (size_t slash = name.rfind('/'); slash != std::string::npos && slash > 0;
           slash = name.rfind('/', slash - 1)) {
        const std::string dir = name.substr(0, slash);
        group.try_emplace(dir, ArchiveMember{OwnerDirectory(dir, info, owner), std::nullopt, 0, 0});
      }
    }
    for (auto& [name, m] : group) layout->members_.push_back(std::move(m));
  }

  uint64_t offset = 0;
  for (auto& m : layout->members_) {
    GPUCKPT_ASSIGN_OR_RETURN(std::string header, TarHeader(m.entry));
    m.offset = offset;
    m.header_size = header.size();
    offset = m.end();
  }

  FileEntry& file = layout->file_;
  file.path = ArchiveFileName(info.id);
  file.type = FileType::kRegular;
  file.mode = 0400;
  file.uid = owner.uid;
  file.gid = owner.gid;
  file.size = offset + kTrailerBytes;
  file.mtime_ns = info.created_ns;
  return std::shared_ptr<const ArchiveLayout>(std::move(layout));
}

Result<std::unique_ptr<FileReader>> OpenArchive(Store* store,
                                                std::shared_ptr<const ArchiveLayout> layout) {
  const auto& members = layout->members();
  std::string headers;
  std::vector<uint64_t> header_at;
  std::vector<std::unique_ptr<FileReader>> readers(members.size());
  header_at.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const ArchiveMember& m = members[i];
    GPUCKPT_ASSIGN_OR_RETURN(std::string header, TarHeader(m.entry));
    // The layout's offsets were computed from the same entries: a header
    // of another length would shift every member after it.
    if (header.size() != m.header_size)
      return Status::Internal("checkpoint " + layout->id() + ": the header of '" + m.entry.path +
                              "' changed length");
    header_at.push_back(headers.size());
    headers += header;
    if (!m.stored) continue;
    // By the listing's key and index: had the checkpoint been removed, and
    // its id reused, since the layout was built, this is kNotFound rather
    // than another checkpoint's file of the same name. From here on the
    // readers keep it readable.
    GPUCKPT_ASSIGN_OR_RETURN(readers[i],
                             store->OpenListedFile(layout->id(), layout->key(), *m.stored));
  }
  for (size_t i = 0; i < members.size(); ++i) {
    if (readers[i] != nullptr && readers[i]->entry().size != members[i].entry.size)
      return Status::Corruption("checkpoint " + layout->id() + ": " + members[i].stored->path +
                                " is not the size its listing says");
  }
  return std::unique_ptr<FileReader>(new ArchiveReader(std::move(layout), std::move(headers),
                                                       std::move(header_at), std::move(readers)));
}

std::string ArchiveFileName(const std::string& id) { return id + ".tar"; }

std::optional<std::string> ArchiveIdOf(const std::string& name) {
  constexpr char kSuffix[] = ".tar";
  constexpr size_t kSuffixLength = sizeof(kSuffix) - 1;
  if (name.size() <= kSuffixLength ||
      name.compare(name.size() - kSuffixLength, kSuffixLength, kSuffix) != 0)
    return std::nullopt;
  return name.substr(0, name.size() - kSuffixLength);
}

}  // namespace gpuckpt
