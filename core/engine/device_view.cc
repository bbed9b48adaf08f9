#include "core/engine/device_view.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/criu/images.h"
#include "core/manifest/checkpoint_manifest.h"

namespace gpuckpt {
namespace {

// Pagemap images are small (one record per run of pages); a huge one is
// not CRIU's.
constexpr uint64_t kMaxPagemapBytes = 64u << 20;

// The slices of the pages image that hold [start, end) of the process
// whose pagemap is `map`.
std::vector<DeviceFile::Segment> Slices(const CriuPagemap& map, uint64_t page_size, uint64_t start,
                                        uint64_t end) {
  std::vector<DeviceFile::Segment> out;
  auto add = [&](uint64_t length, int64_t offset) {
    if (length == 0) return;
    if (!out.empty()) {
      auto& last = out.back();
      const bool both_zero = last.source_offset < 0 && offset < 0;
      const bool contiguous =
          last.source_offset >= 0 && offset >= 0 &&
          static_cast<uint64_t>(last.source_offset) + last.length == static_cast<uint64_t>(offset);
      if (both_zero || contiguous) {
        last.length += length;
        return;
      }
    }
    out.push_back({length, offset});
  };
  uint64_t cursor = start;
  uint64_t pages_offset = 0;  // where the current entry's pages start in the image
  for (const auto& e : map.entries) {
    const uint64_t bytes = uint64_t{e.nr_pages} * page_size;
    const uint64_t e_end = e.vaddr + bytes;
    const uint64_t here = pages_offset;
    if (e.present()) pages_offset += bytes;
    if (e_end <= cursor || e.vaddr >= end) continue;
    if (e.vaddr > cursor) {
      add(e.vaddr - cursor, -1);
      cursor = e.vaddr;
    }
    const uint64_t stop = std::min(end, e_end);
    add(stop - cursor, e.present() ? static_cast<int64_t>(here + (cursor - e.vaddr)) : -1);
    cursor = stop;
  }
  if (cursor < end) add(end - cursor, -1);
  return out;
}

class SliceReader final : public FileReader {
 public:
  SliceReader(std::shared_ptr<const DeviceFile> file, std::unique_ptr<FileReader> source)
      : file_(std::move(file)), source_(std::move(source)) {
    uint64_t at = 0;
    for (const auto& s : file_->segments) {
      starts_.push_back(at);
      at += s.length;
    }
  }

  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override {
    const uint64_t size = file_->entry.size;
    if (offset >= size) return size_t{0};
    len = static_cast<size_t>(std::min<uint64_t>(len, size - offset));
    size_t done = 0;
    size_t i = std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1;
    while (done < len && i < starts_.size()) {
      const auto& seg = file_->segments[i];
      const uint64_t within = offset + done - starts_[i];
      const size_t n = static_cast<size_t>(std::min<uint64_t>(len - done, seg.length - within));
      if (seg.source_offset < 0) {
        std::memset(buf + done, 0, n);
      } else {
        GPUCKPT_ASSIGN_OR_RETURN(
            size_t got,
            source_->Pread(static_cast<uint64_t>(seg.source_offset) + within, n, buf + done));
        if (got != n)
          return Status::Corruption(file_->entry.path + ": " + file_->source->path +
                                    " ends before the pages its pagemap names");
      }
      done += n;
      ++i;
    }
    return done;
  }

  const FileEntry& entry() const override { return file_->entry; }

 private:
  std::shared_ptr<const DeviceFile> file_;
  std::unique_ptr<FileReader> source_;
  std::vector<uint64_t> starts_;
};

class AliasReader final : public FileReader {
 public:
  AliasReader(std::shared_ptr<const DeviceFile> file, std::unique_ptr<FileReader> source)
      : file_(std::move(file)), source_(std::move(source)) {}
  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override {
    return source_->Pread(offset, len, buf);
  }
  const FileEntry& entry() const override { return file_->entry; }

 private:
  std::shared_ptr<const DeviceFile> file_;
  std::unique_ptr<FileReader> source_;
};

class ContentReader final : public FileReader {
 public:
  explicit ContentReader(std::shared_ptr<const DeviceFile> file) : file_(std::move(file)) {}
  Result<size_t> Pread(uint64_t offset, size_t len, char* buf) override {
    const std::string& c = file_->content;
    if (offset >= c.size()) return size_t{0};
    const size_t n = std::min<size_t>(len, c.size() - offset);
    std::memcpy(buf, c.data() + offset, n);
    return n;
  }
  const FileEntry& entry() const override { return file_->entry; }

 private:
  std::shared_ptr<const DeviceFile> file_;
};

FileEntry DeviceEntry(const std::string& name, uint64_t size, const SnapshotInfo& info,
                      const SnapshotOwner& owner) {
  FileEntry e;
  e.path = name;
  e.type = FileType::kRegular;
  e.mode = 0600;
  e.uid = owner.uid;
  e.gid = owner.gid;
  e.size = size;
  e.mtime_ns = info.created_ns;
  return e;  // stored_bytes 0: the bytes are the images' own
}

// The plugin files of AMD GPUs, as they are in images/.
void AddAmdPluginFiles(const std::vector<FileEntry>& files, const SnapshotInfo& info,
                       const SnapshotOwner& owner,
                       std::vector<std::shared_ptr<const DeviceFile>>* out) {
  for (const auto& f : files) {
    if (f.type != FileType::kRegular || f.path.rfind("images/amdgpu-", 0) != 0) continue;
    auto file = std::make_shared<DeviceFile>();
    file->entry = DeviceEntry(f.path.substr(7), f.size, info, owner);
    file->alias_of = f;
    out->push_back(std::move(file));
  }
}

// The images by path, as listed: the device files read them by their
// listing (path and index), never by a lookup of the path alone.
class ListedImages {
 public:
  ListedImages(const std::vector<FileEntry>& files, const SnapshotInfo& info) : info_(info) {
    for (const auto& f : files)
      if (f.type == FileType::kRegular) listed_.emplace(f.path, &f);
  }

  Result<const FileEntry*> Find(const std::string& path) const {
    auto it = listed_.find(path);
    if (it == listed_.end())
      return Status::Corruption("checkpoint " + info_.id + " records device memory but has no " +
                                path);
    return it->second;
  }

 private:
  const SnapshotInfo& info_;
  std::map<std::string_view, const FileEntry*> listed_;
};

Result<CriuPagemap> ReadPagemap(Store* store, const SnapshotInfo& info, const ListedImages& images,
                                int pid) {
  const std::string path = "images/pagemap-" + std::to_string(pid) + ".img";
  GPUCKPT_ASSIGN_OR_RETURN(const FileEntry* pagemap, images.Find(path));
  GPUCKPT_ASSIGN_OR_RETURN(auto reader, store->OpenListedFile(info.id, info.key, *pagemap));
  GPUCKPT_ASSIGN_OR_RETURN(
      std::string bytes,
      ReadSmallStoredFile(*reader, path + " of checkpoint " + info.id, kMaxPagemapBytes));
  return ParsePagemapImage(bytes, path);
}

// The file of device range `r`: slices of the pages image of the process
// whose pagemap is `map`.
Result<std::shared_ptr<DeviceFile>> RangeFile(const ManifestDeviceRange& r, const CriuPagemap& map,
                                              const ListedImages& images, const SnapshotInfo& info,
                                              const SnapshotOwner& owner) {
  const uint64_t page_size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  auto file = std::make_shared<DeviceFile>();
  const std::string name = fmt::format("cuda-{}-{:x}.bin", r.pid, r.start);
  file->entry = DeviceEntry(name, r.end - r.start, info, owner);
  GPUCKPT_ASSIGN_OR_RETURN(const FileEntry* pages,
                           images.Find("images/pages-" + std::to_string(map.pages_id) + ".img"));
  file->source = *pages;
  file->segments = Slices(map, page_size, r.start, r.end);
  return file;
}

// cuda-ranges.json: what each range file holds.
std::shared_ptr<DeviceFile> RangesIndexFile(const nlohmann::json& listing, const SnapshotInfo& info,
                                            const SnapshotOwner& owner) {
  auto index = std::make_shared<DeviceFile>();
  index->content =
      nlohmann::json{{"version", 1},
                     {"what", "device memory the CUDA driver moved into host memory at checkpoint"},
                     {"ranges", listing}}
          .dump(2) +
      "\n";
  index->entry = DeviceEntry("cuda-ranges.json", index->content.size(), info, owner);
  return index;
}

// A file for each of `ranges` and their index.
Status AddCudaRangeFiles(Store* store, const SnapshotInfo& info, const SnapshotOwner& owner,
                         const std::vector<FileEntry>& files,
                         const std::vector<ManifestDeviceRange>& ranges,
                         std::vector<std::shared_ptr<const DeviceFile>>* out) {
  const ListedImages images(files, info);
  std::map<int, CriuPagemap> pagemaps;
  nlohmann::json listing = nlohmann::json::array();
  for (const ManifestDeviceRange& r : ranges) {
    if (pagemaps.count(r.pid) == 0) {
      GPUCKPT_ASSIGN_OR_RETURN(CriuPagemap map, ReadPagemap(store, info, images, r.pid));
      pagemaps.emplace(r.pid, std::move(map));
    }
    GPUCKPT_ASSIGN_OR_RETURN(std::shared_ptr<DeviceFile> file,
                             RangeFile(r, pagemaps.at(r.pid), images, info, owner));
    listing.push_back({{"pid", r.pid},
                       {"start", r.start},
                       {"end", r.end},
                       {"size", r.end - r.start},
                       {"start_hex", fmt::format("0x{:x}", r.start)},
                       {"file", file->entry.path}});
    out->push_back(std::move(file));
  }
  out->push_back(RangesIndexFile(listing, info, owner));
  return Status::Ok();
}

}  // namespace

bool HasDeviceState(const SnapshotInfo& info) {
  const CheckpointManifest m = ManifestOrEmpty(info.extra_json);
  return !m.cuda_host_ranges.empty() ||
         m.gpu_backend.value_or(GpuStacks::kNone) != GpuStacks::kNone;
}

bool IsStoredDevicePath(const std::string& path) {
  return path == "device" || path.rfind("device/", 0) == 0;
}

Result<std::vector<std::shared_ptr<const DeviceFile>>> BuildDeviceFiles(
    Store* store, const SnapshotInfo& info, const SnapshotOwner& owner,
    const std::vector<FileEntry>& files) {
  std::vector<std::shared_ptr<const DeviceFile>> out;
  for (const auto& f : files)
    if (IsStoredDevicePath(f.path)) return out;  // stored itself

  AddAmdPluginFiles(files, info, owner, &out);
  // CUDA device memory moved to host memory.
  // Ranges that are not well formed were left out when the manifest was
  // read: what is left names bytes of this checkpoint's own images.
  const CheckpointManifest manifest = ManifestOrEmpty(info.extra_json);
  if (manifest.cuda_host_ranges.empty()) return out;
  GPUCKPT_RETURN_IF_ERROR(
      AddCudaRangeFiles(store, info, owner, files, manifest.cuda_host_ranges, &out));
  return out;
}

Result<std::unique_ptr<FileReader>> OpenDeviceFile(Store* store, const std::string& id,
                                                   uint64_t key,
                                                   std::shared_ptr<const DeviceFile> file) {
  if (file->alias_of) {
    GPUCKPT_ASSIGN_OR_RETURN(auto source, store->OpenListedFile(id, key, *file->alias_of));
    return std::unique_ptr<FileReader>(new AliasReader(std::move(file), std::move(source)));
  }
  if (file->source) {
    GPUCKPT_ASSIGN_OR_RETURN(auto source, store->OpenListedFile(id, key, *file->source));
    return std::unique_ptr<FileReader>(new SliceReader(std::move(file), std::move(source)));
  }
  return std::unique_ptr<FileReader>(new ContentReader(std::move(file)));
}

}  // namespace gpuckpt
