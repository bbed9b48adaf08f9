#include "core/store/store_db.h"

#include <dirent.h>
#include <fcntl.h>
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/metadata.h>
#include <rocksdb/table.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/store/format.h"
#include "core/store/store_db_rocks.h"

namespace gpuckpt {
namespace {

bool DirectoryIsEmpty(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool empty = true;
  while (dirent* e = readdir(d)) {
    std::string_view name = e->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  closedir(d);
  return empty;
}

// Whether `dir` holds nothing but what an open of a new store makes before
// its database (the lock file, the reserve, an empty packs directory): a
// creation cut short by a crash or a power loss, to be finished, not
// somebody's unrelated directory.
bool HoldsOnlyAnUnfinishedStore(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool only_ours = true;
  while (dirent* e = readdir(d)) {
    std::string_view name = e->d_name;
    if (name == "." || name == ".." || name == format::kLockFileName ||
        name == format::kReserveFileName) {
      continue;
    }
    if (name == format::kPacksDirName && DirectoryIsEmpty(dir + "/" + format::kPacksDirName)) {
      continue;
    }
    only_ours = false;
    break;
  }
  closedir(d);
  return only_ours;
}

// Syncs the packs before RocksDB writes a memtable out: the memtable may
// hold locations of records appended since the last sync. A failed sync
// cannot stop the flush; ChunkPacks keeps the error and fails every later
// append and FlushAll(), so no snapshot is published on top of it.
class SyncPacksBeforeFlush : public rocksdb::EventListener {
 public:
  explicit SyncPacksBeforeFlush(ChunkPacks* packs) : packs_(packs) {}
  void OnFlushBegin(rocksdb::DB*, const rocksdb::FlushJobInfo&) override {
    packs_->Sync().PermitUnchecked();
  }

 private:
  ChunkPacks* packs_;
};

// RocksDB's info log (STORE/db/LOG), written so that a full disk cannot
// stop the process: RocksDB's own logger asserts on the first line after a
// write of it failed (and Debian's librocksdb is built with assertions:
// the process aborts). A line that does not fit is dropped; at 4 MiB the
// log moves to LOG.old.
class InfoLog : public rocksdb::Logger {
 public:
  explicit InfoLog(std::string path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), path_(std::move(path)) {
    Reopen();
  }
  ~InfoLog() override {
    if (fd_ >= 0) close(fd_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[2048];
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    tm t{};
    localtime_r(&ts.tv_sec, &t);
    int n =
        std::snprintf(line, sizeof(line), "%04d/%02d/%02d-%02d:%02d:%02d.%06ld ", t.tm_year + 1900,
                      t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1000);
    const int m = std::vsnprintf(line + n, sizeof(line) - static_cast<size_t>(n) - 1, format, ap);
    if (m < 0) return;
    n = std::min<int>(n + m, static_cast<int>(sizeof(line)) - 2);
    if (line[n - 1] != '\n') line[n++] = '\n';
    // The write happens under mu_: lines must not interleave, nor a write
    // go to a file being renamed. One short append to a file in the page
    // cache, and only RocksDB's own logging waits for it.
    MutexLock lock(&mu_);
    if (size_ > kMaxBytes) {
      rename(path_.c_str(), (path_ + ".old").c_str());
      Reopen();
    }
    if (fd_ < 0) return;
    const ssize_t w = write(fd_, line, static_cast<size_t>(n));
    if (w > 0) size_ += static_cast<uint64_t>(w);
  }

 private:
  static constexpr uint64_t kMaxBytes = 4u << 20;
  void Reopen() REQUIRES(mu_) {
    if (fd_ >= 0) close(fd_);
    fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    struct stat st {};
    size_ = fd_ >= 0 && fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }

  const std::string path_;
  Mutex mu_;
  int fd_ GUARDED_BY(mu_) = -1;
  uint64_t size_ GUARDED_BY(mu_) = 0;
};

// RocksDB would retry a flush that failed for want of space by itself, on
// a thread of its own, polling the free space; a DB::Resume() of ours meanwhile
// gets kBusy. StoreDb resumes itself before each write transaction instead
// (PrepareWrite()), when it knows whether the reserve may be given up.
class ResumeOnlyWhenAsked : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
};

rocksdb::ColumnFamilyOptions ChunkFamilyOptions(const std::shared_ptr<rocksdb::Cache>& cache) {
  rocksdb::ColumnFamilyOptions o;
  // New chunks are pack locations of ~15 bytes. Chunk records written by
  // version 1 stores stay where they are: in blob files, so compactions
  // move 40-byte references instead of the data.
  o.enable_blob_files = true;
  o.min_blob_size = 2048;  // tiny records (zero chunks compress to ~20 bytes) stay inline
  o.blob_file_size = 256ull << 20;
  o.blob_compression_type = rocksdb::kNoCompression;
  o.compression = rocksdb::kNoCompression;
  // Deleted chunks' space in blob files comes back when compaction relocates
  // the live ones.
  o.enable_blob_garbage_collection = true;
  o.write_buffer_size = 16ull << 20;
  rocksdb::BlockBasedTableOptions t;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.block_cache = cache;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

rocksdb::ColumnFamilyOptions ChunkMetaFamilyOptions(const std::shared_ptr<rocksdb::Cache>& cache) {
  rocksdb::ColumnFamilyOptions o;
  o.write_buffer_size = 16ull << 20;
  o.compression = rocksdb::kNoCompression;  // keys are hashes
  // The same for the memtable: a miss is answered by its bloom filter
  // instead of a walk down a skip list of random keys.
  o.memtable_prefix_bloom_size_ratio = 0.02;
  o.memtable_whole_key_filtering = true;
  rocksdb::BlockBasedTableOptions t;
  // Looked up once per ingested chunk: most lookups of a first checkpoint
  // miss, and a bloom filter answers a miss without I/O.
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.block_cache = cache;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

rocksdb::ColumnFamilyOptions IndexFamilyOptions(const std::shared_ptr<rocksdb::Cache>& cache) {
  rocksdb::ColumnFamilyOptions o;
  o.write_buffer_size = 32ull << 20;
  o.compression = rocksdb::kNoCompression;  // values are hashes: incompressible
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = cache;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

// The store's column families, in the order of StoreDb's handles.
std::vector<rocksdb::ColumnFamilyDescriptor> Families(
    const std::shared_ptr<rocksdb::Cache>& cache) {
  return {
      {format::kMetaFamily, IndexFamilyOptions(cache)},
      {format::kChunksFamily, ChunkFamilyOptions(cache)},
      {format::kChunkMetaFamily, ChunkMetaFamilyOptions(cache)},
      {format::kSnapshotsFamily, IndexFamilyOptions(cache)},
      {format::kFilesFamily, IndexFamilyOptions(cache)},
      {format::kExtentsFamily, IndexFamilyOptions(cache)},
  };
}

// Removes a read-only opener's own directory (RocksDB's info log of it; no
// subdirectories).
void RemoveReaderDirectory(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") unlinkat(dirfd(d), name.c_str(), 0);
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

// The format version recorded in store `dir`, if this build reads it.
Result<unsigned long> ReadableVersion(const std::string& dir, const std::string& version) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(version.c_str(), &end, 10);
  if (version.empty() || *end != '\0') {
    return Status::Corruption("store " + dir + " has an unreadable version '" + version + "'");
  }
  if (v > format::kStoreVersion) {
    return Status::Unavailable("store " + dir + " has format version " + version +
                               ", newer than this gpuckpt supports (" +
                               std::to_string(format::kStoreVersion) + ")");
  }
  return v;
}

// Makes the store directory `dir` when it is missing and may be created,
// durably; refuses a path that is there but no directory.
Status MakeStoreDirectory(const std::string& dir, bool create_if_missing, StoreFileOps* files) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT || !create_if_missing) return StatusFromErrno(errno, "store " + dir);
    if (files->MakeDirectory(dir.c_str(), 0700) != 0) {
      if (errno != EEXIST) return StatusFromErrno(errno, "creating store " + dir);
    } else {
      // A new directory's name is durable once its parent is synced: until
      // then a power loss may take the store, and every snapshot committed
      // to it, away.
      std::string parent = std::filesystem::path(dir).parent_path().string();
      if (parent.empty()) parent = ".";
      // A parent this user may write but not read (mode -wx) cannot be
      // opened to sync; the store works without it.
      if (files->SyncDirectory(parent.c_str()) != 0 && errno != EACCES) {
        return StatusFromErrno(errno, "syncing " + parent);
      }
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("store " + dir + " is not a directory");
  }
  return Status::Ok();
}

// Refuses `dir` when it has no database and either may not get one or holds
// something else than an unfinished store.
Status CheckHoldsStoreOrMayCreateOne(const std::string& dir, const std::string& db_dir,
                                     bool create_if_missing) {
  struct stat db_st {};
  const bool has_db = stat(db_dir.c_str(), &db_st) == 0;
  // Not a missing store: one this caller may not look into.
  if (!has_db && errno != ENOENT && errno != ENOTDIR) return StatusFromErrno(errno, "store " + dir);
  if (!has_db) {
    if (!create_if_missing) return Status::NotFound("no gpuckpt store in " + dir);
    // Never scatter our files into somebody's unrelated directory.
    if (!HoldsOnlyAnUnfinishedStore(dir)) {
      return Status::InvalidArgument(dir + " is not a gpuckpt store and is not empty");
    }
  }
  return Status::Ok();
}

// Makes db/ if it is missing and syncs the store directory's names.
Status MakeDatabaseDirectory(const std::string& dir, const std::string& db_dir,
                             StoreFileOps* files) {
  if (files->MakeDirectory(db_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return StatusFromErrno(errno, "creating " + db_dir);
  }
  // The names of packs/ and db/, which may have just been made (or made by
  // an open that crashed before this sync). Cheap when nothing changed.
  if (files->SyncDirectory(dir.c_str()) != 0) return StatusFromErrno(errno, "syncing " + dir);
  return Status::Ok();
}

// The options of a holder's database in `db_dir`. Makes the info log file.
rocksdb::DBOptions HolderDbOptions(const std::string& db_dir, bool create_if_missing,
                                   rocksdb::Env* env, ChunkPacks* packs) {
  rocksdb::DBOptions db_options;
  db_options.info_log = std::make_shared<InfoLog>(db_dir + "/LOG");
  if (env) db_options.env = env;
  db_options.create_if_missing = create_if_missing;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 4;
  db_options.bytes_per_sync = 1 << 20;
  db_options.keep_log_file_num = 4;
  db_options.max_total_wal_size = 256ull << 20;
  // Chunks, their meta records and extents are written without the WAL and
  // made durable by a flush before a snapshot is published. Atomic flush
  // keeps the families consistent with each other at every flush, so a
  // crash never leaves a meta record whose chunk was lost.
  db_options.atomic_flush = true;
  // Chunks of a file lie in order in the blob files, so a sequential read
  // of a checkpoint is a sequential read of the disk: let the kernel read
  // ahead (RocksDB otherwise advises "random" on every file it opens).
  db_options.advise_random_on_open = false;
  // No preallocation: RocksDB would fallocate 1.1 write buffers (35 MiB) for
  // every WAL, which here holds a few KiB (bulk writes skip it), and 1.1
  // target file sizes for every compaction output. On a small or nearly
  // full disk those reservations alone made writes fail that would fit.
  db_options.allow_fallocate = false;
  db_options.listeners.push_back(std::make_shared<SyncPacksBeforeFlush>(packs));
  db_options.listeners.push_back(std::make_shared<ResumeOnlyWhenAsked>());
  return db_options;
}

// What a column family holds, in the words of a damage report.
std::string FamilyContents(const std::string& family) {
  if (family == format::kMetaFamily) return "the store's own records (version, seed)";
  if (family == format::kChunksFamily) return "where each chunk lies in the packs";
  if (family == format::kChunkMetaFamily) return "the chunks' names";
  if (family == format::kSnapshotsFamily) return "the snapshot records (what ls lists)";
  if (family == format::kFilesFamily) return "the snapshots' file records";
  if (family == format::kExtentsFamily) return "the snapshots' extent indexes";
  return "column family " + family;
}

// A database opened by CheckIndexIsWhole(), closed when it goes.
struct StrictReader {
  ~StrictReader() {
    if (!db) return;
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    db->Close().PermitUncheckedError();
  }
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
};

// Opens the database in `db_dir` as its holder would, in RocksDB's
// read-only mode: the latest version the MANIFEST names, every table of it
// opened (footer, index, filter and properties blocks checked), and any
// that fails fails the open. A holder that compacts meanwhile removes
// tables: one removed between the MANIFEST's reading and the table's
// opening fails the open too, and RocksDB reports that as corruption like
// real damage. So a failed open is tried again, after a pause growing from
// 20 ms, five times in all: damage fails every one, the race with a
// compaction hardly two in a row.
rocksdb::Status OpenStrictly(const std::string& db_dir, const rocksdb::DBOptions& db_options,
                             const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                             StrictReader* out) {
  rocksdb::Status s;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt > 0) usleep(20000u << (attempt - 1));
    rocksdb::DB* raw = nullptr;
    out->handles.clear();
    s = rocksdb::DB::OpenForReadOnly(db_options, db_dir, families, &out->handles, &raw);
    if (s.ok()) {
      out->db.reset(raw);
      break;
    }
  }
  return s;
}

// Reads every block of `table` against its checksum.
rocksdb::Status VerifyTable(const rocksdb::LiveFileMetaData& table,
                            const rocksdb::DBOptions& db_options,
                            const std::vector<rocksdb::ColumnFamilyDescriptor>& families) {
  rocksdb::ColumnFamilyOptions cf_options;
  for (const auto& f : families) {
    if (f.name == table.column_family_name) cf_options = f.options;
  }
  rocksdb::ReadOptions read;
  read.verify_checksums = true;
  read.fill_cache = false;
  return rocksdb::VerifySstFileChecksum(rocksdb::Options(db_options, cf_options),
                                        rocksdb::EnvOptions(), read, table.db_path + table.name,
                                        table.largest_seqno);
}

// Reads every block of every table of `db` against its checksum: the data
// blocks too, which no open reads, so that damage in a part a command does
// not read (ls reads only the snapshot records) is found all the same.
// kCorruption names every damaged table and what it holds.
Status VerifyEveryTable(const std::string& dir, rocksdb::DB* db,
                        const rocksdb::DBOptions& db_options,
                        const std::vector<rocksdb::ColumnFamilyDescriptor>& families) {
  std::vector<rocksdb::LiveFileMetaData> tables;
  db->GetLiveFilesMetaData(&tables);
  std::sort(tables.begin(), tables.end(),
            [](const auto& a, const auto& b) { return a.file_number < b.file_number; });
  std::string damaged, first_error;
  for (const auto& table : tables) {
    const rocksdb::Status s = VerifyTable(table, db_options, families);
    // Gone: the holder compacted it away since the open. Not damage.
    if (s.ok() || s.IsPathNotFound()) continue;
    const std::string file = std::string(format::kDbDirName) + table.name;
    if (!s.IsCorruption()) return FromRocks(s, "checking " + file + " of store " + dir);
    damaged += damaged.empty() ? "" : ", ";
    damaged += file + " (" + FamilyContents(table.column_family_name) + ")";
    if (first_error.empty()) first_error = s.ToString();
  }
  if (damaged.empty()) return Status::Ok();
  return Status::Corruption("store " + dir + " is damaged: tables of its index fail their " +
                            "checksums: " + damaged + "; first error: " + first_error);
}

// The tables in `db_dir` that fail their checksums, named "db/N.sst": for
// the report of an index that does not open whole, since RocksDB's message
// does not always name the table ("properties unsorted"). On that path
// only: on a healthy store nothing lists the directory. A table the holder
// is writing at that moment would be listed too.
std::string DamagedTables(const std::string& db_dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(db_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string_view name = e->d_name;
      if (name.size() > 4 && name.substr(name.size() - 4) == ".sst") names.emplace_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::string damaged;
  for (const std::string& name : names) {
    const rocksdb::Status s = rocksdb::VerifySstFileChecksum(
        rocksdb::Options(), rocksdb::EnvOptions(), db_dir + "/" + name);
    if (!s.IsCorruption()) continue;
    damaged += damaged.empty() ? "" : ", ";
    damaged += std::string(format::kDbDirName) + "/" + name;
  }
  return damaged;
}

// Whether the index of the store in `dir` is whole, before a reader shows
// it. RocksDB's secondary mode, which readers use beside a holder, replays
// the MANIFEST "point in time": a table that does not open is taken as
// missing, and its column family silently shows its last version without
// it, an older index or an empty one, which a reader would report as the
// store ("0 snapshots", fsck "clean"), where the holder's own open refuses
// the store. So the reader first opens the database as the holder would
// (OpenStrictly) and reads every table whole (VerifyEveryTable); RocksDB's
// info log of it goes to `log_dir`. kCorruption names what is damaged.
Status CheckIndexIsWhole(const std::string& dir, const std::string& log_dir) {
  const std::string db_dir = dir + "/" + format::kDbDirName;
  rocksdb::DBOptions db_options;
  db_options.paranoid_checks = true;
  db_options.max_open_files = -1;  // every table opened, so checked, now
  db_options.info_log = std::make_shared<InfoLog>(log_dir + "/LOG.check");
  // A small cache of its own: the tables are read once, and not kept.
  const auto families = Families(rocksdb::NewLRUCache(1u << 20));
  StrictReader reader;
  const rocksdb::Status s = OpenStrictly(db_dir, db_options, families, &reader);
  // Damage, or a table the MANIFEST names gone for good (still missing
  // after the retries).
  if (s.IsCorruption() || s.IsPathNotFound()) {
    const std::string damaged = DamagedTables(db_dir);
    return Status::Corruption("store " + dir + " is damaged: its index (" + format::kDbDirName +
                              "/) does not open whole" +
                              (damaged.empty() ? "" : "; damaged tables: " + damaged) +
                              "; first error: " + s.ToString());
  }
  if (!s.ok()) return FromRocks(s, "checking the index of store " + dir);
  return VerifyEveryTable(dir, reader.db.get(), db_options, families);
}

}  // namespace

Status FromRocks(const rocksdb::Status& s, std::string_view context) {
  if (s.ok()) return Status::Ok();
  std::string m(context);
  m += ": ";
  m += s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(m));
  if (s.IsCorruption()) return Status::Corruption(std::move(m));
  if (s.IsNoSpace()) return OnStoreDisk(Status::NoSpace(std::move(m)));
  if (s.IsBusy() || s.IsTryAgain()) return Status::Busy(std::move(m));
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(m));
  if (s.IsNotSupported()) return Status::Unavailable(std::move(m));
  return Status::IOError(std::move(m));
}

Status OnStoreDisk(Status status) {
  if (status.code() != StatusCode::kNoSpace) return status;
  return Status::NoSpace(std::string(kNoSpaceOnStoreDisk) + ": " + status.message());
}

Result<std::unique_ptr<StoreDb>> StoreDb::Open(const std::string& dir, bool create_if_missing,
                                               size_t block_cache_bytes, const StoreEnv& env) {
  std::unique_ptr<StoreDb> store(new StoreDb());
  store->dir_ = dir;
  store->env_ = env;
  if (store->env_.rocksdb_fs)
    store->rocksdb_env_ = rocksdb::NewCompositeEnv(store->env_.rocksdb_fs);
  StoreFileOps* const files = env.files ? env.files.get() : StoreFileOps::System();
  const std::string db_dir = dir + "/" + format::kDbDirName;

  GPUCKPT_RETURN_IF_ERROR(MakeStoreDirectory(dir, create_if_missing, files));
  GPUCKPT_RETURN_IF_ERROR(CheckHoldsStoreOrMayCreateOne(dir, db_dir, create_if_missing));
  GPUCKPT_RETURN_IF_ERROR(store->LockStore());
  GPUCKPT_ASSIGN_OR_RETURN(store->packs_,
                           ChunkPacks::Open(dir + "/" + format::kPacksDirName, files));
  store->GiveUpReserveIfShortOfSpace();
  auto cache = rocksdb::NewLRUCache(block_cache_bytes);
  GPUCKPT_RETURN_IF_ERROR(MakeDatabaseDirectory(dir, db_dir, files));
  GPUCKPT_RETURN_IF_ERROR(store->OpenDatabase(
      HolderDbOptions(db_dir, create_if_missing, store->rocksdb_env_.get(), store->packs_.get()),
      Families(cache)));
  GPUCKPT_RETURN_IF_ERROR(store->RecordOrCheckVersion());
  GPUCKPT_RETURN_IF_ERROR(store->LoadFingerprintSeed());

  // The reserve again, where it fits. Not having one is no reason to refuse
  // the store (rm and gc must open a full one); new snapshots are refused
  // until it is there (PrepareWrite()).
  {
    MutexLock lock(&store->reserve_mu_);
    store->MakeReserveLocked().PermitUnchecked();
  }
  return store;
}

Status StoreDb::LockStore() {
  const std::string lock_path = dir_ + "/" + format::kLockFileName;
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd_ < 0) return StatusFromErrno(errno, "opening " + lock_path);
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return StatusFromErrno(err, "locking " + lock_path);
    char buf[32] = {};
    const ssize_t n = pread(lock_fd_, buf, sizeof(buf) - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Status::Busy("store " + dir_ + " is in use by process " + holder +
                        " (a running gpuckptfs or gpuckpt); stop it or use another --store");
  }
  // The holder's pid, for the message above; the flock is what counts.
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(lock_fd_, 0) != 0 ||
      pwrite(lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return StatusFromErrno(errno, "writing " + lock_path);
  }
  return Status::Ok();
}

void StoreDb::GiveUpReserveIfShortOfSpace() {
  // The reserve: 1% of the filesystem, within bounds. Opening writes
  // (RocksDB replays its WAL into new table files), so on a full disk the
  // reserve goes first: otherwise a store filled by a process that then
  // exited could not even be opened to rm and gc.
  struct statvfs vfs {};
  uint64_t fs_bytes = 0;
  if (statvfs(dir_.c_str(), &vfs) == 0) fs_bytes = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  reserve_bytes_ =
      std::clamp<uint64_t>(fs_bytes / 100, format::kReserveMinBytes, format::kReserveMaxBytes);
  if (auto free = FreeBytes(); !free.ok() || *free < reserve_bytes_) {
    unlink((dir_ + "/" + format::kReserveFileName).c_str());
  }
}

Status StoreDb::OpenDatabase(const rocksdb::DBOptions& db_options,
                             const std::vector<rocksdb::ColumnFamilyDescriptor>& families) {
  const std::string db_dir = dir_ + "/" + format::kDbDirName;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, db_dir, families, &handles_, &raw);
  if (!s.ok()) return FromRocks(s, "opening the database of store " + dir_);
  db_.reset(raw);
  return Status::Ok();
}

Status StoreDb::RecordOrCheckVersion() {
  std::string version;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), meta(), format::kMetaStoreVersionKey, &version);
  auto write_version = [&] {
    rocksdb::WriteOptions w;
    w.sync = true;
    return db_->Put(w, meta(), format::kMetaStoreVersionKey, std::to_string(format::kStoreVersion));
  };
  if (s.IsNotFound()) {
    s = write_version();
    if (!s.ok()) return FromRocks(s, "initialising store " + dir_);
  } else if (!s.ok()) {
    return FromRocks(s, "reading the version of store " + dir_);
  } else {
    GPUCKPT_ASSIGN_OR_RETURN(const unsigned long v, ReadableVersion(dir_, version));
    if (v < format::kStoreVersion) {
      // Version 1 differs only in keeping records inline, which version 2
      // still reads: new chunks go to packs, and an older gpuckpt must not
      // open the store any more.
      s = write_version();
      if (!s.ok()) return FromRocks(s, "upgrading store " + dir_);
    }
  }
  return Status::Ok();
}

Status StoreDb::LoadFingerprintSeed() {
  // The fingerprint seed: added to stores made before it existed, which
  // older gpuckpt versions ignore (so the format version stays).
  std::string seed;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), meta(), format::kMetaFingerprintSeedKey, &seed);
  if (s.IsNotFound()) {
    GPUCKPT_ASSIGN_OR_RETURN(seed, FingerprintKey::NewSeed());
    rocksdb::WriteOptions w;
    w.sync = true;
    s = db_->Put(w, meta(), format::kMetaFingerprintSeedKey, seed);
    if (!s.ok()) return FromRocks(s, "storing the fingerprint seed of store " + dir_);
  } else if (!s.ok()) {
    return FromRocks(s, "reading the fingerprint seed of store " + dir_);
  }
  auto key = FingerprintKey::FromSeed(seed);
  if (!key.ok()) return Status::Corruption("store " + dir_ + ": " + key.status().message());
  fingerprint_key_.emplace(*key);
  // The same secret keys the names of dedup domains (DeriveChunkDomainKey):
  // a second seed would add a record and nothing a label does not give.
  seed_ = std::move(seed);
  return Status::Ok();
}

Status StoreDb::ReplaceFingerprintSeed(const std::string& seed) {
  if (read_only_) return Status::PermissionDenied("store " + dir_ + " is open read-only");
  auto key = FingerprintKey::FromSeed(seed);
  if (!key.ok()) return key.status();
  rocksdb::WriteOptions w;
  w.sync = true;
  GPUCKPT_RETURN_IF_ERROR(FromRocks(db_->Put(w, meta(), format::kMetaFingerprintSeedKey, seed),
                                    "storing the fingerprint seed of store " + dir_));
  fingerprint_key_.emplace(*key);
  seed_ = seed;
  return Status::Ok();
}

Result<std::unique_ptr<StoreDb>> StoreDb::OpenReadOnly(const std::string& dir,
                                                       size_t block_cache_bytes) {
  std::unique_ptr<StoreDb> store(new StoreDb());
  store->dir_ = dir;
  store->read_only_ = true;
  const std::string db_dir = dir + "/" + format::kDbDirName;
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return StatusFromErrno(errno, "store " + dir);
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument("store " + dir + " is not a directory");
  if (stat(db_dir.c_str(), &st) != 0 && errno != ENOENT && errno != ENOTDIR)
    return StatusFromErrno(errno, "store " + dir);  // not missing: not the caller's to read
  if (stat(db_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::NotFound("no gpuckpt store in " + dir);
  }
  // No lock: the holder, if any, goes on writing. RocksDB's secondary mode
  // reads its files as they were when opened (and when caught up), and
  // keeps its own info log in a directory of ours, outside the store.
  char secondary[] = "/tmp/gpuckpt-reader.XXXXXX";
  if (mkdtemp(secondary) == nullptr) return StatusFromErrno(errno, "creating a reader directory");
  store->secondary_dir_ = secondary;
  GPUCKPT_ASSIGN_OR_RETURN(store->packs_,
                           ChunkPacks::OpenExisting(dir + "/" + format::kPacksDirName));
  GPUCKPT_RETURN_IF_ERROR(CheckIndexIsWhole(dir, store->secondary_dir_));

  rocksdb::DBOptions db_options;
  db_options.max_open_files = -1;  // what secondary mode requires
  db_options.info_log = std::make_shared<InfoLog>(store->secondary_dir_ + "/LOG");
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenAsSecondary(
      db_options, db_dir, store->secondary_dir_, Families(rocksdb::NewLRUCache(block_cache_bytes)),
      &store->handles_, &raw);
  if (!s.ok()) return FromRocks(s, "opening the database of store " + dir + " for reading");
  store->db_.reset(raw);
  // Once more to the holder's latest: a flush of the holder's (a commit's,
  // a settle's) between the reading of its MANIFEST and of its WAL leaves
  // the open view without what that WAL held, which is in a table now.
  s = raw->TryCatchUpWithPrimary();
  if (!s.ok()) return FromRocks(s, "catching up with store " + dir);

  std::string version;
  s = raw->Get(rocksdb::ReadOptions(), store->meta(), format::kMetaStoreVersionKey, &version);
  if (s.IsNotFound()) return Status::NotFound("store " + dir + " is not initialised yet");
  if (!s.ok()) return FromRocks(s, "reading the version of store " + dir);
  GPUCKPT_RETURN_IF_ERROR(ReadableVersion(dir, version).status());
  std::string seed;
  s = raw->Get(rocksdb::ReadOptions(), store->meta(), format::kMetaFingerprintSeedKey, &seed);
  if (s.IsNotFound()) {
    return Status::Unavailable("store " + dir +
                               " has no fingerprint seed yet: open it once for writing");
  }
  if (!s.ok()) return FromRocks(s, "reading the fingerprint seed of store " + dir);
  auto key = FingerprintKey::FromSeed(seed);
  if (!key.ok()) return Status::Corruption("store " + dir + ": " + key.status().message());
  store->fingerprint_key_.emplace(*key);
  store->seed_ = std::move(seed);
  return store;
}

Status StoreDb::CatchUp() {
  if (!read_only_) return Status::Ok();
  return FromRocks(db_->TryCatchUpWithPrimary(), "catching up with store " + dir_);
}

Status StoreDb::MakeReserveLocked() {
  if (reserve_held_) return Status::Ok();
  const std::string path = dir_ + "/" + format::kReserveFileName;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return OnStoreDisk(StatusFromErrno(errno, "creating " + path));
  struct stat st {};
  int err = 0;
  // Allocated blocks, not the size: only they are room held back.
  if (fstat(fd, &st) != 0) {
    err = errno;
  } else if (static_cast<uint64_t>(st.st_blocks) * 512 < reserve_bytes_) {
    // posix_fallocate writes zeros where the filesystem cannot allocate.
    err = posix_fallocate(fd, 0, static_cast<off_t>(reserve_bytes_));
  }
  close(fd);
  if (err != 0) {
    // Whatever part got allocated would only shrink the room left.
    unlink(path.c_str());
    return OnStoreDisk(StatusFromErrno(
        err, "making the " + std::to_string(reserve_bytes_ >> 20) + " MiB reserve " + path));
  }
  reserve_held_ = true;
  return Status::Ok();
}

bool StoreDb::ReleaseReserve() {
  MutexLock lock(&reserve_mu_);
  if (!reserve_held_) return false;
  const std::string path = dir_ + "/" + format::kReserveFileName;
  // Nothing holds the file open: its blocks are free once it is unlinked.
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return false;
  reserve_held_ = false;
  return true;
}

void StoreDb::RestoreReserve() {
  MutexLock lock(&reserve_mu_);
  MakeReserveLocked().PermitUnchecked();
}

Result<uint64_t> StoreDb::FreeBytes() const {
  struct statvfs vfs {};
  if (statvfs(dir_.c_str(), &vfs) != 0) return StatusFromErrno(errno, "statvfs " + dir_);
  return uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

Result<uint64_t> StoreDb::FreeBytesForIngest() {
  GPUCKPT_ASSIGN_OR_RETURN(uint64_t free, FreeBytes());
  MutexLock lock(&reserve_mu_);
  // A held reserve's blocks are allocated already: not among the free.
  if (reserve_held_) return free;
  return free - std::min(free, reserve_bytes_);
}

Status StoreDb::Resume() {
  // A no-op (one mutex) unless a flush or WAL write failed before.
  return FromRocks(db_->Resume(), "resuming store " + dir_ + " after a failed write");
}

Status StoreDb::PrepareWrite(Purpose purpose) {
  if (read_only_) return Status::PermissionDenied("store " + dir_ + " is open for reading only");
  if (purpose == Purpose::kIngest) {
    MutexLock lock(&reserve_mu_);
    Status made = MakeReserveLocked();
    if (made.code() == StatusCode::kNoSpace) {
      return OnStoreDisk(Status::NoSpace(
          "store " + dir_ + " keeps " + std::to_string(reserve_bytes_ >> 20) +
          " MiB free for rm and gc, and that much is not free; remove snapshots (rm, then gc) "
          "or free space on its filesystem"));
    }
    GPUCKPT_RETURN_IF_ERROR(made);
    return Resume();
  }
  // A deletion on a (nearly) full disk: give the reserve up before RocksDB
  // has to write, rather than after a failed write stopped it.
  auto free = FreeBytes();
  if (free.ok() && *free < reserve_bytes_) ReleaseReserve();
  Status resumed = Resume();
  if (!resumed.ok() && ReleaseReserve()) resumed = Resume();
  return resumed;
}

StoreDb::~StoreDb() {
  if (db_ && read_only_) {
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    handles_.clear();
    db_->Close().PermitUncheckedError();
    db_.reset();
  } else if (db_) {
    // RocksDB flushes what the WAL does not hold when it closes; make the
    // packs durable first, and flush while the listener still runs (RocksDB
    // skips listeners once it is shutting down).
    if (packs_->Sync().ok()) FlushAll().PermitUnchecked();
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    handles_.clear();
    db_->Close().PermitUncheckedError();
    db_.reset();
  }
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
  if (!secondary_dir_.empty()) RemoveReaderDirectory(secondary_dir_);
}

Status StoreDb::SyncWal() {
  // RocksDB asserts (aborts) when asked to sync a WAL whose last write
  // failed: only once it has been resumed on a fresh one.
  GPUCKPT_RETURN_IF_ERROR(Resume());
  return FromRocks(db_->SyncWAL(), "syncing the WAL of store " + dir_);
}

Status StoreDb::FlushAll() {
  // A flush started while RocksDB is stopped by an error breaks the WAL
  // for good (until the store is reopened); resuming first is the way out.
  GPUCKPT_RETURN_IF_ERROR(Resume());
  GPUCKPT_RETURN_IF_ERROR(OnStoreDisk(packs_->Sync()));
  rocksdb::FlushOptions f;
  f.wait = true;
  f.allow_write_stall = true;
  return FromRocks(db_->Flush(f, handles_), "flushing store " + dir_);
}

StoreBatch::StoreBatch() : batch_(std::make_unique<rocksdb::WriteBatch>()) {}

StoreBatch::~StoreBatch() = default;

size_t StoreBatch::bytes() const { return batch_->GetDataSize(); }

DbView::DbView(const StoreDb& db)
    : db_(db), snapshot_(db.read_only() ? nullptr : StoreDbRocks::db(db)->GetSnapshot()) {}

DbView::~DbView() {
  if (snapshot_ != nullptr) StoreDbRocks::db(db_)->ReleaseSnapshot(snapshot_);
}

rocksdb::ColumnFamilyHandle* StoreDbRocks::family(const StoreDb& db, std::string_view name) {
  for (rocksdb::ColumnFamilyHandle* h : db.handles_) {
    if (h->GetName() == name) return h;
  }
  return nullptr;
}

Status StoreDb::Write(StoreBatch* batch, Durability durability, std::string_view context) {
  rocksdb::WriteOptions w;
  w.disableWAL = durability == Durability::kAtFlush;
  w.sync = durability == Durability::kSynced;
  Status s = FromRocks(db_->Write(w, batch->batch_.get()), context);
  batch->batch_->Clear();
  return s;
}

}  // namespace gpuckpt
