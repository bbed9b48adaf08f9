#include "core/snapshot/base_extents.h"

#include <algorithm>
#include <cstring>

#include "core/store/keys.h"

namespace gpuckpt {

Result<std::unique_ptr<BaseExtents>> BaseExtents::Load(StoreImpl* store, const std::string& id,
                                                       std::optional<uint32_t> dedup_domain) {
  StoreDb* db = store->db();
  std::unique_ptr<BaseExtents> base(new BaseExtents(db, db->db()->GetSnapshot()));
  rocksdb::ReadOptions r;
  r.snapshot = base->view_;
  std::string record;
  rocksdb::Status s = db->db()->Get(r, db->snapshots(), id, &record);
  if (s.IsNotFound()) return std::unique_ptr<BaseExtents>();
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, "reading base snapshot '" + id + "'"));
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, DecodeSnapshotRecord(id, record));
  if (info.dedup_domain != dedup_domain) return std::unique_ptr<BaseExtents>();
  base->id_ = id;
  base->key_ = info.key;

  GPUCKPT_ASSIGN_OR_RETURN(auto files, store->ReadFileRecords(info.key, base->view_));
  for (auto& [index, entry] : files) {
    if (entry.type == FileType::kRegular) {
      base->file_index_by_path_.emplace(std::move(entry.path), index);
    }
  }
  const BaseExtents* self = base.get();
  base->index_ = std::async(std::launch::async, [self] { return self->BuildIndex(); }).share();
  return base;
}

BaseExtents::~BaseExtents() {
  if (index_.valid()) index_.wait();  // the builder reads through view_
  db_->db()->ReleaseSnapshot(view_);
}

Result<BaseExtents::Index> BaseExtents::BuildIndex() const {
  Index index;
  const std::string lower = keys::SnapshotPrefix(key_);
  const std::string upper = keys::SnapshotPrefix(key_ + 1);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions r;
  r.snapshot = view_;
  r.iterate_upper_bound = &upper_slice;
  r.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->db()->NewIterator(r, db_->extents()));
  for (it->Seek(lower); it->Valid(); it->Next()) {
    const std::string_view key = it->key().ToStringView();
    if (key.size() != keys::kExtentKeySize) return Status::Corruption("malformed extent key");
    const uint64_t file = keys::FileIndexOf(key);
    const uint64_t offset = keys::ExtentOffsetOf(key);
    if (file >= (uint64_t{1} << 20) || offset >= (uint64_t{1} << 44)) continue;
    GPUCKPT_ASSIGN_OR_RETURN(Extent e, DecodeExtentRecord(offset, it->value().ToStringView()));
    if (!e.fingerprint) continue;
    uint64_t low;
    std::memcpy(&low, e.fingerprint->bytes.data(), sizeof(low));
    index.push_back(IndexEntry{low, file << 44 | offset});
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "indexing the base snapshot's extents"));
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
  auto found = std::lower_bound(
      index->begin(), index->end(), low,
      [](const IndexEntry& e, uint64_t v) { return e.fingerprint_low < v; });
  if (found == index->end() || found->fingerprint_low != low) return std::optional<Extent>();
  const uint32_t file = static_cast<uint32_t>(found->where >> 44);
  const uint64_t offset = found->where & ((uint64_t{1} << 44) - 1);
  rocksdb::ReadOptions r;
  r.snapshot = view_;
  rocksdb::PinnableSlice value;
  rocksdb::Status s =
      db_->db()->Get(r, db_->extents(), keys::ExtentKey(key_, file, offset), &value);
  if (s.IsNotFound()) return Status::Corruption("the base snapshot's extent index changed");
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, "reading the base snapshot's extents"));
  GPUCKPT_ASSIGN_OR_RETURN(Extent e, DecodeExtentRecord(offset, value.ToStringView()));
  // The whole fingerprint and the length decide; the index only held 8
  // bytes of it.
  if (e.fingerprint != fingerprint || e.length != length) return std::optional<Extent>();
  return std::optional<Extent>(std::move(e));
}

std::unique_ptr<BaseExtents::Cursor> BaseExtents::Open(const std::string& path) const {
  auto found = file_index_by_path_.find(path);
  if (found == file_index_by_path_.end()) return nullptr;
  return std::unique_ptr<Cursor>(new Cursor(db_, view_, key_, found->second));
}

BaseExtents::Cursor::Cursor(StoreDb* db, const rocksdb::Snapshot* view, uint64_t key,
                            uint32_t file_index)
    : lower_(keys::ExtentKey(key, file_index, 0)),
      upper_(keys::FileKey(key, file_index + 1)),
      lower_slice_(lower_),
      upper_slice_(upper_) {
  rocksdb::ReadOptions r;
  r.snapshot = view;
  r.iterate_lower_bound = &lower_slice_;
  r.iterate_upper_bound = &upper_slice_;
  // One pass over records nobody reads again soon.
  r.fill_cache = false;
  it_.reset(db->db()->NewIterator(r, db->extents()));
  it_->Seek(lower_);
}

Result<std::optional<Extent>> BaseExtents::Cursor::At(uint64_t offset) {
  while (it_->Valid() && keys::ExtentOffsetOf(it_->key().ToStringView()) < offset) it_->Next();
  if (!it_->Valid()) {
    GPUCKPT_RETURN_IF_ERROR(FromRocks(it_->status(), "reading the base snapshot's extents"));
    return std::optional<Extent>();
  }
  const uint64_t at = keys::ExtentOffsetOf(it_->key().ToStringView());
  if (at != offset) return std::optional<Extent>();
  GPUCKPT_ASSIGN_OR_RETURN(Extent e, DecodeExtentRecord(at, it_->value().ToStringView()));
  return std::optional<Extent>(std::move(e));
}

}  // namespace gpuckpt
