#include "core/snapshot/store_impl.h"

#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <unordered_set>

#include "core/snapshot/file_reader_impl.h"
#include "core/snapshot/records.h"
#include "core/snapshot/snapshot_writer_impl.h"
#include "core/store/chunk_codec.h"
#include "core/store/format.h"
#include "core/store/keys.h"

namespace gpuckpt {
namespace {

// Disk usage of a directory tree in bytes (st_blocks), like `du -sb`'s
// allocation view.
uint64_t DiskUsage(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (lstat(it->path().c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

// Runs deletion `op` (rm, gc) so that it works on a full disk: the database
// is resumed first, and when `op` fails for want of space while the store
// still holds its reserve, the reserve is given up and `op` runs once more.
// The reserve is made again afterwards where it fits. `op` must be safe to
// run twice (it starts from what is stored).
template <typename Op>
auto Reclaiming(StoreDb* db, Op op) -> decltype(op()) {
  using R = decltype(op());
  Status ready = db->PrepareWrite(StoreDb::Purpose::kReclaim);
  if (!ready.ok()) return R(ready);
  R result = op();
  if (StatusOf(result).code() == StatusCode::kNoSpace && db->ReleaseReserve()) {
    ready = db->PrepareWrite(StoreDb::Purpose::kReclaim);
    result = ready.ok() ? op() : R(ready);
  }
  db->RestoreReserve();
  return result;
}

}  // namespace

SnapshotPin& SnapshotPin::operator=(SnapshotPin&& other) noexcept {
  if (this != &other) {
    Release();
    registry_ = std::move(other.registry_);
    key_ = other.key_;
  }
  return *this;
}

void SnapshotPin::Release() {
  if (!registry_) return;
  {
    MutexLock lock(&registry_->mu);
    auto found = registry_->keys.find(key_);
    if (found != registry_->keys.end()) registry_->keys.erase(found);
  }
  registry_.reset();
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& dir, const StoreOptions& options) {
  return OpenStoreWithEnv(dir, options, StoreEnv());
}

Result<std::unique_ptr<Store>> OpenStoreWithEnv(const std::string& dir, const StoreOptions& options,
                                                const StoreEnv& env) {
  if (dir.empty()) return Status::InvalidArgument("store directory is empty");
  // Validate the chunk sizes before touching anything.
  GPUCKPT_RETURN_IF_ERROR(Chunker::Create(options.chunking.generic, 1).status());
  GPUCKPT_RETURN_IF_ERROR(
      Chunker::Create(options.chunking.pages, options.chunking.page_size).status());
  if (options.zstd_level < -100 || options.zstd_level > 22) {
    return Status::InvalidArgument("zstd level must be between -100 and 22");
  }
  constexpr size_t kBlockCacheBytes = 32u << 20;
  GPUCKPT_ASSIGN_OR_RETURN(
      auto db, options.read_only
                   ? StoreDb::OpenReadOnly(dir, kBlockCacheBytes)
                   : StoreDb::Open(dir, options.create_if_missing, kBlockCacheBytes, env));
  auto cache = std::make_unique<ChunkCache>(options.chunk_cache_bytes);
  GPUCKPT_ASSIGN_OR_RETURN(auto chunks,
                           ChunkStore::Open(db.get(), cache.get(), options.verify_on_read));
  return std::unique_ptr<Store>(
      new StoreImpl(std::move(db), std::move(cache), std::move(chunks), options));
}

StoreImpl::StoreImpl(std::unique_ptr<StoreDb> db, std::unique_ptr<ChunkCache> cache,
                     std::unique_ptr<ChunkStore> chunks, const StoreOptions& options)
    : db_(std::move(db)),
      options_(options),
      cache_(std::move(cache)),
      chunk_store_(std::move(chunks)) {}

StoreImpl::~StoreImpl() {
  // The chunk store borrows the database: it goes first.
  chunk_store_.reset();
}

Result<uint64_t> StoreImpl::AllocateSnapshotKey() {
  // Held across the synced write below: the stored value must only grow,
  // and two allocations writing outside the lock could store the smaller
  // last, handing its successor out again after a crash. Only
  // BeginSnapshot() comes here, once per snapshot.
  MutexLock lock(&key_mu_);
  std::string value;
  uint64_t next = 1;
  rocksdb::Status s =
      db_->db()->Get(rocksdb::ReadOptions(), db_->meta(), format::kMetaNextSnapshotKey, &value);
  if (s.ok()) {
    if (value.size() != 8) return Status::Corruption("next snapshot key record is malformed");
    next = keys::GetBigEndian(value, 8);
  } else if (!s.IsNotFound()) {
    return FromRocks(s, "reading the next snapshot key");
  }
  // Persisted (synced) before use: a key is never handed out twice, so the
  // records of a writer that died can never mix with a later snapshot's.
  std::string encoded;
  keys::PutBigEndian(&encoded, next + 1, 8);
  rocksdb::WriteOptions w;
  w.sync = true;
  GPUCKPT_RETURN_IF_ERROR(
      FromRocks(db_->db()->Put(w, db_->meta(), format::kMetaNextSnapshotKey, encoded),
                "storing the next snapshot key"));
  return next;
}

Result<std::unique_ptr<SnapshotWriter>> StoreImpl::BeginSnapshot(
    const SnapshotSpec& spec_in, const SnapshotWriterOptions& writer_options) {
  SnapshotSpec spec = spec_in;
  if (!spec.extra_json.empty()) {
    // Checked here so that a bad extra fails before any work is done.
    if (spec.extra_json.front() != '{') {
      return Status::InvalidArgument("snapshot extra data must be a JSON object");
    }
  }
  // Space may be back since a write failed; and a new snapshot must not
  // start on a disk without the room rm and gc need.
  GPUCKPT_RETURN_IF_ERROR(db_->PrepareWrite(StoreDb::Purpose::kIngest));
  GPUCKPT_ASSIGN_OR_RETURN(const uint64_t key, AllocateSnapshotKey());
  if (spec.name.empty()) {
    // The next free number, starting from the key.
    for (uint64_t n = key;; ++n) {
      std::string candidate = std::to_string(n);
      Status reserved = ReserveUnusedName(candidate);
      if (reserved.ok()) {
        spec.name = std::move(candidate);
        break;
      }
      if (reserved.code() != StatusCode::kAlreadyExists) return reserved;
    }
  } else {
    GPUCKPT_RETURN_IF_ERROR(ValidateSnapshotName(spec.name));
    GPUCKPT_RETURN_IF_ERROR(ReserveUnusedName(spec.name));
  }
  auto generic = Chunker::Create(options_.chunking.generic, 1);
  auto pages = Chunker::Create(options_.chunking.pages, options_.chunking.page_size);
  if (!generic.ok() || !pages.ok()) {
    ReleaseName(spec.name);
    return !generic.ok() ? generic.status() : pages.status();
  }
  auto writer = std::make_unique<SnapshotWriterImpl>(this, std::move(spec), key, *generic, *pages,
                                                     writer_options);
  GPUCKPT_RETURN_IF_ERROR(writer->LoadBase());
  return std::unique_ptr<SnapshotWriter>(std::move(writer));
}

Status StoreImpl::ReserveUnusedName(const std::string& name) {
  {
    MutexLock lock(&names_mu_);
    if (!reserved_names_.insert(name).second) {
      return Status::AlreadyExists("snapshot '" + name + "' already exists");
    }
  }
  // Looked up once reserved, and without names_mu_ (no lock across I/O):
  // a writer that held the name before published it, if it did, before it
  // let the name go, so its snapshot is found here; and no writer can
  // publish it from now on but ours.
  std::string ignored;
  rocksdb::Status s = db_->db()->Get(rocksdb::ReadOptions(), db_->snapshots(), name, &ignored);
  if (s.IsNotFound()) return Status::Ok();
  ReleaseName(name);
  if (s.ok()) return Status::AlreadyExists("snapshot '" + name + "' already exists");
  return FromRocks(s, "looking up snapshot '" + name + "'");
}

void StoreImpl::ReleaseName(const std::string& name) {
  MutexLock lock(&names_mu_);
  reserved_names_.erase(name);
}

Status StoreImpl::Publish(const SnapshotInfo& info) {
  {
    // The reservation is what makes the check below and the write one
    // step; names_mu_ is not held across them.
    MutexLock lock(&names_mu_);
    if (reserved_names_.count(info.id) == 0) {
      return Status::Internal("snapshot '" + info.id + "' published without its name reserved");
    }
  }
  std::string ignored;
  rocksdb::Status s = db_->db()->Get(rocksdb::ReadOptions(), db_->snapshots(), info.id, &ignored);
  if (s.ok()) return Status::AlreadyExists("snapshot '" + info.id + "' already exists");
  if (!s.IsNotFound()) return FromRocks(s, "looking up snapshot '" + info.id + "'");
  rocksdb::WriteOptions w;
  w.sync = options_.sync;
  return FromRocks(db_->db()->Put(w, db_->snapshots(), info.id, EncodeSnapshotRecord(info)),
                   "publishing snapshot '" + info.id + "'");
}

Result<std::vector<SnapshotInfo>> StoreImpl::List() {
  std::vector<SnapshotInfo> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->db()->NewIterator(rocksdb::ReadOptions(), db_->snapshots()));
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

Result<SnapshotInfo> StoreImpl::Get(const std::string& id) {
  if (!ValidateSnapshotName(id).ok()) {
    return Status::NotFound("no snapshot '" + id + "' (not a valid snapshot id)");
  }
  std::string record;
  rocksdb::Status s = db_->db()->Get(rocksdb::ReadOptions(), db_->snapshots(), id, &record);
  if (s.IsNotFound()) return Status::NotFound("no snapshot '" + id + "' in store " + dir());
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, "reading snapshot '" + id + "'"));
  return DecodeSnapshotRecord(id, record);
}

Result<std::vector<std::pair<uint32_t, FileEntry>>> StoreImpl::ReadFileRecords(
    uint64_t key, const rocksdb::Snapshot* view) {
  std::vector<std::pair<uint32_t, FileEntry>> out;
  const std::string lower = keys::SnapshotPrefix(key);
  const std::string upper = keys::SnapshotPrefix(key + 1);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions r;
  r.snapshot = view;
  r.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->db()->NewIterator(r, db_->files()));
  for (it->Seek(lower); it->Valid(); it->Next()) {
    if (it->key().size() != 12) return Status::Corruption("malformed file record key");
    GPUCKPT_ASSIGN_OR_RETURN(FileEntry e, DecodeFileRecord(it->value().ToStringView()));
    e.index = keys::FileIndexOf(it->key().ToStringView());
    out.emplace_back(e.index, std::move(e));
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "reading file records"));
  return out;
}

Result<std::vector<FileEntry>> StoreImpl::ListFiles(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, Get(id));
  GPUCKPT_ASSIGN_OR_RETURN(auto records, ReadFileRecords(info.key));
  std::vector<FileEntry> out;
  out.reserve(records.size());
  for (auto& [index, e] : records) out.push_back(std::move(e));
  std::sort(out.begin(), out.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.path < b.path; });
  return out;
}

Result<std::pair<SnapshotInfo, SnapshotPin>> StoreImpl::PinSnapshot(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo seen, Get(id));
  {
    MutexLock lock(&pins_->mu);
    pins_->keys.insert(seen.key);
  }
  SnapshotPin pin(pins_, seen.key);
  // Looked up again now that the pin is in: a Remove() that missed the pin
  // has deleted the record by now (it holds pins_->mu until its write is
  // done), and a Gc() that missed it listed the snapshots before, while
  // this one was still there (it lists them before it reads the pins).
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, Get(id));
  if (info.key != seen.key) {
    return Status::NotFound("snapshot '" + id + "' was removed while it was opened");
  }
  return std::make_pair(std::move(info), std::move(pin));
}

Result<std::unique_ptr<FileReader>> StoreImpl::OpenFile(const std::string& id,
                                                        const std::string& path) {
  GPUCKPT_ASSIGN_OR_RETURN(auto pinned, PinSnapshot(id));
  const SnapshotInfo& info = pinned.first;
  GPUCKPT_ASSIGN_OR_RETURN(auto records, ReadFileRecords(info.key));
  for (auto& [index, e] : records) {
    if (e.path != path) continue;
    if (e.type != FileType::kRegular) {
      return Status::InvalidArgument("'" + path + "' in snapshot '" + id +
                                     "' is not a regular file");
    }
    return std::unique_ptr<FileReader>(
        new FileReaderImpl(this, std::move(pinned.second), id, info.key,
                           db_->domain_key(info.dedup_domain), index, std::move(e)));
  }
  return Status::NotFound("no file '" + path + "' in snapshot '" + id + "'");
}

Result<std::unique_ptr<FileReader>> StoreImpl::OpenListedFile(const std::string& id, uint64_t key,
                                                              const FileEntry& entry) {
  GPUCKPT_ASSIGN_OR_RETURN(auto pinned, PinSnapshot(id));
  const SnapshotInfo& info = pinned.first;
  if (info.key != key)
    return Status::NotFound("snapshot '" + id + "' was removed since it was listed");
  std::string record;
  rocksdb::Status s = db_->db()->Get(rocksdb::ReadOptions(), db_->files(),
                                     keys::FileKey(key, entry.index), &record);
  if (s.IsNotFound())
    return Status::NotFound("no file '" + entry.path + "' in snapshot '" + id + "'");
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, "reading a file record of '" + id + "'"));
  GPUCKPT_ASSIGN_OR_RETURN(FileEntry e, DecodeFileRecord(record));
  // The record the listing named, or the listing is not of this snapshot.
  if (e.path != entry.path)
    return Status::NotFound("no file '" + entry.path + "' in snapshot '" + id + "'");
  if (e.type != FileType::kRegular)
    return Status::InvalidArgument("'" + entry.path + "' in snapshot '" + id +
                                   "' is not a regular file");
  e.index = entry.index;
  return std::unique_ptr<FileReader>(new FileReaderImpl(this, std::move(pinned.second), id, key,
                                                        db_->domain_key(info.dedup_domain),
                                                        entry.index, std::move(e)));
}

Status StoreImpl::Remove(const std::string& id) {
  return Reclaiming(db_.get(), [&] { return RemoveOnce(id); });
}

Status StoreImpl::RemoveOnce(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, Get(id));
  rocksdb::WriteBatch batch;
  auto s = batch.Delete(db_->snapshots(), id);
  // Held until the write is done, so that a reader pins either before (and
  // keeps the records) or after (and finds the snapshot gone). A lock across
  // a synced write, then, but only PinSnapshot(), a pin's release and Gc()
  // take it, and an open of a file waits at most for one rm.
  MutexLock pins_lock(&pins_->mu);
  if (pins_->keys.count(info.key) == 0) {
    // Nobody reads it: its index goes in the same atomic batch. Otherwise
    // the records stay for the readers, and the first Gc() after them
    // sweeps them.
    const std::string lower = keys::SnapshotPrefix(info.key);
    const std::string upper = keys::SnapshotPrefix(info.key + 1);
    if (s.ok()) s = batch.DeleteRange(db_->files(), lower, upper);
    if (s.ok()) s = batch.DeleteRange(db_->extents(), lower, upper);
  }
  if (!s.ok()) return FromRocks(s, "batching the removal of '" + id + "'");
  rocksdb::WriteOptions w;
  w.sync = options_.sync;
  return FromRocks(db_->db()->Write(w, &batch), "removing snapshot '" + id + "'");
}

Result<GcReport> StoreImpl::Gc() {
  WriterMutexLock gc_lock(&gc_mu_);  // no writer runs while we sweep
  return Reclaiming(db_.get(), [&] {
    gc_mu_.AssertHeld();  // run by Reclaiming() within gc_lock's scope
    return GcLocked();
  });
}

Result<GcReport> StoreImpl::GcLocked() {
  GcReport report;
  GPUCKPT_ASSIGN_OR_RETURN(auto snapshots, List());
  std::unordered_set<uint64_t> live_keys;
  for (const auto& s : snapshots) live_keys.insert(s.key);
  {
    // Snapshots open readers still read are live too. Read after List():
    // see PinSnapshot().
    MutexLock lock(&pins_->mu);
    live_keys.insert(pins_->keys.begin(), pins_->keys.end());
  }

  // Mark: every chunk named by an extent of a live or pinned snapshot.
  // Extents of other keys belong to writers that never committed, or to
  // snapshots removed while a reader had them pinned: swept below.
  std::unordered_set<uint64_t> marked;  // chunk sequence numbers
  std::vector<uint64_t> orphan_keys;
  {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->db()->NewIterator(rocksdb::ReadOptions(), db_->extents()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const auto key = it->key().ToStringView();
      if (key.size() != keys::kExtentKeySize) return Status::Corruption("malformed extent key");
      const uint64_t snap = keys::SnapshotKeyOf(key);
      if (live_keys.count(snap) == 0) {
        if (orphan_keys.empty() || orphan_keys.back() != snap) orphan_keys.push_back(snap);
        // Skip the rest of this orphan at once.
        it->Seek(keys::SnapshotPrefix(snap + 1));
        if (!it->Valid()) break;
        // Re-examine the key we landed on in the next round.
        it->Prev();
        continue;
      }
      GPUCKPT_ASSIGN_OR_RETURN(
          Extent e, DecodeExtentRecord(keys::ExtentOffsetOf(key), it->value().ToStringView()));
      marked.insert(e.seq);
    }
    GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning extents"));
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->db()->NewIterator(rocksdb::ReadOptions(), db_->files()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const uint64_t snap = keys::SnapshotKeyOf(it->key().ToStringView());
      if (live_keys.count(snap) == 0 &&
          std::find(orphan_keys.begin(), orphan_keys.end(), snap) == orphan_keys.end()) {
        orphan_keys.push_back(snap);
      }
    }
    GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning file records"));
  }

  // Sweep.
  rocksdb::WriteBatch batch;
  for (uint64_t k : orphan_keys) {
    auto s = batch.DeleteRange(db_->files(), keys::SnapshotPrefix(k), keys::SnapshotPrefix(k + 1));
    if (s.ok())
      s = batch.DeleteRange(db_->extents(), keys::SnapshotPrefix(k), keys::SnapshotPrefix(k + 1));
    if (!s.ok()) return FromRocks(s, "batching orphan removal");
    ++report.orphan_records_deleted;
  }
  {
    // The sweep walks the small meta records, not the chunk data.
    std::unique_ptr<rocksdb::Iterator> it(
        db_->db()->NewIterator(rocksdb::ReadOptions(), db_->chunk_meta()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto hash = ChunkHash::FromBytes(it->key().ToStringView());
      auto meta = DecodeChunkMeta(it->value().ToStringView());
      if (!hash.ok() || !meta.ok()) {
        return Status::Corruption("malformed chunk meta record; run fsck");
      }
      if (marked.count(meta->seq) != 0) {
        ++report.chunks_kept;
        continue;
      }
      ++report.chunks_deleted;
      report.bytes_deleted += meta->stored_length;
      auto s = batch.Delete(db_->chunks(), ChunkSeqKey(meta->seq));
      if (s.ok()) s = batch.Delete(db_->chunk_meta(), it->key());
      if (!s.ok()) return FromRocks(s, "batching chunk deletion");
      cache_->Erase(*hash);
      if (batch.GetDataSize() > (4u << 20)) {
        rocksdb::WriteOptions w;
        GPUCKPT_RETURN_IF_ERROR(FromRocks(db_->db()->Write(w, &batch), "deleting chunks"));
        batch.Clear();
      }
    }
    GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning chunk meta records"));
  }
  // A chunk record without a meta record (possible only through damage) is
  // never swept above; fsck reports it.
  rocksdb::WriteOptions w;
  w.sync = options_.sync;
  GPUCKPT_RETURN_IF_ERROR(FromRocks(db_->db()->Write(w, &batch), "deleting chunks"));
  if (report.chunks_deleted > 0) {
    // Give the space back now: rewrite the chunk tables and force blob
    // garbage collection so files holding only dead chunks are deleted.
    rocksdb::CompactRangeOptions c;
    c.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
    c.blob_garbage_collection_age_cutoff = 1.0;
    c.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    // A compaction flushes first: see StoreDb::Resume().
    GPUCKPT_RETURN_IF_ERROR(db_->Resume());
    GPUCKPT_RETURN_IF_ERROR(FromRocks(db_->db()->CompactRange(c, db_->chunks(), nullptr, nullptr),
                                      "compacting after gc"));
  }
  // Also when nothing was deleted now: packs left by a crash, or by a gc
  // that failed half-way, hold only garbage.
  GPUCKPT_ASSIGN_OR_RETURN(auto packs, chunk_store_->CompactPacks());
  report.packs_removed = packs.packs_removed;
  report.packs_rewritten = packs.packs_rewritten;
  report.bytes_rewritten = packs.bytes_rewritten;
  report.bytes_punched = packs.bytes_punched;
  return report;
}

Result<FsckReport> StoreImpl::Fsck() {
  GPUCKPT_ASSIGN_OR_RETURN(FsckReport report, FsckOnce());
  if (report.clean() || !db_->read_only()) return report;
  // A reader beside a running gpuckptfs: what it found may be the holder's
  // gc at work (a pack removed, records punched out) after this view was
  // taken. Findings count once they are there in the holder's view too.
  GPUCKPT_RETURN_IF_ERROR(db_->CatchUp());
  return FsckOnce();
}

Result<FsckReport> StoreImpl::FsckOnce() {
  FsckReport report;
  // Every chunk is named by its meta record (hash -> seq): a damaged record
  // is reported under that name, the one its extents use, not under
  // whatever its damaged bytes say.
  std::unordered_map<uint64_t, ChunkHash> names;  // seq -> hash
  std::vector<std::pair<ChunkHash, ChunkMeta>> metas;
  {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->db()->NewIterator(rocksdb::ReadOptions(), db_->chunk_meta()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto hash = ChunkHash::FromBytes(it->key().ToStringView());
      auto meta = DecodeChunkMeta(it->value().ToStringView());
      if (!hash.ok() || !meta.ok()) {
        report.problems.push_back("malformed chunk meta record");
        continue;
      }
      names.emplace(meta->seq, *hash);
      metas.emplace_back(*hash, *meta);
    }
    if (!it->status().ok())
      report.problems.push_back("scanning chunk meta records: " + it->status().ToString());
  }

  // The dedup domain of each chunk, from the snapshots whose extents name
  // it: its name is re-hashed with that domain's key. A chunk no snapshot
  // names (garbage that gc has not collected yet, or a chunk of an import
  // still running) has a domain nobody can tell any more, perhaps of an
  // owner whose snapshots are all gone: only its checksum is checked (which
  // catches accidental damage as well), never reported for its name.
  GPUCKPT_ASSIGN_OR_RETURN(auto snapshots, List());
  std::vector<std::optional<ChunkDomainKey>> domain_keys;  // by slot
  std::map<std::optional<uint32_t>, uint32_t> slots;       // domain -> slot
  std::unordered_map<uint64_t, uint32_t> domain_of;        // seq -> slot
  // Further domains of a chunk named in more than one: only a damaged index
  // (or a SHA-256 collision) can do that; any of them makes its name good.
  std::unordered_map<uint64_t, std::vector<uint32_t>> more_domains;
  for (const auto& snap : snapshots) {
    auto [slot, added] = slots.try_emplace(snap.dedup_domain, domain_keys.size());
    if (added) domain_keys.push_back(db_->domain_key(snap.dedup_domain));
    const std::string lower = keys::SnapshotPrefix(snap.key);
    const std::string upper = keys::SnapshotPrefix(snap.key + 1);
    rocksdb::Slice upper_slice(upper);
    rocksdb::ReadOptions r;
    r.iterate_upper_bound = &upper_slice;
    r.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->db()->NewIterator(r, db_->extents()));
    for (it->Seek(lower); it->Valid(); it->Next()) {
      const auto key = it->key().ToStringView();
      if (key.size() != keys::kExtentKeySize) continue;  // reported by the walk below
      auto e = DecodeExtentRecord(keys::ExtentOffsetOf(key), it->value().ToStringView());
      if (!e.ok()) continue;  // likewise
      auto [found, first] = domain_of.try_emplace(e->seq, slot->second);
      if (!first && found->second != slot->second) {
        auto& more = more_domains[e->seq];
        if (std::find(more.begin(), more.end(), slot->second) == more.end()) {
          more.push_back(slot->second);
        }
      }
    }
    if (!it->status().ok()) {
      report.problems.push_back("snapshot '" + snap.id +
                                "': reading its extents: " + it->status().ToString());
    }
  }

  // Every chunk record: decodes, and its bytes hash to the name it carries.
  // Remember each good chunk's length by sequence number for the extents.
  // A damaged chunk is one line, however many extents name it; the files
  // that use it are named below, once each.
  std::unordered_map<uint64_t, std::pair<ChunkHash, uint64_t>> chunks;  // seq -> hash, length
  std::unordered_set<uint64_t> bad;
  {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->db()->NewIterator(rocksdb::ReadOptions(), db_->chunks()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ++report.chunks_checked;
      if (it->key().size() != 8) {
        report.problems.push_back("chunk key of " + std::to_string(it->key().size()) + " bytes");
        continue;
      }
      const uint64_t seq = keys::GetBigEndian(it->key().ToStringView(), 8);
      const std::string_view value = it->value().ToStringView();
      Status damage;
      auto record = chunk_store_->RecordOf(value);
      if (!record.ok()) {
        damage = record.status();
      } else {
        std::vector<const ChunkDomainKey*> domains;  // empty: named by no snapshot
        const auto add_domain = [&](uint32_t slot) {
          domains.push_back(domain_keys[slot] ? &*domain_keys[slot] : nullptr);
        };
        if (auto d = domain_of.find(seq); d != domain_of.end()) {
          add_domain(d->second);
          if (auto more = more_domains.find(seq); more != more_domains.end()) {
            for (uint32_t slot : more->second) add_domain(slot);
          }
        }
        auto checked = ChunkStore::Check(*record, seq, domains);
        if (checked.ok()) {
          chunks[seq] = *checked;
          continue;
        }
        damage = checked.status();
      }
      bad.insert(seq);
      ++report.damaged_chunks;
      auto name = names.find(seq);
      std::string where = "record " + std::to_string(seq);
      if (IsPackLocation(value)) {
        if (auto l = DecodePackLocation(value); l.ok()) {
          char pack[32];
          std::snprintf(pack, sizeof(pack), "%016llx", static_cast<unsigned long long>(l->pack));
          where += ", " + std::to_string(l->length) + " bytes at offset " +
                   std::to_string(l->offset) + " of " + format::kPacksDirName + "/" + pack +
                   ".pack";
        }
      } else {
        where += ", kept in the chunks family (version 1)";
      }
      report.problems.push_back(
          "damaged chunk " + (name != names.end() ? name->second.Hex() : std::string("(unnamed)")) +
          " (" + where + "): " + damage.message());
    }
    if (!it->status().ok())
      report.problems.push_back("scanning chunks: " + it->status().ToString());
  }
  {
    // Meta records: each names an existing chunk with its length; every
    // chunk has one. A meta record without its chunk would make imports
    // skip data they need.
    std::unordered_set<uint64_t> with_meta;
    for (const auto& [hash, meta] : metas) {
      with_meta.insert(meta.seq);
      auto found = chunks.find(meta.seq);
      if (found == chunks.end()) {
        if (bad.count(meta.seq) == 0) {
          report.problems.push_back("chunk " + hash.Hex() + " has a meta record but no data");
        }
      } else if (found->second.first != hash || found->second.second != meta.raw_length) {
        report.problems.push_back("chunk " + hash.Hex() + ": meta record disagrees with its data");
      }
    }
    for (const auto& [seq, chunk] : chunks) {
      if (with_meta.count(seq) == 0) {
        report.problems.push_back("chunk " + chunk.first.Hex() + " has no meta record");
      }
    }
  }
  for (const auto& snap : snapshots) {
    ++report.snapshots_checked;
    auto files = ReadFileRecords(snap.key);
    if (!files.ok()) {
      report.problems.push_back("snapshot '" + snap.id + "': " + files.status().message());
      continue;
    }
    if (files->size() != snap.file_count) {
      report.problems.push_back("snapshot '" + snap.id + "' has " + std::to_string(files->size()) +
                                " file records, its manifest says " +
                                std::to_string(snap.file_count));
    }
    for (const auto& [index, entry] : *files) {
      if (entry.type != FileType::kRegular) continue;
      const std::string where = "snapshot '" + snap.id + "' file '" + entry.path + "'";
      const std::string lower = keys::FileKey(snap.key, index);
      const std::string upper = keys::FileKey(snap.key, index + 1);
      rocksdb::Slice upper_slice(upper);
      rocksdb::ReadOptions r;
      r.iterate_upper_bound = &upper_slice;
      std::unique_ptr<rocksdb::Iterator> it(db_->db()->NewIterator(r, db_->extents()));
      uint64_t expect = 0;
      bool broken = false;
      // What is wrong with the file's extents, counted: one line per file.
      uint64_t extents = 0, damaged = 0, missing = 0, disagreeing = 0;
      std::optional<uint64_t> first_bad;  // file offset
      std::unordered_set<uint64_t> damaged_distinct;
      for (it->Seek(lower); it->Valid() && !broken; it->Next()) {
        ++report.extents_checked;
        ++extents;
        const uint64_t offset = keys::ExtentOffsetOf(it->key().ToStringView());
        auto e = DecodeExtentRecord(offset, it->value().ToStringView());
        if (!e.ok()) {
          report.problems.push_back(where + ": " + e.status().message());
          broken = true;
          break;
        }
        if (e->offset != expect) {
          report.problems.push_back(where + ": extent at " + std::to_string(e->offset) +
                                    ", expected " + std::to_string(expect));
          broken = true;
          break;
        }
        auto found = chunks.find(e->seq);
        bool wrong = true;
        if (found == chunks.end()) {
          if (bad.count(e->seq) != 0) {
            ++damaged;
            damaged_distinct.insert(e->seq);
          } else {
            ++missing;
          }
        } else if (found->second.first != e->hash || found->second.second != e->length) {
          ++disagreeing;
        } else {
          wrong = false;
        }
        if (wrong && !first_bad) first_bad = offset;
        expect += e->length;
      }
      if (!it->status().ok()) {
        report.problems.push_back(where + ": reading its extents: " + it->status().ToString());
        broken = true;
      }
      if (damaged + missing + disagreeing > 0) {
        ++report.damaged_files;
        std::vector<std::string> what;
        const std::string of = " of its " + std::to_string(extents) + " chunks";
        if (damaged > 0) {
          what.push_back(std::to_string(damaged) + of + " damaged (" +
                         std::to_string(damaged_distinct.size()) + " distinct)");
        }
        if (missing > 0) what.push_back(std::to_string(missing) + of + " missing");
        if (disagreeing > 0) {
          what.push_back(std::to_string(disagreeing) + of + " not as its extents say");
        }
        std::string line = where + ": ";
        for (size_t i = 0; i < what.size(); ++i) line += (i ? "; " : "") + what[i];
        line += "; the first at offset " + std::to_string(*first_bad);
        report.problems.push_back(std::move(line));
      }
      if (!broken && expect != entry.size) {
        report.problems.push_back(where + ": extents cover " + std::to_string(expect) +
                                  " bytes, the file has " + std::to_string(entry.size));
      }
    }
  }
  return report;
}

Result<StoreStats> StoreImpl::Stats() {
  StoreStats stats;
  GPUCKPT_ASSIGN_OR_RETURN(auto snapshots, List());
  stats.snapshot_count = snapshots.size();
  for (const auto& s : snapshots) stats.logical_bytes += s.logical_bytes;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->db()->NewIterator(rocksdb::ReadOptions(), db_->chunk_meta()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    GPUCKPT_ASSIGN_OR_RETURN(ChunkMeta meta, DecodeChunkMeta(it->value().ToStringView()));
    ++stats.chunk_count;
    stats.unique_bytes += meta.raw_length;
    stats.stored_bytes += meta.stored_length;
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning chunk meta records"));
  stats.disk_bytes = DiskUsage(dir());
  return stats;
}

}  // namespace gpuckpt
