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
//
// A full disk: RocksDB stops taking writes after a flush or WAL write fails
// (a "background error") until DB::Resume(). StoreDb turns RocksDB's own
// recovery off and resumes in PrepareWrite(), before each write transaction,
// so a store recovers as soon as space is back, without a restart. It also
// keeps a reserve, a file of format::kReserve*Bytes in the store directory,
// which only deletions (rm, gc) may give up: they need to write (the WAL,
// the manifest, a resumed flush) before they free anything. The reserve is
// made again once there is room; new snapshots are refused while it cannot
// be, so they never take the room that rm and gc need.
//
// This header shows no RocksDB: the modules above the store and the
// catalog use the StoreDb, its batches and views as opaque handles. The
// RocksDB beneath them is reached through store_db_rocks.h, which only the
// modules owning the database's families (store, catalog) may include.
#ifndef GPUCKPT_CORE_STORE_STORE_DB_H_
#define GPUCKPT_CORE_STORE_STORE_DB_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/mutex.h"
#include "core/store/chunk_fingerprint.h"
#include "core/store/chunk_hash.h"
#include "core/store/chunk_packs.h"
#include "core/store/store_env.h"
#include "gpuckpt/status.h"

// Held by pointer only; defined where store_db_rocks.h is included.
namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class Snapshot;
class WriteBatch;
struct ColumnFamilyDescriptor;
struct DBOptions;
}  // namespace rocksdb

namespace gpuckpt {

// The words every out-of-space error of the store carries, so that whoever
// ends up showing it (a checkpoint's status line, the command line) says
// plainly what to do something about.
inline constexpr char kNoSpaceOnStoreDisk[] = "no space left on the store's disk";
// `status` (kNoSpace) with those words in front of its message; any other
// status as it is.
Status OnStoreDisk(Status status);

class StoreDb;
class StoreDbRocks;

// Writes to the store's database that are applied together (StoreDb::
// Write()): the chunk store and the snapshot catalog each add the records
// of their own families, so that one atomic write may span both (gc deletes
// orphaned snapshot records and the chunks nothing names in one). Not
// thread-safe: one thread fills one batch.
class StoreBatch {
 public:
  StoreBatch();
  ~StoreBatch();
  StoreBatch(const StoreBatch&) = delete;
  StoreBatch& operator=(const StoreBatch&) = delete;

  // Bytes the batch holds: callers write it when it grows large.
  size_t bytes() const;

 private:
  friend class StoreDb;
  friend class StoreDbRocks;                    // the modules that own families add their records
  std::unique_ptr<rocksdb::WriteBatch> batch_;  // never null
};

// A consistent view of the whole database as it was when the view was made
// (a RocksDB snapshot), which reads through the chunk store and the
// snapshot catalog may share; released when destroyed. A reader beside the
// holder (StoreDb::OpenReadOnly()) takes none: its view moves only when it
// catches up, so it reads as it is. Borrows the StoreDb, which must outlive
// it. Thread-safe; neither copyable nor movable.
class DbView {
 public:
  explicit DbView(const StoreDb& db);
  ~DbView();
  DbView(const DbView&) = delete;
  DbView& operator=(const DbView&) = delete;

 private:
  friend class StoreDbRocks;  // the modules that own families read through it
  const StoreDb& db_;
  const rocksdb::Snapshot* snapshot_;  // owned
};

class StoreDb {
 public:
  // Opens `dir` (creating it with mode 0700 when `create_if_missing`).
  // Refuses a non-empty directory that is not a store, a store held by
  // another process (kBusy, naming its pid) and a store written by a newer
  // format (kUnavailable); a directory left by a creation cut short (the
  // lock file, the reserve, an empty packs/) is completed. RocksDB, the
  // packs and the store's directories do their file I/O through `env` (the
  // real filesystem by default; see store_env.h); the lock file, the
  // reserve and RocksDB's info log, which hold nothing a reopened store
  // needs, do not.
  static Result<std::unique_ptr<StoreDb>> Open(const std::string& dir, bool create_if_missing,
                                               size_t block_cache_bytes, const StoreEnv& env = {});
  // Opens the store in `dir` for reading, beside whoever holds it (a running
  // gpuckptfs): no lock is taken and nothing in `dir` is written. RocksDB's
  // secondary mode shows the database as it was when opened, until
  // CatchUp(); its own files go to a private directory under /tmp, removed
  // again on close. PrepareWrite() fails with kPermissionDenied.
  // Before that, the index is checked whole: every table of the latest
  // version must open, as Open() requires, and every block of every table
  // must match its checksum (secondary mode alone would show a table that
  // does not open as missing: an older or empty index). A damaged index is
  // kCorruption, naming the damaged tables ("db/000123.sst") and, where
  // known, what they hold. This reads the whole index (0.35-0.5% of the
  // logical size of the snapshots kept) once per open.
  static Result<std::unique_ptr<StoreDb>> OpenReadOnly(const std::string& dir,
                                                       size_t block_cache_bytes);
  ~StoreDb();

  StoreDb(const StoreDb&) = delete;
  StoreDb& operator=(const StoreDb&) = delete;

  // How a write (Write()) is made durable.
  enum class Durability {
    // Without RocksDB's WAL: durable once a later FlushAll() returns. For
    // bulk index records, which the WAL would write twice; a crash before
    // the flush loses them, and nothing durable may name them until then.
    kAtFlush,
    kLogged,  // through the WAL, not synced: survives a killed process
    kSynced,  // through the WAL, synced before Write() returns
  };
  // Applies `batch` at once (all of it or none), then clears it; errors
  // name `context`.
  Status Write(StoreBatch* batch, Durability durability, std::string_view context);

  ChunkPacks& packs() const { return *packs_; }
  // Where the store's own files outside RocksDB are written (the packs',
  // and whatever else keeps data beside them): `env`'s, or the system's.
  StoreFileOps* file_ops() const { return env_.files ? env_.files.get() : StoreFileOps::System(); }

  // The key of this store's chunk fingerprints (its seed is made the first
  // time a store is opened without one).
  const FingerprintKey& fingerprint_key() const { return *fingerprint_key_; }

  // The key of chunk names in dedup domain `domain` (SnapshotSpec::
  // dedup_domain), derived from the same seed; nullopt for the shared
  // domain, whose names are plain SHA-256. One short SHA-256 per call.
  std::optional<ChunkDomainKey> domain_key(std::optional<uint32_t> domain) const {
    if (!domain) return std::nullopt;
    return DeriveChunkDomainKey(seed_, *domain);
  }

  const std::string& dir() const { return dir_; }

  // The fingerprint seed itself (secret): the shared pool keeps one for all
  // the stores that use it.
  const std::string& fingerprint_seed() const { return seed_; }
  // Replaces the seed with `seed` (synced), for a store that joins a pool
  // with another seed. Only before the store is used, and only while it
  // holds no snapshot (its fingerprints and domain names would stop
  // matching): the caller checks that. Not thread-safe.
  Status ReplaceFingerprintSeed(const std::string& seed);

  // Whether this is a reader beside the store's holder (OpenReadOnly()).
  bool read_only() const { return read_only_; }
  // A reader: brings its view up to what the holder has written since it
  // opened (or caught up last), so that records the holder's gc moved are
  // found where they are now. A no-op for the holder itself.
  Status CatchUp();

  // Makes everything written so far durable: syncs the packs, then flushes
  // the memtables of every family (which writes and syncs their files).
  // Chunk locations, their meta records and extents are written without
  // RocksDB's WAL, so this is what makes them durable before a manifest that
  // names them is published.
  Status FlushAll();
  // Makes every WAL write so far durable. Use this, not DB::SyncWAL().
  Status SyncWal();

  // Brings RocksDB out of a background error (it stops all writes after a
  // flush or WAL write failed) if it is in one; OK when it is in none (one
  // mutex). Flush, compaction and WAL syncs must follow one: started while
  // RocksDB is stopped they break its WAL until the store is reopened.
  Status Resume();

  // What a write transaction is for.
  enum class Purpose {
    kIngest,   // adds data (a new snapshot): must leave the reserve alone
    kReclaim,  // deletes (rm, gc): may give the reserve up to get going
  };
  // Makes the database writable before a write transaction: resumes it
  // after a background error (a no-op otherwise). kIngest first makes the
  // reserve again if it was given up, and fails with kNoSpace when it does
  // not fit; kReclaim gives the reserve up when the disk is (nearly) full or
  // resuming fails. Errors: kNoSpace, or RocksDB's.
  Status PrepareWrite(Purpose purpose) EXCLUDES(reserve_mu_);
  // Gives the reserve up (a deletion failed with kNoSpace; PrepareWrite()
  // then resumes the database); false when there was none left to give.
  bool ReleaseReserve() EXCLUDES(reserve_mu_);
  // Makes the reserve again after a deletion, if it fits now. Best effort.
  void RestoreReserve() EXCLUDES(reserve_mu_);
  // Size of the reserve while it is held.
  uint64_t reserve_bytes() const { return reserve_bytes_; }

  // Bytes an unprivileged writer may still use on the store's filesystem.
  Result<uint64_t> FreeBytes() const;
  // Of those, what a new snapshot may take: less the reserve when it is
  // not held now (PrepareWrite(kIngest) makes it first).
  Result<uint64_t> FreeBytesForIngest() EXCLUDES(reserve_mu_);

 private:
  friend class StoreDbRocks;  // the database and its families, to their owners
  StoreDb() = default;

  // The store's own families (format.h).
  rocksdb::ColumnFamilyHandle* meta() const { return handles_[0]; }
  rocksdb::ColumnFamilyHandle* chunks() const { return handles_[1]; }
  rocksdb::ColumnFamilyHandle* chunk_meta() const { return handles_[2]; }

  // Creates (or completes) the reserve file; kNoSpace when it does not fit.
  Status MakeReserveLocked() REQUIRES(reserve_mu_);

  // Steps of Open(), in its order.
  // Takes the lock file's flock and writes this process's pid into it.
  Status LockStore();
  // Sets reserve_bytes_ and unlinks the reserve when the disk has less free.
  void GiveUpReserveIfShortOfSpace();
  Status OpenDatabase(const rocksdb::DBOptions& db_options,
                      const std::vector<rocksdb::ColumnFamilyDescriptor>& families);
  // Writes the format version into a new store or one of an older version;
  // refuses a version this build cannot read.
  Status RecordOrCheckVersion();
  // Reads the fingerprint seed, making one when the store has none.
  Status LoadFingerprintSeed();

  std::string dir_;
  bool read_only_ = false;
  std::string secondary_dir_;  // a reader's own directory, removed on close
  int lock_fd_ = -1;
  uint64_t reserve_bytes_ = 0;  // set by Open()
  // Held across the reserve file's creation, fallocate and unlink, so that
  // reserve_held_ always says what is on disk and a release cannot unlink a
  // file another thread is still allocating. Metadata operations, mostly
  // (posix_fallocate writes zeros only where the filesystem cannot
  // allocate), once per snapshot or deletion; no read or write of chunks
  // waits for it.
  Mutex reserve_mu_;
  bool reserve_held_ GUARDED_BY(reserve_mu_) = false;
  StoreEnv env_;  // outlives packs_ and db_, which do their I/O through it
  std::unique_ptr<rocksdb::Env> rocksdb_env_;  // on env_.rocksdb_fs; null: the default
  std::unique_ptr<ChunkPacks> packs_;          // outlives db_: its flushes sync the packs
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::optional<FingerprintKey> fingerprint_key_;  // set by Open()
  std::string seed_;                               // the fingerprint seed, set by Open(); secret
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_STORE_DB_H_
