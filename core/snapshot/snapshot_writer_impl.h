// SnapshotWriterImpl: the pipeline behind SnapshotWriter.
//
// The calling thread reads and cuts chunks; a WorkQueue fingerprints each
// chunk, takes it from the base snapshot when the base held the same chunk
// (see SnapshotSpec::base; only a base of the same dedup domain), else
// names it in the snapshot's dedup domain and hands it to
// ChunkStore::Put (which stores it unless it is there), and
// writes the extents in per-worker batches (without RocksDB's WAL: Commit()
// flushes the memtables, which syncs their files, before the manifest goes
// in with a synced WAL write). Memory: chunks in flight are slices of
// shared read blocks (BlockPool, 4 MiB or two max chunks), so at most the
// staging memory (SnapshotWriterOptions) plus one block per file being read
// are held, plus one extent batch (about 1 MiB) per worker, whatever the
// size of the input.
#ifndef GPUCKPT_CORE_SNAPSHOT_SNAPSHOT_WRITER_IMPL_H_
#define GPUCKPT_CORE_SNAPSHOT_SNAPSHOT_WRITER_IMPL_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/base/block_pool.h"
#include "core/base/mutex.h"
#include "core/base/unique_fd.h"
#include "core/base/work_queue.h"
#include "core/snapshot/base_extents.h"
#include "core/snapshot/store_impl.h"
#include "core/store/chunker.h"
#include "gpuckpt/snapshot_writer.h"

namespace gpuckpt {

class SnapshotWriterImpl final : public SnapshotWriter {
 public:
  // `name` has been validated and reserved; `key` allocated. `gc_guard`:
  // the hold against gc for the writer's life (empty where the caller
  // already holds one for longer).
  SnapshotWriterImpl(StoreImpl* store, SnapshotSpec spec, uint64_t key, Chunker generic,
                     Chunker pages, const SnapshotWriterOptions& options, SharedMutexHold gc_guard);
  ~SnapshotWriterImpl() override;

  // Finds the spec's base snapshot, if it names one that exists in the same
  // dedup domain, decides whether to spool, and faults in the staging
  // memory asked for when it stages; called once, before the first
  // AddFile(). Errors are the store's (reading its index).
  Status LoadBase();

  Status AddFile(const FileEntry& meta, int fd) override;
  Status AddStream(const FileEntry& meta, const ReadFn& read) override;
  Status AddSparse(const FileEntry& meta, SparseSource* source) override;
  Status AddEntry(const FileEntry& meta) override;
  void SetExtraJson(std::string extra_json) override EXCLUDES(entries_mu_) {
    MutexLock lock(&entries_mu_);
    spec_.extra_json = std::move(extra_json);
  }
  void SetBackground(bool background) override {
    queue_->SetPriority(background ? WorkQueue::Priority::kBackground
                                   : WorkQueue::Priority::kNormal);
  }
  uint64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }
  void SetProgress(ProgressFn progress, uint64_t total) override {
    progress_ = std::move(progress);
    progress_total_ = total;
  }
  void SetCancel(std::function<bool()> cancelled) override { cancelled_ = std::move(cancelled); }
  Result<SnapshotInfo> Commit() override;

  // Settling (StoreImpl::Settle()): this writer, made for the published
  // snapshot whose key it was given, chunks that snapshot's spooled files
  // into extents of their own file numbers, instead of adding files. It
  // publishes nothing. `records`: the snapshot's file records.
  void PrepareToSettle(std::vector<std::pair<uint32_t, FileEntry>> records);
  // Chunks file `index` from its spool file `fd`; the bytes must be as
  // many as its record says.
  Status SettleFile(uint32_t index, int fd);
  // Waits for the workers and writes the extents (without the WAL: the
  // caller flushes); returns the records of the files settled, no longer
  // spooled, with their totals.
  Result<std::vector<std::pair<uint32_t, FileEntry>>> FinishSettling();

 private:
  struct Batch {
    StoreBatch batch;  // extents
  };
  struct FileTotals {
    uint64_t chunks = 0;
    uint64_t new_bytes = 0;
    uint64_t stored_bytes = 0;
    uint64_t new_chunks = 0;
    uint64_t base_chunks = 0;
  };

  // A file AddSparse() reads: its current read block, and how far it is
  // read and cut.
  struct StreamBlock {
    std::shared_ptr<uint8_t[]> data;
    size_t begin = 0;     // first byte of `data` not yet cut
    size_t end = 0;       // one past the last byte read into `data`
    uint64_t offset = 0;  // file offset of data[begin]
    bool eof = false;     // the bytes read end a run of data: cut them all
    // Where the bytes read so far end in the file.
    uint64_t read_to() const { return offset + (end - begin); }
  };
  // What one file being added holds while it is read.
  struct SparseFile {
    uint32_t index;
    const std::string& path;
    const Chunker& chunker;
    BaseExtents::Cursor* base;
    StreamBlock block;
    std::vector<FileHole> holes;
  };
  // A chunk cut from a block, for ProcessChunk().
  struct Piece {
    uint64_t file_offset;
    const uint8_t* data;
    size_t len;
    std::optional<Extent> base;
  };

  // The steps of AddSparse(): where the source's next run begins (the
  // data before it cut to its end, a hole recorded), then the run read
  // block by block: read into the block what it has room for (a fresh
  // block, with the uncut tail, when little is left), count it for
  // progress, cut the chunks it holds and hand them to the workers.
  // The data of file `index` (its record appended) from `source`: its
  // size and holes go into the record.
  Status ReadSource(uint32_t index, const std::string& path, SparseSource* source);
  // The record of a regular file about to be read, from the caller's
  // metadata; its new index.
  Result<uint32_t> AppendRegularFile(const FileEntry& meta);
  // AddFile() of a spooling writer: the bytes into a spool file.
  Status SpoolFile(const FileEntry& meta, int fd);
  // Commit()'s first step for a spooling writer: the spool files durable.
  Status SyncSpool() EXCLUDES(entries_mu_);
  Status StartRun(const SparseSource::Run& run, SparseFile* file);
  Status ReadRun(SparseSource* source, SparseFile* file);
  Result<size_t> ReadMore(SparseSource* source, const std::string& path, StreamBlock* block);
  void CountRead(uint64_t n);
  Status CheckCancelled() const;
  Status CutAndSubmit(uint32_t file_index, const Chunker& chunker, BaseExtents::Cursor* base,
                      StreamBlock* block);
  Status SubmitPieces(uint32_t file_index, std::vector<Piece> pieces, size_t bytes,
                      std::shared_ptr<uint8_t[]> block);
  static Status NoBlockFor(const std::string& path);

  // The steps of Commit(): the extents still in the workers' batches; the
  // manifest's fields from the spec; the per-file totals into the file
  // records (batched into `files`) and the manifest.
  Status WriteExtents();
  SnapshotInfo ManifestOfSpec() const;
  Status TotalUpFiles(SnapshotInfo* info, StoreBatch* files) EXCLUDES(entries_mu_, totals_mu_);

  // `base`: the base snapshot's extent at the same offset of the same file.
  Status ProcessChunk(unsigned worker, uint32_t file_index, uint64_t offset, const uint8_t* data,
                      size_t len, const std::optional<Extent>& base) EXCLUDES(totals_mu_);
  Status WriteBatch(Batch* b);
  Result<uint32_t> AppendEntry(FileEntry entry) EXCLUDES(entries_mu_);  // the new file index
  bool IsPageImage(const std::string& path) const;
  Status Fail(Status s) EXCLUDES(entries_mu_);
  Status failed() const EXCLUDES(entries_mu_) {
    MutexLock lock(&entries_mu_);
    return failed_;
  }

  StoreImpl* store_;
  SharedMutexHold gc_guard_;
  SnapshotSpec spec_;
  uint64_t key_;
  Chunker generic_;
  Chunker pages_;
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<BaseExtents> base_;  // null: no base
  // Keys chunk names in spec_.dedup_domain; nullopt: the shared domain.
  std::optional<ChunkDomainKey> domain_key_;

  // Read blocks, reused: a fresh block's pages fault and get cleared, which
  // costs more than the read itself. Blocks keep the pool's state alive.
  std::unique_ptr<BlockPool> blocks_;
  std::unique_ptr<WorkQueue> queue_;
  std::vector<std::unique_ptr<Batch>> batches_;  // one per worker, used only by it

  Mutex totals_mu_;
  std::vector<FileTotals> totals_ GUARDED_BY(totals_mu_);  // by file index

  // AddFile() may run on several threads at once (CRIU streams several
  // image files at a time); entries_mu_ guards what they share, and
  // spec_.extra_json (SetExtraJson()).
  mutable Mutex entries_mu_ ACQUIRED_BEFORE(totals_mu_);
  std::vector<FileEntry> entries_ GUARDED_BY(entries_mu_);  // by file index
  std::set<std::string> paths_ GUARDED_BY(entries_mu_);
  // Sticky: a writer that failed once cannot be committed.
  Status failed_ GUARDED_BY(entries_mu_);
  std::atomic<uint64_t> bytes_read_{0};
  ProgressFn progress_;
  uint64_t progress_total_ = 0;
  std::function<bool()> cancelled_;  // SetCancel(); empty: never
  std::atomic<uint64_t> progress_reported_{0};
  std::atomic<bool> committed_{false};
  bool HasSpooledFiles() const EXCLUDES(entries_mu_);
  // LoadBase()'s first step: base_, when the spec names a usable base.
  Status FindBase();

  // Whether AddFile() spools (SnapshotWriterOptions::spool, where the
  // store can: no publication listener); decided by LoadBase().
  bool spool_ = false;
  const SnapshotWriterOptions::Spool spool_mode_;
  const uint64_t prefault_bytes_;  // SnapshotWriterOptions::prefault_bytes
  // A spooling writer's base, which it names and its settling compares with.
  std::string spool_base_;
  // Held by a spooling writer until it commits or is abandoned.
  std::optional<StoreImpl::SettlePause> settle_pause_;
  // The spool files written, by file index; closed at commit.
  std::vector<std::pair<uint32_t, UniqueFd>> spool_files_ GUARDED_BY(entries_mu_);
  // Made by PrepareToSettle(): chunks spooled files of a published snapshot.
  bool settling_ = false;
  std::vector<uint32_t> settled_ GUARDED_BY(entries_mu_);  // file indices settled
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_SNAPSHOT_WRITER_IMPL_H_
