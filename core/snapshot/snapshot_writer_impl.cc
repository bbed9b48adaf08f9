#include "core/snapshot/snapshot_writer_impl.h"

#include <fnmatch.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/base/time_text.h"
#include "core/catalog/records.h"
#include "core/snapshot/fd_source.h"
#include "gpuckpt/version.h"

namespace gpuckpt {
namespace {

// Read blocks: large enough that syscalls don't show, small enough to keep
// the pipeline fed early; a multiple of 2 MiB (huge pages).
constexpr size_t kReadBlock = 4u << 20;
// A read asks for at least this much room; the uncut tail of a block goes
// to the next one when less is left.
constexpr size_t kMinRead = 1u << 20;
// Chunks handed to a worker at once.
constexpr size_t kTaskBytes = 1u << 20;
// A worker writes its batch when it holds this much.
constexpr size_t kBatchBytes = 1u << 20;

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

SnapshotWriterImpl::SnapshotWriterImpl(StoreImpl* store, SnapshotSpec spec, uint64_t key,
                                       Chunker generic, Chunker pages,
                                       const SnapshotWriterOptions& options,
                                       SharedMutexHold gc_guard)
    : store_(store),
      gc_guard_(std::move(gc_guard)),
      spec_(std::move(spec)),
      key_(key),
      generic_(generic),
      pages_(pages),
      start_(std::chrono::steady_clock::now()),
      domain_key_(store->db()->domain_key(spec_.dedup_domain)),
      spool_mode_(store->has_listener() ? SnapshotWriterOptions::Spool::kNever : options.spool),
      prefault_bytes_(std::min(options.prefault_bytes,
                               options.staging_bytes != 0 ? options.staging_bytes
                                                          : store->options().max_in_flight_bytes)) {
  const uint64_t staging =
      options.staging_bytes != 0 ? options.staging_bytes : store->options().max_in_flight_bytes;
  // One block size for both chunkers, so that files read at the same time
  // share the pool; room for a read after the uncut tail (< max chunk).
  const size_t block_size = std::max(
      kReadBlock,
      2 * static_cast<size_t>(std::max(pages_.max_size(), generic_.max_size())) + kMinRead);
  // Enough free blocks for the whole staging memory, plus the blocks being
  // filled by files read at once (CRIU writes a handful together).
  constexpr size_t kFilesAtOnce = 8;
  const size_t staged_blocks = static_cast<size_t>(staging / block_size) + 1;
  blocks_ = std::make_unique<BlockPool>(block_size, staged_blocks + kFilesAtOnce);
  queue_ =
      std::make_unique<WorkQueue>(store->options().worker_threads, staging, options.shared_staging);
  if (options.background) SetBackground(true);
  for (unsigned i = 0; i < queue_->threads(); ++i) batches_.push_back(std::make_unique<Batch>());
}

SnapshotWriterImpl::~SnapshotWriterImpl() {
  if (queue_) queue_->Finish().PermitUnchecked();
  if (committed_ || settling_) return;
  store_->ReleaseName(spec_.name, StoreImpl::NameFate::kAbandoned);
  // Records written under key_ by an uncommitted writer are invisible; Gc()
  // removes them. Its spool files go now (Gc() would find them too).
  MutexLock lock(&entries_mu_);
  for (const auto& [index, fd] : spool_files_)
    store_->spool().Remove(key_, index).PermitUnchecked();
}

Status SnapshotWriterImpl::LoadBase() {
  GPUCKPT_RETURN_IF_ERROR(FindBase());
  spool_ = spool_mode_ == SnapshotWriterOptions::Spool::kAlways ||
           (spool_mode_ == SnapshotWriterOptions::Spool::kUnlessBase && !base_);
  if (spool_) {
    // It compares nothing now: its files are chunked later, on the base
    // it names (StoreImpl::Settle()). Meanwhile nothing is settled.
    if (base_) spool_base_ = base_->id();
    base_.reset();
    settle_pause_.emplace(store_->PauseSettling());
  } else if (base_) {
    // With a base, most chunks are the base's, found by fingerprint (a
    // small fraction of a copy's cost) as fast as they come, if the
    // workers run beside the source rather than on idle CPU only: blocks
    // then go back to the pool at once, and few fresh ones, which the
    // source would wait for, are faulted in. (A settling writer stays on
    // idle CPU: nothing waits for it.)
    if (!settling_) SetBackground(false);
  } else if (prefault_bytes_ != 0) {
    // Without, the whole input may be staged: faulted in before the
    // source starts.
    blocks_->Prefault(static_cast<size_t>(prefault_bytes_ / blocks_->block_size()) + 1);
  }
  return Status::Ok();
}

Status SnapshotWriterImpl::FindBase() {
  if (spec_.base.empty()) return Status::Ok();
  // Under gc_guard_: whatever chunks the base names stay until this
  // snapshot, which will name them too, is published.
  if (!ValidateSnapshotName(spec_.base).ok()) return Status::Ok();  // no such snapshot
  // A base of another domain is ignored: its chunks' names are another
  // domain's, and taking them would share chunks across owners.
  GPUCKPT_ASSIGN_OR_RETURN(base_, BaseExtents::Load(store_, spec_.base, spec_.dedup_domain));
  // A base with spooled files has no extents for them yet: nothing to
  // compare with there. The base is settled first, here, on this thread,
  // so as to store only what changed. Spooling this snapshot too was
  // measured to freeze the tree several times longer (tests/bench/
  // README.md): its spool files then reach the disk beside what the
  // base's settling wrote. Only a kAlways writer spools. (Nothing is
  // settled when this writer is settling a snapshot itself: its base,
  // queued before it, is settled already, or could not be.)
  if (!base_ || !base_->spooled() || settling_) return Status::Ok();
  if (spool_mode_ == SnapshotWriterOptions::Spool::kAlways) {
    spool_base_ = base_->id();
    base_.reset();
    return Status::Ok();
  }
  base_.reset();
  GPUCKPT_RETURN_IF_ERROR(store_->SettleHoldingGcGuard(spec_.base));
  GPUCKPT_ASSIGN_OR_RETURN(base_, BaseExtents::Load(store_, spec_.base, spec_.dedup_domain));
  return Status::Ok();
}

Status SnapshotWriterImpl::Fail(Status s) {
  MutexLock lock(&entries_mu_);
  if (failed_.ok()) failed_ = s;
  return s;
}

bool SnapshotWriterImpl::IsPageImage(const std::string& path) const {
  const std::string base = BaseName(path);
  for (const auto& glob : store_->options().chunking.page_image_globs) {
    if (fnmatch(glob.c_str(), base.c_str(), 0) == 0) return true;
  }
  return false;
}

Result<uint32_t> SnapshotWriterImpl::AppendEntry(FileEntry entry) {
  if (Status s = CheckCancelled(); !s.ok()) return Fail(s);
  GPUCKPT_RETURN_IF_ERROR(ValidateEntryPath(entry.path));
  MutexLock entries_lock(&entries_mu_);
  if (!failed_.ok()) return failed_;
  if (!paths_.insert(entry.path).second) {
    return Status::InvalidArgument("path '" + entry.path + "' added twice to the snapshot");
  }
  if (entries_.size() >= UINT32_MAX) return Status::InvalidArgument("too many files in a snapshot");
  entry.mode &= 07777;
  entries_.push_back(std::move(entry));
  MutexLock lock(&totals_mu_);
  totals_.emplace_back();
  return static_cast<uint32_t>(entries_.size() - 1);
}

Status SnapshotWriterImpl::AddEntry(const FileEntry& meta) {
  if (committed_) return Status::InvalidArgument("snapshot already committed");
  if (meta.type == FileType::kRegular) {
    return Status::InvalidArgument("regular file '" + meta.path + "' needs its data: use AddFile");
  }
  FileEntry e = meta;
  e.size = 0;
  e.chunk_count = e.new_bytes = e.stored_bytes = 0;
  return AppendEntry(std::move(e)).status();
}

namespace {

// AddStream()'s source: one run of data, from 0 to where `read` ends.
class StreamSource final : public SnapshotWriter::SparseSource {
 public:
  explicit StreamSource(const SnapshotWriter::ReadFn& read) : read_(read) {}
  Result<Run> NextRun() override {
    const bool end = started_;
    started_ = true;
    return Run{given_, end};
  }
  Result<size_t> Read(char* buf, size_t len) override {
    GPUCKPT_ASSIGN_OR_RETURN(const size_t n, read_(buf, len));
    given_ += std::min(n, len);
    return n;
  }

 private:
  const SnapshotWriter::ReadFn& read_;
  uint64_t given_ = 0;
  bool started_ = false;
};

}  // namespace

Status SnapshotWriterImpl::CheckCancelled() const {
  if (cancelled_ && cancelled_()) return Status::Cancelled("cancelled");
  return Status::Ok();
}

Status SnapshotWriterImpl::AddFile(const FileEntry& meta, int fd) {
  if (spool_) return SpoolFile(meta, fd);
  FdSource source(fd, meta.path);
  return AddSparse(meta, &source);
}

Result<uint32_t> SnapshotWriterImpl::AppendRegularFile(const FileEntry& meta) {
  if (committed_) return Status::InvalidArgument("snapshot already committed");
  // What the data read decides, never what the caller says.
  FileEntry e = meta;
  e.type = FileType::kRegular;
  e.size = 0;
  e.chunk_count = e.new_bytes = e.stored_bytes = 0;
  e.holes.clear();
  e.spooled = false;
  return AppendEntry(std::move(e));
}

Status SnapshotWriterImpl::SpoolFile(const FileEntry& meta, int fd) {
  GPUCKPT_ASSIGN_OR_RETURN(const uint32_t file_index, AppendRegularFile(meta));
  Result<UniqueFd> file = store_->spool().Create(key_, file_index);
  if (!file.ok()) return Fail(file.status());
  {
    // Listed before it is filled: an abandoned writer removes it.
    MutexLock lock(&entries_mu_);
    spool_files_.emplace_back(file_index, UniqueFd(dup(file->get())));
  }
  Result<uint64_t> moved = store_->spool().Receive(fd, file->get(), cancelled_);
  if (!moved.ok()) return Fail(moved.status().WithContext("'" + meta.path + "'"));
  CountRead(*moved);
  MutexLock lock(&entries_mu_);
  entries_[file_index].size = *moved;
  entries_[file_index].spooled = true;
  MutexLock totals_lock(&totals_mu_);
  totals_[file_index].new_bytes = *moved;
  totals_[file_index].stored_bytes = *moved;
  return Status::Ok();
}

Status SnapshotWriterImpl::SyncSpool() {
  MutexLock lock(&entries_mu_);
  if (spool_files_.empty()) return Status::Ok();
  for (const auto& [index, fd] : spool_files_) {
    if (fd.get() < 0) return Status::NoMemory("out of file descriptors for the spool");
    GPUCKPT_RETURN_IF_ERROR(store_->spool().Sync(fd.get()));
  }
  return store_->spool().SyncDirectory();
}

Status SnapshotWriterImpl::AddStream(const FileEntry& meta, const ReadFn& read) {
  StreamSource source(read);
  return AddSparse(meta, &source);
}

Status SnapshotWriterImpl::AddSparse(const FileEntry& meta, SparseSource* source) {
  GPUCKPT_ASSIGN_OR_RETURN(const uint32_t file_index, AppendRegularFile(meta));
  return ReadSource(file_index, meta.path, source);
}

Status SnapshotWriterImpl::ReadSource(uint32_t file_index, const std::string& path,
                                      SparseSource* source) {
  std::unique_ptr<BaseExtents::Cursor> base = base_ ? base_->Open(path) : nullptr;
  SparseFile file{file_index, path, IsPageImage(path) ? pages_ : generic_, base.get(), {}, {}};

  // Data is read into shared blocks and handed to the workers as slices of
  // them, so a byte is copied once (by read()) on its way to the hash. The
  // uncut tail of a block (less than one max-size chunk) is carried into the
  // next block.
  file.block.data = blocks_->Get();
  if (!file.block.data) return Fail(NoBlockFor(path));
  for (;;) {
    Result<SparseSource::Run> run = source->NextRun();
    if (!run.ok()) return Fail(run.status());
    if (Status s = StartRun(*run, &file); !s.ok()) return Fail(s);
    if (run->end) break;
    if (Status s = ReadRun(source, &file); !s.ok()) return Fail(s);
  }
  MutexLock lock(&entries_mu_);
  entries_[file_index].size = file.block.offset;
  entries_[file_index].holes = std::move(file.holes);
  return Status::Ok();
}

Status SnapshotWriterImpl::StartRun(const SparseSource::Run& run, SparseFile* file) {
  StreamBlock& block = file->block;
  const uint64_t at = block.read_to();
  if (run.offset < at) {
    return Status::InvalidArgument("the data of '" + file->path + "' went back to offset " +
                                   std::to_string(run.offset) + " after " + std::to_string(at));
  }
  if (run.offset == at && !run.end) return Status::Ok();  // the data goes on
  // The data read so far ends here: its last chunks are cut. (Extents
  // follow each other but across a recorded hole.)
  block.eof = true;
  GPUCKPT_RETURN_IF_ERROR(CutAndSubmit(file->index, file->chunker, file->base, &block));
  block.eof = false;
  if (run.offset == at) return Status::Ok();
  const uint64_t gap = run.offset - at;
  if (!file->holes.empty() && file->holes.back().end() == at) {
    file->holes.back().length += gap;  // an empty run between two holes
  } else if (file->holes.size() == kMaxFileHoles) {
    return Status::InvalidArgument("'" + file->path + "' has more than " +
                                   std::to_string(kMaxFileHoles) + " holes");
  } else {
    file->holes.push_back(FileHole{at, gap});
  }
  block.offset = run.offset;
  CountRead(gap);
  return Status::Ok();
}

Status SnapshotWriterImpl::ReadRun(SparseSource* source, SparseFile* file) {
  for (;;) {
    GPUCKPT_RETURN_IF_ERROR(CheckCancelled());
    GPUCKPT_ASSIGN_OR_RETURN(const size_t n, ReadMore(source, file->path, &file->block));
    if (n == 0) return Status::Ok();
    GPUCKPT_RETURN_IF_ERROR(CutAndSubmit(file->index, file->chunker, file->base, &file->block));
  }
}

Status SnapshotWriterImpl::NoBlockFor(const std::string& path) {
  return Status::IOError("out of memory for a read block of '" + path + "'");
}

Result<size_t> SnapshotWriterImpl::ReadMore(SparseSource* source, const std::string& path,
                                            StreamBlock* block) {
  const size_t block_size = blocks_->block_size();
  if (block_size - block->end < kMinRead) {
    std::shared_ptr<uint8_t[]> next = blocks_->Get();
    if (!next) return NoBlockFor(path);
    std::memcpy(next.get(), block->data.get() + block->begin, block->end - block->begin);
    block->end -= block->begin;
    block->begin = 0;
    block->data = std::move(next);
  }
  GPUCKPT_ASSIGN_OR_RETURN(const size_t got,
                           source->Read(reinterpret_cast<char*>(block->data.get()) + block->end,
                                        block_size - block->end));
  const size_t n = std::min(got, block_size - block->end);
  block->end += n;
  CountRead(n);
  return n;
}

void SnapshotWriterImpl::CountRead(uint64_t n) {
  const uint64_t total_read = bytes_read_.fetch_add(n) + n;
  uint64_t reported = progress_reported_.load(std::memory_order_relaxed);
  if (progress_ && total_read - reported >= (64u << 20) &&
      progress_reported_.compare_exchange_strong(reported, total_read)) {
    progress_(total_read, progress_total_);
  }
}

Status SnapshotWriterImpl::CutAndSubmit(uint32_t file_index, const Chunker& chunker,
                                        BaseExtents::Cursor* base, StreamBlock* block) {
  // Chunks go to the workers in groups of about kTaskBytes: one task per
  // 16 KiB chunk would cost a thread wake-up per chunk.
  std::vector<Piece> group;
  size_t group_bytes = 0;
  while (block->begin < block->end) {
    const uint8_t* const data = block->data.get() + block->begin;
    const size_t len =
        chunker.NextChunkLength(data, block->end - block->begin, block->offset, block->eof);
    if (len == 0) break;
    std::optional<Extent> base_extent;
    if (base) {
      GPUCKPT_ASSIGN_OR_RETURN(base_extent, base->At(block->offset));
    }
    group.push_back(Piece{block->offset, data, len, std::move(base_extent)});
    group_bytes += len;
    block->begin += len;
    block->offset += len;
    if (group_bytes >= kTaskBytes) {
      GPUCKPT_RETURN_IF_ERROR(SubmitPieces(file_index, std::move(group), group_bytes, block->data));
      group = {};
      group_bytes = 0;
    }
  }
  // The rest of this block's chunks, before the block may be replaced.
  return SubmitPieces(file_index, std::move(group), group_bytes, block->data);
}

Status SnapshotWriterImpl::SubmitPieces(uint32_t file_index, std::vector<Piece> pieces,
                                        size_t bytes, std::shared_ptr<uint8_t[]> block) {
  if (pieces.empty()) return Status::Ok();
  // The task holds the block its pieces point into.
  return queue_->Submit(bytes,
                        [this, file_index, pieces = std::move(pieces),
                         block = std::move(block)](unsigned worker) -> Status {
                          for (const Piece& p : pieces) {
                            GPUCKPT_RETURN_IF_ERROR(ProcessChunk(worker, file_index, p.file_offset,
                                                                 p.data, p.len, p.base));
                          }
                          return Status::Ok();
                        });
}

Status SnapshotWriterImpl::ProcessChunk(unsigned worker, uint32_t file_index, uint64_t offset,
                                        const uint8_t* data, size_t len,
                                        const std::optional<Extent>& base) {
  const ChunkFingerprint fingerprint = store_->db()->fingerprint_key().Of(data, len);
  // The base's chunk at the same place, else anywhere in the base.
  std::optional<Extent> same;
  if (base && base->length == len && base->fingerprint == fingerprint) {
    same = base;
  } else if (base_) {
    GPUCKPT_ASSIGN_OR_RETURN(same, base_->Find(fingerprint, len));
  }
  const bool from_base = same.has_value();
  ChunkHash hash;
  ChunkStore::PutResult put;
  if (from_base) {
    // The base's chunk, which gc_guard_ keeps in the store.
    hash = same->hash;
    put.seq = same->seq;
  } else {
    hash = HashChunk(data, len, domain_key_ ? &*domain_key_ : nullptr);
    GPUCKPT_ASSIGN_OR_RETURN(put,
                             store_->chunks().Put(hash, data, len, store_->options().zstd_level));
  }
  Batch* b = batches_[worker].get();
  GPUCKPT_RETURN_IF_ERROR(store_->catalog().AddExtent(
      &b->batch, key_, file_index, offset, EncodeExtentRecord(hash, put.seq, len, fingerprint)));
  {
    MutexLock lock(&totals_mu_);
    FileTotals& t = totals_[file_index];
    ++t.chunks;
    if (from_base) ++t.base_chunks;
    if (put.added) {
      ++t.new_chunks;
      t.new_bytes += len;
      t.stored_bytes += put.stored_bytes;
    }
  }
  if (b->batch.bytes() >= kBatchBytes) return WriteBatch(b);
  return Status::Ok();
}

Status SnapshotWriterImpl::WriteBatch(Batch* b) {
  // Without the WAL: Commit() makes the index durable before publishing.
  return store_->catalog().WriteIndex(&b->batch,
                                      "writing the index of snapshot '" + spec_.name + "'");
}

Result<SnapshotInfo> SnapshotWriterImpl::Commit() {
  if (Status f = failed(); !f.ok()) return f;
  if (committed_) return Status::InvalidArgument("snapshot already committed");
  if (Status s = CheckCancelled(); !s.ok()) return Fail(s);
  const auto commit_start = std::chrono::steady_clock::now();
  if (Status s = WriteExtents(); !s.ok()) return Fail(s);
  // Before anything names them: the spooled bytes durable.
  const auto spool_sync_start = std::chrono::steady_clock::now();
  if (Status s = SyncSpool(); !s.ok()) return Fail(s);
  SnapshotInfo info = ManifestOfSpec();
  StoreBatch files;
  if (Status s = TotalUpFiles(&info, &files); !s.ok()) return Fail(s);
  if (Status s = store_->catalog().WriteIndex(&files, "writing file records"); !s.ok())
    return Fail(s);
  // Everything the manifest will name must be on disk before it is.
  const auto sync_start = spool_ ? spool_sync_start : std::chrono::steady_clock::now();
  if (Status s = store_->catalog().MakeIndexDurable(); !s.ok()) return Fail(s);

  info.created_ns = UnixNowNs();
  const auto now = std::chrono::steady_clock::now();
  info.duration_s = std::chrono::duration<double>(now - start_).count();
  info.commit_s = std::chrono::duration<double>(now - commit_start).count();
  info.sync_s = std::chrono::duration<double>(now - sync_start).count();
  // Wherever the listener publishes it first (a shared pool, unless it is
  // fed in the background): a snapshot that could not be published there
  // is not published here.
  if (Status s = store_->BeforePublish(&info); !s.ok()) return Fail(s);
  if (Status s = store_->Publish(info); !s.ok()) return Fail(s);
  committed_ = true;
  store_->ReleaseName(spec_.name, StoreImpl::NameFate::kPublished);
  store_->AfterPublish(info);
  if (HasSpooledFiles()) store_->QueueSettle(info.id);
  settle_pause_.reset();
  return info;
}

Status SnapshotWriterImpl::WriteExtents() {
  GPUCKPT_RETURN_IF_ERROR(queue_->Finish());
  for (auto& b : batches_) GPUCKPT_RETURN_IF_ERROR(WriteBatch(b.get()));
  return Status::Ok();
}

SnapshotInfo SnapshotWriterImpl::ManifestOfSpec() const {
  SnapshotInfo info;
  info.id = spec_.name;
  info.key = key_;
  info.source = spec_.source;
  info.chunking = store_->options().chunking;
  if (base_) info.base = base_->id();
  if (!spool_base_.empty()) info.base = spool_base_;
  info.dedup_domain = spec_.dedup_domain;
  info.written_by = "gpuckpt " GPUCKPT_VERSION_STRING;
  return info;
}

Status SnapshotWriterImpl::TotalUpFiles(SnapshotInfo* info, StoreBatch* files) {
  // Nothing else runs now (Commit() comes after the last AddFile()), so
  // the locks are never waited for; taken all the same, for what the
  // workers wrote under them.
  MutexLock entries_lock(&entries_mu_);
  MutexLock totals_lock(&totals_mu_);
  info->extra_json = spec_.extra_json.empty() ? "{}" : spec_.extra_json;
  for (size_t i = 0; i < entries_.size(); ++i) {
    FileEntry& e = entries_[i];
    const FileTotals& t = totals_[i];
    e.chunk_count = t.chunks;
    e.new_bytes = t.new_bytes;
    e.stored_bytes = t.stored_bytes;
    info->logical_bytes += e.size;
    info->chunk_count += t.chunks;
    info->new_chunks += t.new_chunks;
    info->new_bytes += t.new_bytes;
    info->stored_bytes += t.stored_bytes;
    info->base_chunks += t.base_chunks;
    GPUCKPT_RETURN_IF_ERROR(
        store_->catalog().AddFile(files, key_, static_cast<uint32_t>(i), EncodeFileRecord(e)));
  }
  info->file_count = entries_.size();
  return Status::Ok();
}

bool SnapshotWriterImpl::HasSpooledFiles() const {
  MutexLock lock(&entries_mu_);
  return !spool_files_.empty();
}

void SnapshotWriterImpl::PrepareToSettle(std::vector<std::pair<uint32_t, FileEntry>> records) {
  settling_ = true;
  MutexLock lock(&entries_mu_);
  MutexLock totals_lock(&totals_mu_);
  for (auto& [index, e] : records) {
    if (entries_.size() <= index) {
      entries_.resize(static_cast<size_t>(index) + 1);
      totals_.resize(static_cast<size_t>(index) + 1);
    }
    entries_[index] = std::move(e);
  }
}

Status SnapshotWriterImpl::SettleFile(uint32_t index, int fd) {
  FileEntry e;
  {
    MutexLock lock(&entries_mu_);
    if (!settling_ || index >= entries_.size() || !entries_[index].spooled)
      return Status::Internal("file " + std::to_string(index) + " is not spooled");
    e = entries_[index];
  }
  FdSource source(fd, e.path);
  GPUCKPT_RETURN_IF_ERROR(ReadSource(index, e.path, &source));
  MutexLock lock(&entries_mu_);
  if (entries_[index].size != e.size) {
    return Status::Corruption("the spool file of '" + e.path + "' holds " +
                              std::to_string(entries_[index].size) + " bytes, not " +
                              std::to_string(e.size));
  }
  settled_.push_back(index);
  return Status::Ok();
}

Result<std::vector<std::pair<uint32_t, FileEntry>>> SnapshotWriterImpl::FinishSettling() {
  GPUCKPT_RETURN_IF_ERROR(WriteExtents());
  std::vector<std::pair<uint32_t, FileEntry>> records;
  MutexLock lock(&entries_mu_);
  MutexLock totals_lock(&totals_mu_);
  for (uint32_t index : settled_) {
    FileEntry e = entries_[index];
    const FileTotals& t = totals_[index];
    e.spooled = false;
    e.chunk_count = t.chunks;
    e.new_bytes = t.new_bytes;
    e.stored_bytes = t.stored_bytes;
    records.emplace_back(index, std::move(e));
  }
  return records;
}

}  // namespace gpuckpt
