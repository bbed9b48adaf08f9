#include "core/snapshot/store_impl.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <unordered_set>
#include <vector>

#include "core/catalog/extent_index.h"
#include "core/catalog/records.h"
#include "core/snapshot/file_reader_impl.h"
#include "core/snapshot/snapshot_writer_impl.h"
#include "core/store/chunk_codec.h"
#include "core/store/format.h"

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

Result<std::unique_ptr<LocalStore>> LocalStore::Open(const std::string& dir,
                                                     const StoreOptions& options,
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
  GPUCKPT_ASSIGN_OR_RETURN(
      auto chunks,
      ChunkStore::Open(db.get(), cache.get(), options.verify_on_read, options.direct_reads));
  GPUCKPT_ASSIGN_OR_RETURN(auto spool, Spool::Open(db->dir(), db->file_ops(), !options.read_only));
  GPUCKPT_ASSIGN_OR_RETURN(auto catalog, SnapshotCatalog::Open(db.get()));
  auto store = std::make_unique<StoreImpl>(std::move(db), std::move(catalog), std::move(cache),
                                           std::move(chunks), std::move(spool), options);
  if (!options.read_only) GPUCKPT_RETURN_IF_ERROR(store->ResumeSettling());
  return std::unique_ptr<LocalStore>(std::move(store));
}

StoreImpl::StoreImpl(std::unique_ptr<StoreDb> db, std::unique_ptr<SnapshotCatalog> catalog,
                     std::unique_ptr<ChunkCache> cache, std::unique_ptr<ChunkStore> chunks,
                     std::unique_ptr<Spool> spool, const StoreOptions& options)
    : db_(std::move(db)),
      catalog_(std::move(catalog)),
      options_(options),
      cache_(std::move(cache)),
      chunk_store_(std::move(chunks)),
      spool_(std::move(spool)) {}

StoreImpl::~StoreImpl() {
  StopSettling();
  // The chunk store borrows the database: it goes first.
  chunk_store_.reset();
}

Result<uint64_t> StoreImpl::AllocateSnapshotKey() {
  // Held across the synced write below: the stored value must only grow,
  // and two allocations writing outside the lock could store the smaller
  // last, handing its successor out again after a crash. Only
  // BeginSnapshot() comes here, once per snapshot.
  MutexLock lock(&key_mu_);
  return catalog_->AllocateKey();
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
    ReleaseName(spec.name, NameFate::kAbandoned);
    return !generic.ok() ? generic.status() : pages.status();
  }
  auto writer = std::make_unique<SnapshotWriterImpl>(this, std::move(spec), key, *generic, *pages,
                                                     writer_options, LockAgainstGc());
  GPUCKPT_RETURN_IF_ERROR(writer->LoadBase());
  return std::unique_ptr<SnapshotWriter>(std::move(writer));
}

Status StoreImpl::ReserveUnusedName(const std::string& name) {
  GPUCKPT_RETURN_IF_ERROR(ReserveLocalName(name));
  if (listener_ == nullptr) return Status::Ok();
  Status elsewhere = listener_->ReserveName(name);
  if (!elsewhere.ok()) ReleaseLocalName(name);
  return elsewhere;
}

Status StoreImpl::ReserveLocalName(const std::string& name) {
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
  Result<bool> exists = catalog_->HasSnapshot(name);
  if (exists.ok() && !*exists) return Status::Ok();
  ReleaseLocalName(name);
  if (exists.ok()) return Status::AlreadyExists("snapshot '" + name + "' already exists");
  return exists.status();
}

void StoreImpl::ReleaseName(const std::string& name, NameFate fate) {
  ReleaseLocalName(name);
  // Outside names_mu_: the listener may go far to give it up.
  if (fate == NameFate::kAbandoned && listener_ != nullptr) listener_->AbandonName(name);
}

void StoreImpl::ReleaseLocalName(const std::string& name) {
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
  GPUCKPT_ASSIGN_OR_RETURN(const bool exists, catalog_->HasSnapshot(info.id));
  if (exists) return Status::AlreadyExists("snapshot '" + info.id + "' already exists");
  return catalog_->PutSnapshot(info, options_.sync, "publishing snapshot '" + info.id + "'");
}

Result<SnapshotInfo> StoreImpl::LocalGet(const std::string& id) {
  if (!ValidateSnapshotName(id).ok()) {
    return Status::NotFound("no snapshot '" + id + "' (not a valid snapshot id)");
  }
  GPUCKPT_ASSIGN_OR_RETURN(std::optional<SnapshotInfo> info,
                           catalog_->FindSnapshot(id, "reading snapshot '" + id + "'"));
  if (!info) return Status::NotFound("no snapshot '" + id + "' in store " + dir());
  return std::move(*info);
}

Result<std::vector<SnapshotInfo>> StoreImpl::List() { return LocalList(); }

Result<SnapshotInfo> StoreImpl::Get(const std::string& id) { return LocalGet(id); }

Result<std::vector<FileEntry>> StoreImpl::ListFiles(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, LocalGet(id));
  GPUCKPT_ASSIGN_OR_RETURN(auto records, catalog_->ReadFiles(info.key));
  std::vector<FileEntry> out;
  out.reserve(records.size());
  for (auto& [index, e] : records) out.push_back(std::move(e));
  std::sort(out.begin(), out.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.path < b.path; });
  return out;
}

Result<std::pair<SnapshotInfo, SnapshotPin>> StoreImpl::PinSnapshot(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo seen, LocalGet(id));
  {
    MutexLock lock(&pins_->mu);
    pins_->keys.insert(seen.key);
  }
  SnapshotPin pin(pins_, seen.key);
  // Looked up again now that the pin is in: a Remove() that missed the pin
  // has deleted the record by now (it holds pins_->mu until its write is
  // done), and a Gc() that missed it listed the snapshots before, while
  // this one was still there (it lists them before it reads the pins).
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, LocalGet(id));
  if (info.key != seen.key) {
    return Status::NotFound("snapshot '" + id + "' was removed while it was opened");
  }
  return std::make_pair(std::move(info), std::move(pin));
}

Result<std::unique_ptr<FileReader>> StoreImpl::OpenFile(const std::string& id,
                                                        const std::string& path) {
  GPUCKPT_ASSIGN_OR_RETURN(auto pinned, PinSnapshot(id));
  const SnapshotInfo& info = pinned.first;
  GPUCKPT_ASSIGN_OR_RETURN(auto records, catalog_->ReadFiles(info.key));
  for (auto& [index, e] : records) {
    if (e.path != path) continue;
    if (e.type != FileType::kRegular) {
      return Status::InvalidArgument("'" + path + "' in snapshot '" + id +
                                     "' is not a regular file");
    }
    return MakeReader(std::move(pinned.second), info, index, std::move(e));
  }
  return Status::NotFound("no file '" + path + "' in snapshot '" + id + "'");
}

SnapshotPin StoreImpl::PinAgain(uint64_t key) {
  MutexLock lock(&pins_->mu);
  pins_->keys.insert(key);
  return SnapshotPin(pins_, key);
}

Result<std::unique_ptr<FileReader>> StoreImpl::MakeReader(SnapshotPin pin, const SnapshotInfo& info,
                                                          uint32_t index, FileEntry entry) {
  UniqueFd spool_file;
  if (entry.spooled) {
    Result<UniqueFd> opened = spool_->OpenForReading(info.key, index);
    if (opened.ok()) {
      spool_file = std::move(*opened);
    } else if (opened.status().code() == StatusCode::kNotFound) {
      // Settled since the record was read: its extents are durable now.
      GPUCKPT_ASSIGN_OR_RETURN(
          std::optional<FileEntry> settled,
          catalog_->FindFile(info.key, index, "reading a file record of '" + info.id + "'"));
      if (!settled || settled->spooled || settled->path != entry.path) {
        return Status::Corruption("snapshot '" + info.id + "' file '" + entry.path +
                                  "': its spool file is missing");
      }
      settled->index = entry.index;
      entry = std::move(*settled);
    } else {
      return opened.status();
    }
  }
  return std::unique_ptr<FileReader>(new FileReaderImpl(this, std::move(pin), info.id, info.key,
                                                        db_->domain_key(info.dedup_domain), index,
                                                        std::move(entry), std::move(spool_file)));
}

Result<std::unique_ptr<FileReader>> StoreImpl::OpenListedFile(const std::string& id, uint64_t key,
                                                              const FileEntry& entry) {
  GPUCKPT_ASSIGN_OR_RETURN(auto pinned, PinSnapshot(id));
  const SnapshotInfo& info = pinned.first;
  if (info.key != key)
    return Status::NotFound("snapshot '" + id + "' was removed since it was listed");
  GPUCKPT_ASSIGN_OR_RETURN(
      std::optional<FileEntry> found,
      catalog_->FindFile(key, entry.index, "reading a file record of '" + id + "'"));
  if (!found) return Status::NotFound("no file '" + entry.path + "' in snapshot '" + id + "'");
  FileEntry e = std::move(*found);
  // The record the listing named, or the listing is not of this snapshot.
  if (e.path != entry.path)
    return Status::NotFound("no file '" + entry.path + "' in snapshot '" + id + "'");
  if (e.type != FileType::kRegular)
    return Status::InvalidArgument("'" + entry.path + "' in snapshot '" + id +
                                   "' is not a regular file");
  e.index = entry.index;
  return MakeReader(std::move(pinned.second), info, entry.index, std::move(e));
}

Status StoreImpl::Remove(const std::string& id) {
  return Reclaiming(db_.get(), [&] { return RemoveOnce(id); });
}

Status StoreImpl::RecordPoolIncarnation(const std::string& id, uint64_t key, uint64_t incarnation) {
  // Under the lock Remove() holds across its write: the record is either
  // still the one pushed (and rewritten here) or gone (and stays gone).
  MutexLock lock(&pins_->mu);
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, LocalGet(id));
  if (info.key != key) return Status::NotFound("snapshot '" + id + "' was replaced");
  info.pool_incarnation = incarnation;
  return catalog_->PutSnapshot(info, options_.sync,
                               "recording that snapshot '" + id + "' is in the pool");
}

Status StoreImpl::RemoveOnce(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, LocalGet(id));
  StoreBatch batch;
  Status s = catalog_->DeleteSnapshot(&batch, id);
  // Held until the write is done, so that a reader pins either before (and
  // keeps the records) or after (and finds the snapshot gone). A lock across
  // a synced write, then, but only PinSnapshot(), a pin's release and Gc()
  // take it, and an open of a file waits at most for one rm.
  MutexLock pins_lock(&pins_->mu);
  if (pins_->keys.count(info.key) == 0) {
    // Nobody reads it: its index goes in the same atomic batch. Otherwise
    // the records stay for the readers, and the first Gc() after them
    // sweeps them.
    if (s.ok()) s = catalog_->DeleteRecordsOf(&batch, info.key);
  }
  if (!s.ok()) return s;
  return catalog_->Write(&batch, options_.sync, "removing snapshot '" + id + "'");
}

Result<GcReport> StoreImpl::Gc() {
  WriterMutexLock gc_lock(&gc_mu_);  // no writer runs while we sweep
  return Reclaiming(db_.get(), [&] {
    gc_mu_.AssertHeld();  // run by Reclaiming() within gc_lock's scope
    return GcLocked();
  });
}

// The steps of GcLocked().
namespace {

// The keys of the snapshots gc keeps: those listed, and those open readers
// still read (removed meanwhile, but pinned).
std::unordered_set<uint64_t> LiveOrPinnedKeys(const std::vector<SnapshotInfo>& snapshots,
                                              PinRegistry* pins) {
  std::unordered_set<uint64_t> live_keys;
  for (const auto& s : snapshots) live_keys.insert(s.key);
  MutexLock lock(&pins->mu);
  live_keys.insert(pins->keys.begin(), pins->keys.end());
  return live_keys;
}

struct GcMarks {
  std::unordered_set<uint64_t> chunks;  // sequence numbers of the chunks to keep
  std::vector<uint64_t> orphan_keys;    // snapshot keys whose records go
};

// Mark: every chunk named by an extent of a live or pinned snapshot.
// Extents of other keys belong to writers that never committed, or to
// snapshots removed while a reader had them pinned: their keys are orphans.
Result<GcMarks> MarkLiveChunks(const SnapshotCatalog& catalog,
                               const std::unordered_set<uint64_t>& live_keys) {
  GcMarks marks;
  ExtentIndex extents(catalog, ExtentIndex::Scope::Store());
  extents.SeekToFirst();
  while (extents.Valid()) {
    GPUCKPT_ASSIGN_OR_RETURN(const ExtentKeyParts key, extents.Key());
    if (live_keys.count(key.snapshot_key) == 0) {
      if (marks.orphan_keys.empty() || marks.orphan_keys.back() != key.snapshot_key) {
        marks.orphan_keys.push_back(key.snapshot_key);
      }
      // Skip the rest of this orphan at once.
      extents.SeekPastSnapshot(key.snapshot_key);
      continue;
    }
    GPUCKPT_ASSIGN_OR_RETURN(const Extent e, extents.Decode());
    marks.chunks.insert(e.seq);
    extents.Next();
  }
  GPUCKPT_RETURN_IF_ERROR(extents.status("scanning extents"));
  return marks;
}

// Orphans that have file records but no extents (a snapshot of directories
// and empty files only, say).
Status AddOrphansOfFileRecords(const SnapshotCatalog& catalog,
                               const std::unordered_set<uint64_t>& live_keys,
                               std::vector<uint64_t>* orphan_keys) {
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<uint64_t> with_files, catalog.KeysWithFiles());
  for (uint64_t snap : with_files) {
    if (live_keys.count(snap) == 0 &&
        std::find(orphan_keys->begin(), orphan_keys->end(), snap) == orphan_keys->end()) {
      orphan_keys->push_back(snap);
    }
  }
  return Status::Ok();
}

Status BatchOrphanRemoval(const SnapshotCatalog& catalog, const std::vector<uint64_t>& orphan_keys,
                          StoreBatch* batch, GcReport* report) {
  for (uint64_t k : orphan_keys) {
    GPUCKPT_RETURN_IF_ERROR(catalog.DeleteRecordsOf(batch, k));
    ++report->orphan_records_deleted;
  }
  return Status::Ok();
}

Status RemoveGarbageFromPacks(ChunkStore* chunks, GcReport* report) {
  GPUCKPT_ASSIGN_OR_RETURN(auto packs, chunks->CompactPacks());
  report->packs_removed = packs.packs_removed;
  report->packs_rewritten = packs.packs_rewritten;
  report->bytes_rewritten = packs.bytes_rewritten;
  report->bytes_punched = packs.bytes_punched;
  return Status::Ok();
}

}  // namespace

Result<GcReport> StoreImpl::GcLocked() {
  GcReport report;
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<SnapshotInfo> snapshots, LocalList());
  // Read after the list: see PinSnapshot().
  const std::unordered_set<uint64_t> live_keys = LiveOrPinnedKeys(snapshots, pins_.get());
  GPUCKPT_ASSIGN_OR_RETURN(GcMarks marks, MarkLiveChunks(*catalog_, live_keys));
  GPUCKPT_RETURN_IF_ERROR(AddOrphansOfFileRecords(*catalog_, live_keys, &marks.orphan_keys));

  // The orphans' records and the unmarked chunks go in one batch, written
  // at once (the sweep writes it early where it grows past a few MiB).
  StoreBatch batch;
  GPUCKPT_RETURN_IF_ERROR(BatchOrphanRemoval(*catalog_, marks.orphan_keys, &batch, &report));
  ChunkStore::SweepCounts swept;
  GPUCKPT_RETURN_IF_ERROR(chunk_store_->SweepUnmarked(marks.chunks, &batch, &swept));
  report.chunks_kept += swept.kept;
  report.chunks_deleted += swept.deleted;
  report.bytes_deleted += swept.bytes_deleted;
  GPUCKPT_RETURN_IF_ERROR(db_->Write(
      &batch, options_.sync ? StoreDb::Durability::kSynced : StoreDb::Durability::kLogged,
      "deleting chunks"));
  // No writer runs now: a spool file of a key gone from the listing is a
  // removed snapshot's, or one that was never published.
  GPUCKPT_RETURN_IF_ERROR(RemoveOrphanSpoolFiles(live_keys));
  if (report.chunks_deleted > 0) GPUCKPT_RETURN_IF_ERROR(chunk_store_->CompactIndex());
  // Also when nothing was deleted now: packs left by a crash, or by a gc
  // that failed half-way, hold only garbage.
  GPUCKPT_RETURN_IF_ERROR(RemoveGarbageFromPacks(chunk_store_.get(), &report));
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

Result<uint64_t> StoreImpl::HeldBytes(const std::vector<std::string>& ids) {
  std::unordered_set<ChunkHash, ChunkHashHasher> seen;
  uint64_t held = 0;
  for (const std::string& id : ids) {
    auto info = Get(id);
    if (!info.ok() && info.status().code() == StatusCode::kNotFound) continue;
    if (!info.ok()) return info.status();
    // Spooled files hold their whole size on the disk until they settle.
    GPUCKPT_ASSIGN_OR_RETURN(auto records, catalog_->ReadFiles(info->key));
    for (const auto& [index, e] : records) {
      if (e.spooled) held += e.size;
    }
    ExtentIndex extents(*catalog_, ExtentIndex::Scope::Snapshot(info->key),
                        ExtentIndex::ReadOptions{.fill_cache = false});
    extents.SeekToFirst();
    for (; extents.Valid(); extents.Next()) {
      GPUCKPT_ASSIGN_OR_RETURN(const Extent e, extents.Decode());
      if (!seen.insert(e.hash).second) continue;
      GPUCKPT_ASSIGN_OR_RETURN(std::optional<ChunkMeta> meta, chunk_store_->Lookup(e.hash));
      if (meta) held += meta->stored_length;  // else collected meanwhile
    }
    GPUCKPT_RETURN_IF_ERROR(extents.status("scanning the extents of " + id));
  }
  return held;
}

Result<StoreStats> StoreImpl::Stats() {
  StoreStats stats;
  GPUCKPT_ASSIGN_OR_RETURN(auto snapshots, LocalList());
  stats.snapshot_count = snapshots.size();
  for (const auto& s : snapshots) stats.logical_bytes += s.logical_bytes;
  GPUCKPT_RETURN_IF_ERROR(chunk_store_->ForEachChunk(
      ChunkStore::Scan(), [&](const Result<ChunkHash>&, const Result<ChunkMeta>& meta) {
        if (!meta.ok()) return meta.status();
        ++stats.chunk_count;
        stats.unique_bytes += meta->raw_length;
        stats.stored_bytes += meta->stored_length;
        return Status::Ok();
      }));
  stats.disk_bytes = DiskUsage(dir());
  struct stat reserve {};
  if (lstat((dir() + "/" + format::kReserveFileName).c_str(), &reserve) == 0 &&
      S_ISREG(reserve.st_mode))
    stats.reserve_bytes = static_cast<uint64_t>(reserve.st_blocks) * 512;
  GPUCKPT_ASSIGN_OR_RETURN(stats.spooled_bytes, spool_->Bytes());
  return stats;
}

}  // namespace gpuckpt
