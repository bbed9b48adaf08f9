#include "core/catalog/snapshot_catalog.h"

#include <rocksdb/db.h>
#include <rocksdb/iterator.h>

#include <algorithm>

#include "core/base/big_endian.h"
#include "core/catalog/catalog_keys.h"
#include "core/store/format.h"
#include "core/store/store_db_rocks.h"

namespace gpuckpt {
namespace {

rocksdb::ReadOptions ReadAsOf(const DbView* view) {
  rocksdb::ReadOptions r;
  r.snapshot = view != nullptr ? StoreDbRocks::snapshot(*view) : nullptr;
  return r;
}

}  // namespace

Result<std::unique_ptr<SnapshotCatalog>> SnapshotCatalog::Open(StoreDb* db) {
  rocksdb::ColumnFamilyHandle* snapshots = StoreDbRocks::family(*db, format::kSnapshotsFamily);
  rocksdb::ColumnFamilyHandle* files = StoreDbRocks::family(*db, format::kFilesFamily);
  rocksdb::ColumnFamilyHandle* extents = StoreDbRocks::family(*db, format::kExtentsFamily);
  if (snapshots == nullptr || files == nullptr || extents == nullptr) {
    return Status::Corruption("store " + db->dir() + " lacks the snapshot catalog's families");
  }
  return std::unique_ptr<SnapshotCatalog>(new SnapshotCatalog(db, snapshots, files, extents));
}

Result<uint64_t> SnapshotCatalog::AllocateKey() {
  std::string value;
  uint64_t next = 1;
  rocksdb::Status s = StoreDbRocks::db(*db_)->Get(rocksdb::ReadOptions(), StoreDbRocks::meta(*db_),
                                                  format::kMetaNextSnapshotKey, &value);
  if (s.ok()) {
    if (value.size() != 8) return Status::Corruption("next snapshot key record is malformed");
    next = GetBigEndian(value, 8);
  } else if (!s.IsNotFound()) {
    return FromRocks(s, "reading the next snapshot key");
  }
  std::string encoded;
  PutBigEndian(&encoded, next + 1, 8);
  rocksdb::WriteOptions w;
  w.sync = true;
  GPUCKPT_RETURN_IF_ERROR(
      FromRocks(StoreDbRocks::db(*db_)->Put(w, StoreDbRocks::meta(*db_),
                                            format::kMetaNextSnapshotKey, encoded),
                "storing the next snapshot key"));
  return next;
}

Result<std::optional<SnapshotInfo>> SnapshotCatalog::FindSnapshot(const std::string& id,
                                                                  std::string_view context,
                                                                  const DbView* view) const {
  std::string record;
  rocksdb::Status s = StoreDbRocks::db(*db_)->Get(ReadAsOf(view), snapshots_, id, &record);
  if (s.IsNotFound()) return std::optional<SnapshotInfo>();
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, context));
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, DecodeSnapshotRecord(id, record));
  return std::optional<SnapshotInfo>(std::move(info));
}

Result<bool> SnapshotCatalog::HasSnapshot(const std::string& id) const {
  std::string ignored;
  rocksdb::Status s = StoreDbRocks::db(*db_)->Get(rocksdb::ReadOptions(), snapshots_, id, &ignored);
  if (s.IsNotFound()) return false;
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, "looking up snapshot '" + id + "'"));
  return true;
}

Result<bool> SnapshotCatalog::HasAnySnapshot() const {
  std::unique_ptr<rocksdb::Iterator> it(
      StoreDbRocks::db(*db_)->NewIterator(rocksdb::ReadOptions(), snapshots_));
  it->SeekToFirst();
  const bool any = it->Valid();
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing snapshots"));
  return any;
}

Result<std::vector<SnapshotInfo>> SnapshotCatalog::ListSnapshots(const DbView* view) const {
  std::vector<SnapshotInfo> out;
  std::unique_ptr<rocksdb::Iterator> it(
      StoreDbRocks::db(*db_)->NewIterator(ReadAsOf(view), snapshots_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, DecodeSnapshotRecord(it->key().ToStringView(),
                                                                     it->value().ToStringView()));
    out.push_back(std::move(info));
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing snapshots"));
  std::stable_sort(out.begin(), out.end(),
                   [](const SnapshotInfo& a, const SnapshotInfo& b) { return a.key < b.key; });
  return out;
}

Status SnapshotCatalog::PutSnapshot(const SnapshotInfo& info, bool sync, std::string_view context) {
  rocksdb::WriteOptions w;
  w.sync = sync;
  return FromRocks(StoreDbRocks::db(*db_)->Put(w, snapshots_, info.id, EncodeSnapshotRecord(info)),
                   context);
}

Result<std::vector<std::pair<uint32_t, FileEntry>>> SnapshotCatalog::ReadFiles(
    uint64_t key, const DbView* view) const {
  std::vector<std::pair<uint32_t, FileEntry>> out;
  const std::string lower = keys::SnapshotPrefix(key);
  const std::string upper = keys::SnapshotPrefix(key + 1);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions r = ReadAsOf(view);
  r.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(StoreDbRocks::db(*db_)->NewIterator(r, files_));
  for (it->Seek(lower); it->Valid(); it->Next()) {
    if (it->key().size() != keys::kFileKeySize) {
      return Status::Corruption("malformed file record key");
    }
    GPUCKPT_ASSIGN_OR_RETURN(FileEntry e, DecodeFileRecord(it->value().ToStringView()));
    e.index = keys::FileIndexOf(it->key().ToStringView());
    out.emplace_back(e.index, std::move(e));
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "reading file records"));
  return out;
}

Result<std::optional<FileEntry>> SnapshotCatalog::FindFile(uint64_t key, uint32_t index,
                                                           std::string_view context) const {
  std::string record;
  rocksdb::Status s = StoreDbRocks::db(*db_)->Get(rocksdb::ReadOptions(), files_,
                                                  keys::FileKey(key, index), &record);
  if (s.IsNotFound()) return std::optional<FileEntry>();
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, context));
  GPUCKPT_ASSIGN_OR_RETURN(FileEntry e, DecodeFileRecord(record));
  return std::optional<FileEntry>(std::move(e));
}

Result<std::optional<Extent>> SnapshotCatalog::FindExtent(uint64_t key, uint32_t index,
                                                          uint64_t offset, std::string_view context,
                                                          const DbView* view) const {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = StoreDbRocks::db(*db_)->Get(ReadAsOf(view), extents_,
                                                  keys::ExtentKey(key, index, offset), &value);
  if (s.IsNotFound()) return std::optional<Extent>();
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, context));
  GPUCKPT_ASSIGN_OR_RETURN(Extent e, DecodeExtentRecord(offset, value.ToStringView()));
  return std::optional<Extent>(std::move(e));
}

Result<std::vector<uint64_t>> SnapshotCatalog::KeysWithFiles() const {
  std::vector<uint64_t> out;
  std::unique_ptr<rocksdb::Iterator> it(
      StoreDbRocks::db(*db_)->NewIterator(rocksdb::ReadOptions(), files_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const uint64_t key = keys::SnapshotKeyOf(it->key().ToStringView());
    if (out.empty() || out.back() != key) out.push_back(key);
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning file records"));
  return out;
}

Status SnapshotCatalog::AddFile(StoreBatch* batch, uint64_t key, uint32_t index,
                                std::string_view record) const {
  return FromRocks(StoreDbRocks::batch(*batch).Put(files_, keys::FileKey(key, index), record),
                   "batching file records");
}

Status SnapshotCatalog::AddExtent(StoreBatch* batch, uint64_t key, uint32_t index, uint64_t offset,
                                  std::string_view record) const {
  return FromRocks(
      StoreDbRocks::batch(*batch).Put(extents_, keys::ExtentKey(key, index, offset), record),
      "batching extent");
}

Status SnapshotCatalog::DeleteSnapshot(StoreBatch* batch, const std::string& id) const {
  return FromRocks(StoreDbRocks::batch(*batch).Delete(snapshots_, id),
                   "batching the removal of '" + id + "'");
}

Status SnapshotCatalog::DeleteRecordsOf(StoreBatch* batch, uint64_t key) const {
  const std::string lower = keys::SnapshotPrefix(key);
  const std::string upper = keys::SnapshotPrefix(key + 1);
  auto s = StoreDbRocks::batch(*batch).DeleteRange(files_, lower, upper);
  if (s.ok()) s = StoreDbRocks::batch(*batch).DeleteRange(extents_, lower, upper);
  return FromRocks(s, "batching the removal of a snapshot's records");
}

Status SnapshotCatalog::DeleteExtentsOf(StoreBatch* batch, uint64_t key, uint32_t index) const {
  // From the file's bare prefix to past its largest offset.
  const std::string lower = keys::FileKey(key, index);
  return FromRocks(StoreDbRocks::batch(*batch).DeleteRange(extents_, lower,
                                                           lower + std::string(8, '\xff') + '\xff'),
                   "batching stale extents");
}

Status SnapshotCatalog::WriteIndex(StoreBatch* batch, std::string_view context) {
  return db_->Write(batch, StoreDb::Durability::kAtFlush, context);
}

Status SnapshotCatalog::MakeIndexDurable() { return db_->FlushAll(); }

Status SnapshotCatalog::Write(StoreBatch* batch, bool sync, std::string_view context) {
  return db_->Write(batch, sync ? StoreDb::Durability::kSynced : StoreDb::Durability::kLogged,
                    context);
}

}  // namespace gpuckpt
