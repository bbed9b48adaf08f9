// The RocksDB beneath a StoreDb, for the modules that own the database's
// families and encode their records: the store itself (chunk_store: the
// chunk tables) and the snapshot catalog (core/catalog). store_db.h shows
// none of it (it declares the RocksDB types it holds pointers to, no more),
// so the modules above them (snapshot, pool, engine, fs, tools) cannot
// reach the database, its families or RocksDB's API; the build declares
// this header apart (gpuckpt_store_rocks in CMakeLists.txt), for those two
// modules alone.
//
// What it returns belongs to the object asked (the StoreDb, the batch, the
// view) and lives as long as it; thread-safety is RocksDB's (the DB is
// thread-safe, a WriteBatch is not).
#ifndef GPUCKPT_CORE_STORE_STORE_DB_ROCKS_H_
#define GPUCKPT_CORE_STORE_STORE_DB_ROCKS_H_

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <string_view>

#include "core/store/store_db.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// Converts a RocksDB status into ours, with `context` in front of the
// message. The one place where RocksDB errors are mapped.
Status FromRocks(const rocksdb::Status& s, std::string_view context);

// The RocksDB objects of a StoreDb, a StoreBatch and a DbView. Only static
// members: it exists to be their friend.
class StoreDbRocks {
 public:
  StoreDbRocks() = delete;

  static rocksdb::DB* db(const StoreDb& db) { return db.db_.get(); }
  // The store's own families (format.h); their records are chunk_store's,
  // but for the meta family's, which each owner reads and writes by key.
  static rocksdb::ColumnFamilyHandle* meta(const StoreDb& db) { return db.meta(); }
  static rocksdb::ColumnFamilyHandle* chunks(const StoreDb& db) { return db.chunks(); }
  static rocksdb::ColumnFamilyHandle* chunk_meta(const StoreDb& db) { return db.chunk_meta(); }
  // Family `name` (format::k*Family), opened with the others; null for a
  // name the store has none of. Families whose records the store does not
  // know (those of the snapshot catalog) are reached only this way, by
  // their owner.
  static rocksdb::ColumnFamilyHandle* family(const StoreDb& db, std::string_view name);

  // The batch's writes, for the modules that own families to add their
  // records to.
  static rocksdb::WriteBatch& batch(StoreBatch& batch) { return *batch.batch_; }
  // The view's RocksDB snapshot, to read through: null without one (a
  // reader beside the holder).
  static const rocksdb::Snapshot* snapshot(const DbView& view) { return view.snapshot_; }
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_STORE_DB_ROCKS_H_
