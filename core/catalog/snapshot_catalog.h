// SnapshotCatalog: the tables that say what snapshots a store holds, as
// typed operations: the snapshot records (family `snapshots`, the
// manifests, by id), each snapshot's file records (`files`) and each
// file's extent records (`extents`, walked through ExtentIndex), and the
// counter their snapshot keys come from (the meta family's
// next_snapshot_key). Their keys (catalog_keys.h) and values (records.h)
// are encoded here and nowhere else; the families themselves are opened
// with the others by the StoreDb, which asks for them by name.
//
// Durability: file and extent records are written without RocksDB's WAL
// (WriteIndex(), in bulk) and are durable only once MakeIndexDurable()
// returns; nothing durable may name them before (a snapshot record is
// published after it). Snapshot records and deletions are written through
// the WAL (Write(), PutSnapshot()), synced when the caller asks.
//
// Thread-safe (RocksDB is), except AllocateKey(), which callers serialise.
// Borrows the StoreDb, which must outlive it.
#ifndef GPUCKPT_CORE_CATALOG_SNAPSHOT_CATALOG_H_
#define GPUCKPT_CORE_CATALOG_SNAPSHOT_CATALOG_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/catalog/records.h"
#include "core/store/store_db.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

// Held by pointer only, so that the catalog's users see no RocksDB.
namespace rocksdb {
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace gpuckpt {

class SnapshotCatalog {
 public:
  // The catalog of `db`'s store. Fails (kCorruption) when the store lacks
  // one of its families.
  static Result<std::unique_ptr<SnapshotCatalog>> Open(StoreDb* db);

  SnapshotCatalog(const SnapshotCatalog&) = delete;
  SnapshotCatalog& operator=(const SnapshotCatalog&) = delete;

  // A key no snapshot has had: stored (synced) as used before it is
  // returned, so it is never handed out twice, and the records of a writer
  // that died never mix with a later snapshot's. Callers serialise calls.
  Result<uint64_t> AllocateKey();

  // Snapshot records. Reads are as of `view` when given, else as of now.
  // Snapshot `id`'s record; nullopt without one. Errors name `context`.
  Result<std::optional<SnapshotInfo>> FindSnapshot(const std::string& id, std::string_view context,
                                                   const DbView* view = nullptr) const;
  // Whether there is a snapshot record `id`.
  Result<bool> HasSnapshot(const std::string& id) const;
  // Whether there is any snapshot record.
  Result<bool> HasAnySnapshot() const;
  // Every snapshot record, oldest (smallest key) first.
  Result<std::vector<SnapshotInfo>> ListSnapshots(const DbView* view = nullptr) const;
  // Writes `info`'s record (replacing one of its id) through the WAL,
  // synced when `sync`; errors name `context`.
  Status PutSnapshot(const SnapshotInfo& info, bool sync, std::string_view context);

  // File records of snapshot `key`, with their index numbers, in index order.
  Result<std::vector<std::pair<uint32_t, FileEntry>>> ReadFiles(uint64_t key,
                                                                const DbView* view = nullptr) const;
  // File `index` of snapshot `key`; nullopt without one. Errors name `context`.
  Result<std::optional<FileEntry>> FindFile(uint64_t key, uint32_t index,
                                            std::string_view context) const;
  // The extent of file `index` of snapshot `key` at `offset`; nullopt
  // without one. Errors name `context`.
  Result<std::optional<Extent>> FindExtent(uint64_t key, uint32_t index, uint64_t offset,
                                           std::string_view context,
                                           const DbView* view = nullptr) const;
  // The keys of the snapshots that have file records, each once, in order
  // (gc finds orphans among them: a snapshot of directories and empty
  // files only has no extents).
  Result<std::vector<uint64_t>> KeysWithFiles() const;

  // Adding to a batch (written by WriteIndex() or Write(), or by the
  // StoreDb together with others' records).
  // File record `index` of snapshot `key`, already encoded (EncodeFileRecord(),
  // or as the shared pool keeps it).
  Status AddFile(StoreBatch* batch, uint64_t key, uint32_t index, std::string_view record) const;
  // The extent record of file `index` of snapshot `key` at `offset`
  // (EncodeExtentRecord()).
  Status AddExtent(StoreBatch* batch, uint64_t key, uint32_t index, uint64_t offset,
                   std::string_view record) const;
  // Deletes snapshot record `id`.
  Status DeleteSnapshot(StoreBatch* batch, const std::string& id) const;
  // Deletes every file and extent record of snapshot `key`.
  Status DeleteRecordsOf(StoreBatch* batch, uint64_t key) const;
  // Deletes every extent record of file `index` of snapshot `key`.
  Status DeleteExtentsOf(StoreBatch* batch, uint64_t key, uint32_t index) const;

  // Writes file and extent records of `batch` without RocksDB's WAL (it
  // would write every byte twice): durable once MakeIndexDurable() returns.
  Status WriteIndex(StoreBatch* batch, std::string_view context);
  // Makes everything written so far durable (StoreDb::FlushAll(): the packs
  // the extents name, then every family): before a snapshot record names it.
  Status MakeIndexDurable();
  // Writes `batch` through the WAL, synced when `sync` (removals).
  Status Write(StoreBatch* batch, bool sync, std::string_view context);

 private:
  friend class ExtentIndex;
  SnapshotCatalog(StoreDb* db, rocksdb::ColumnFamilyHandle* snapshots,
                  rocksdb::ColumnFamilyHandle* files, rocksdb::ColumnFamilyHandle* extents)
      : db_(db), snapshots_(snapshots), files_(files), extents_(extents) {}

  StoreDb* db_;
  rocksdb::ColumnFamilyHandle* snapshots_;  // owned by db_, as the others
  rocksdb::ColumnFamilyHandle* files_;
  rocksdb::ColumnFamilyHandle* extents_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_CATALOG_SNAPSHOT_CATALOG_H_
