// StoreDb: the RocksDB database of a store directory, opened with one column
// family per kind of record, and the pack files that hold its chunk records,
// guarded by an flock()ed lock file so that only one process uses a store at
// a time.
//
// Owns the rocksdb::DB, its column family handles and the ChunkPacks; they
// live as long as the StoreDb. rocksdb::DB and ChunkPacks are thread-safe,
// so a StoreDb may be used from any number of threads.
//
// Ordering: before RocksDB writes any memtable to disk (a flush it starts by
// itself, or FlushAll()), the packs are synced, so a durable pack location
// never points at bytes that are not.
#ifndef GPUCKPT_CORE_STORE_STORE_DB_H_
#define GPUCKPT_CORE_STORE_STORE_DB_H_

#include <rocksdb/db.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/store/chunk_fingerprint.h"
#include "core/store/chunk_packs.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// Converts a RocksDB status into ours, with `context` in front of the
// message. The one place where RocksDB errors are mapped.
Status FromRocks(const rocksdb::Status& s, std::string_view context);

class StoreDb {
 public:
  // Opens `dir` (creating it with mode 0700 when `create_if_missing`).
  // Refuses a non-empty directory that is not a store, a store held by
  // another process (kBusy, naming its pid) and a store written by a newer
  // format (kUnavailable).
  static Result<std::unique_ptr<StoreDb>> Open(const std::string& dir, bool create_if_missing,
                                               size_t block_cache_bytes);
  ~StoreDb();

  StoreDb(const StoreDb&) = delete;
  StoreDb& operator=(const StoreDb&) = delete;

  rocksdb::DB* db() const { return db_.get(); }
  rocksdb::ColumnFamilyHandle* meta() const { return handles_[0]; }
  rocksdb::ColumnFamilyHandle* chunks() const { return handles_[1]; }
  rocksdb::ColumnFamilyHandle* chunk_meta() const { return handles_[2]; }
  rocksdb::ColumnFamilyHandle* snapshots() const { return handles_[3]; }
  rocksdb::ColumnFamilyHandle* files() const { return handles_[4]; }
  rocksdb::ColumnFamilyHandle* extents() const { return handles_[5]; }
  const std::vector<rocksdb::ColumnFamilyHandle*>& all_families() const { return handles_; }

  ChunkPacks& packs() const { return *packs_; }

  // The key of this store's chunk fingerprints (its seed is made the first
  // time a store is opened without one).
  const FingerprintKey& fingerprint_key() const { return *fingerprint_key_; }

  const std::string& dir() const { return dir_; }

  // Makes everything written so far durable: syncs the packs, then flushes
  // the memtables of every family (which writes and syncs their files).
  // Chunk locations, their meta records and extents are written without
  // RocksDB's WAL, so this is what makes them durable before a manifest that
  // names them is published.
  Status FlushAll();

 private:
  StoreDb() = default;

  std::string dir_;
  int lock_fd_ = -1;
  std::unique_ptr<ChunkPacks> packs_;  // outlives db_: its flushes sync the packs
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::optional<FingerprintKey> fingerprint_key_;  // set by Open()
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_STORE_DB_H_
