#include "core/snapshot/base_extents.h"

#include <algorithm>
#include <cstring>

namespace gpuckpt {

Result<std::unique_ptr<BaseExtents>> BaseExtents::Load(StoreImpl* store, const std::string& id,
                                                       std::optional<uint32_t> dedup_domain) {
  std::unique_ptr<BaseExtents> base(new BaseExtents(store->catalog(), *store->db()));
  GPUCKPT_ASSIGN_OR_RETURN(
      const std::optional<SnapshotInfo> info,
      store->catalog().FindSnapshot(id, "reading base snapshot '" + id + "'", &base->view_));
  if (!info || info->dedup_domain != dedup_domain) return std::unique_ptr<BaseExtents>();
  base->id_ = id;
  base->key_ = info->key;

  GPUCKPT_ASSIGN_OR_RETURN(auto files, store->catalog().ReadFiles(info->key, &base->view_));
  for (auto& [index, entry] : files) {
    if (entry.type == FileType::kRegular) {
      base->spooled_ = base->spooled_ || entry.spooled;
      base->file_index_by_path_.emplace(std::move(entry.path), index);
    }
  }
  const BaseExtents* self = base.get();
  base->index_ = std::async(std::launch::async, [self] { return self->BuildIndex(); }).share();
  return base;
}

BaseExtents::~BaseExtents() {
  if (index_.valid()) index_.wait();  // the builder reads through view_
}

Result<BaseExtents::Index> BaseExtents::BuildIndex() const {
  Index index;
  ExtentIndex extents(catalog_, ExtentIndex::Scope::Snapshot(key_),
                      ExtentIndex::ReadOptions{.view = &view_, .fill_cache = false});
  for (extents.SeekToFirst(); extents.Valid(); extents.Next()) {
    GPUCKPT_ASSIGN_OR_RETURN(const ExtentKeyParts key, extents.Key());
    const uint64_t file = key.file_index;
    if (file >= (uint64_t{1} << 20) || key.offset >= (uint64_t{1} << 44)) continue;
    GPUCKPT_ASSIGN_OR_RETURN(Extent e, extents.Decode());
    if (!e.fingerprint) continue;
    uint64_t low;
    std::memcpy(&low, e.fingerprint->bytes.data(), sizeof(low));
    index.push_back(IndexEntry{low, file << 44 | key.offset});
  }
  GPUCKPT_RETURN_IF_ERROR(extents.status("indexing the base snapshot's extents"));
  // One entry per fingerprint: equal chunks (zero pages) are all the same
  // chunk, and any of them will do.
  std::sort(index.begin(), index.end(), [](const IndexEntry& a, const IndexEntry& b) {
    return a.fingerprint_low < b.fingerprint_low;
  });
  index.erase(std::unique(index.begin(), index.end(),
                          [](const IndexEntry& a, const IndexEntry& b) {
                            return a.fingerprint_low == b.fingerprint_low;
                          }),
              index.end());
  index.shrink_to_fit();
  return index;
}

Result<std::optional<Extent>> BaseExtents::Find(const ChunkFingerprint& fingerprint,
                                                uint64_t length) const {
  const Result<Index>& index = index_.get();
  if (!index.ok()) return index.status();
  uint64_t low;
  std::memcpy(&low, fingerprint.bytes.data(), sizeof(low));
  auto found =
      std::lower_bound(index->begin(), index->end(), low,
                       [](const IndexEntry& e, uint64_t v) { return e.fingerprint_low < v; });
  if (found == index->end() || found->fingerprint_low != low) return std::optional<Extent>();
  const uint32_t file = static_cast<uint32_t>(found->where >> 44);
  const uint64_t offset = found->where & ((uint64_t{1} << 44) - 1);
  GPUCKPT_ASSIGN_OR_RETURN(
      std::optional<Extent> e,
      catalog_.FindExtent(key_, file, offset, "reading the base snapshot's extents", &view_));
  if (!e) return Status::Corruption("the base snapshot's extent index changed");
  // The whole fingerprint and the length decide; the index only held 8
  // bytes of it.
  if (e->fingerprint != fingerprint || e->length != length) return std::optional<Extent>();
  return e;
}

std::unique_ptr<BaseExtents::Cursor> BaseExtents::Open(const std::string& path) const {
  auto found = file_index_by_path_.find(path);
  if (found == file_index_by_path_.end()) return nullptr;
  return std::unique_ptr<Cursor>(new Cursor(catalog_, &view_, key_, found->second));
}

BaseExtents::Cursor::Cursor(const SnapshotCatalog& catalog, const DbView* view, uint64_t key,
                            uint32_t file_index)
    : extents_(catalog, ExtentIndex::Scope::File(key, file_index),
               // One pass over records nobody reads again soon.
               ExtentIndex::ReadOptions{.view = view, .fill_cache = false}) {
  extents_.SeekToFirst();
}

Result<std::optional<Extent>> BaseExtents::Cursor::At(uint64_t offset) {
  for (; extents_.Valid(); extents_.Next()) {
    GPUCKPT_ASSIGN_OR_RETURN(const ExtentKeyParts key, extents_.Key());
    if (key.offset < offset) continue;
    if (key.offset != offset) return std::optional<Extent>();
    GPUCKPT_ASSIGN_OR_RETURN(Extent e, extents_.Decode());
    return std::optional<Extent>(std::move(e));
  }
  GPUCKPT_RETURN_IF_ERROR(extents_.status("reading the base snapshot's extents"));
  return std::optional<Extent>();
}

}  // namespace gpuckpt
