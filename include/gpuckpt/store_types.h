// Plain value types of the store's public API: options for chunking, what a
// snapshot and a file look like from outside, and the reports of gc, fsck
// and stats. No behaviour; safe to copy between threads.
#ifndef GPUCKPT_STORE_TYPES_H_
#define GPUCKPT_STORE_TYPES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpuckpt {

class ByteBudget;  // gpuckpt/byte_budget.h

// Content-defined chunking (FastCDC with normalized chunking). Chunk
// boundaries decide what a repeated checkpoint costs: a boundary depends only
// on the 64 bytes before it, so an insertion or a change disturbs the chunks
// around it and the boundaries re-synchronise right after.
//
// CRIU's pages-*.img (and device memory images) are runs of 4 KiB pages
// whose position in the file moves by whole pages between checkpoints. For
// those files boundaries are only considered at page-aligned offsets: a
// changed page then costs the chunk that holds it (and at most the next),
// moved pages are found again at once, and the chunker hashes each page
// once instead of rolling over every byte.
struct ChunkSizes {
  uint32_t min_size;
  uint32_t avg_size;  // a power of two
  uint32_t max_size;
};

struct ChunkingOptions {
  // Sizes for files that are not page images. Defaults: 16/64/256 KiB.
  // Metadata files are small; for the rest, 64 KiB keeps the per-chunk
  // RocksDB cost (one lookup, one key) well below hashing cost.
  ChunkSizes generic{16u << 10, 64u << 10, 256u << 10};

  // Sizes for page images; all multiples of `page_size`. Defaults:
  // 4/16/64 KiB. Every page boundary is a candidate, judged on an XXH3 hash
  // of the page before it with one fixed probability (no minimum beyond one
  // page, no normalization), so a changed or inserted page costs the one or
  // two chunks it touches and never shifts the boundaries after it. The
  // average bounds what scattered changes add. Measured (tests/bench, and
  // two CRIU dumps of an idle 1 GiB process taken 3 s apart): with 32 KiB
  // chunks the second checkpoint added 2.4% (synthetic, 0.74% of pages
  // changed) and 2.9% (real, 0.12% changed) of its size; with 16 KiB, 1.5%
  // and 1.4%, under 1% beyond the changed pages, for 64K chunks per GiB.
  ChunkSizes pages{4u << 10, 16u << 10, 64u << 10};

  // Alignment of boundaries in page images. Default: 4096.
  uint32_t page_size = 4096;

  // File names (shell glob on the last path component) chunked as page
  // images. Default: CRIU's page images.
  std::vector<std::string> page_image_globs{"pages-*.img"};
};

// How a chunk read from disk is checked before its bytes are used. A chunk
// that fails is kCorruption, never returned.
enum class ReadVerification {
  // The XXH3-128 of the chunk's bytes, kept in its record since ingest
  // (tens of GB/s): catches accidental damage (a flipped bit, a torn or
  // misplaced write) with probability 1 - 2^-128, like SHA-256 does.
  kChecksum,
  // Also re-hash with SHA-256 and compare with the chunk's name (about
  // 1.8 GB/s per core). What it adds, resistance to deliberate forgery,
  // does not protect against anyone able to write the store (they can
  // rewrite names and extents as well), and it halves read throughput.
  kFullHash,
  // Trust the disk (RocksDB still checks its own CRC of the record).
  kNone,
};

// Called now and then during long operations with bytes done and bytes
// expected (0 when unknown). Called from the operation's own thread.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

struct SnapshotSpec {
  // The snapshot's id: 1-128 characters of [A-Za-z0-9._-], not starting
  // with '.' or '-'. Empty: the store picks the next free number.
  std::string name;
  // Where the data came from, recorded in the manifest (e.g. the source
  // directory or "pid 4242").
  std::string source;
  // A JSON object merged into manifest.json under "extra" (the engine puts
  // pid, command, GPUs there). Empty means none.
  std::string extra_json;
  // A snapshot this one probably resembles, such as the previous checkpoint
  // of the same process. A chunk with the same length and fingerprint (a
  // keyed XXH3-128, twenty times cheaper than SHA-256;
  // core/store/chunk_fingerprint.h) as one of the base's, at the same path
  // and offset or anywhere else in the base, is taken from the base without
  // computing its name or looking it up: the cost of an unchanged chunk
  // drops to reading it once. Name only a base written for the same owner
  // as this snapshot. A base that does not exist (any more), or whose
  // dedup_domain is not this snapshot's, is no error: it is ignored, and
  // every chunk is then hashed. Empty: none.
  std::string base;
  // The dedup domain: the owner uid whose chunks this snapshot may share.
  // A chunk is named, and so found again, only within its domain (its name
  // is keyed with a secret of the store and the uid; FORMAT.md): the same
  // bytes stored in two domains are stored twice and are new for each, so
  // what a snapshot reports as new (new_bytes, its duration, the store's
  // size) never depends on what another owner stored. nullopt: the
  // store-wide shared domain, where any snapshot's chunks are shared with
  // any other's (plain SHA-256 names; every snapshot written before domains
  // existed is in it). Sharing across owners saves space where owners run
  // the same programs, but lets each learn whether the others' memory
  // holds given bytes. Default: nullopt.
  std::optional<uint32_t> dedup_domain;
};

// How one SnapshotWriter holds and schedules the bytes it is given.
struct SnapshotWriterOptions {
  // Staging memory: bytes read but not yet stored that the writer may hold.
  // While there is room, AddFile() reads its source as fast as the source
  // writes, and hashing, compression and the disk catch up behind it; when
  // it is full, AddFile() waits for room (a larger input still succeeds; its
  // source just waits). 0: StoreOptions::max_in_flight_bytes. Default: 0.
  uint64_t staging_bytes = 0;

  // A budget the staging memory is also drawn from, shared with other
  // writers (a daemon's checkpoints together stay within one bound).
  // nullptr: none. Default: nullptr.
  std::shared_ptr<ByteBudget> shared_staging;

  // Staging memory to map and fault in at BeginSnapshot(), before the
  // source starts (e.g. the expected size of the input; capped at the
  // staging memory): a fresh page costs a fault and a clear, which would
  // otherwise be paid while the source waits. 0: none. Default: 0.
  uint64_t prefault_bytes = 0;

  // Start with hashing, compression and writing in the background, on
  // otherwise idle CPU only, until SnapshotWriter::SetBackground(false);
  // see there. Default: false.
  bool background = false;

  // Make each file given to AddFile() durable raw first: its bytes go as
  // they come into a spool file on the store's disk (spliced from a pipe,
  // no copy through user memory; no staging memory, no hashing, no
  // compression), are synced before Commit() returns, and are chunked,
  // deduplicated and compressed afterwards by the store, on idle CPU,
  // without changing what any reader sees. For few cores, where hashing
  // and compression cannot keep pace with the disk. kUnlessBase spools
  // unless the spec's base is a snapshot of the same domain whose files
  // are all chunked: a snapshot that mostly repeats its base then writes
  // only what changed (prefault_bytes applies only then). A writer whose
  // base is still spooled settles the base first (at BeginSnapshot(), on
  // the caller's thread), unless it is kAlways. While a writer spools, the
  // store settles nothing. Ignored by
  // a store with a shared pool (what it publishes there must be chunked
  // first) and by AddStream()/AddSparse(). Default: kNever.
  enum class Spool { kNever, kAlways, kUnlessBase };
  Spool spool = Spool::kNever;
};

enum class FileType { kRegular, kDirectory, kSymlink };

// A range of a regular file that holds zeros and is stored as nothing (no
// chunk, no extent): what a sparse file's holes become in a snapshot.
struct FileHole {
  uint64_t offset = 0;
  uint64_t length = 0;  // > 0
  uint64_t end() const { return offset + length; }
  bool operator==(const FileHole&) const = default;
};
// The most holes one file record keeps. Each costs about 30 bytes of the
// record, which every listing of the snapshot reads: 4096 keep a record
// under 128 KiB. A source with more has its further holes stored as zeros
// (SnapshotWriter::SparseSource).
inline constexpr size_t kMaxFileHoles = 4096;

struct FileEntry {
  std::string path;  // relative, '/'-separated, no "." or ".." components
  FileType type = FileType::kRegular;
  uint32_t mode = 0;  // permission bits only (07777)
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t size = 0;  // logical bytes (regular files)
  int64_t mtime_ns = 0;
  std::string symlink_target;
  uint64_t chunk_count = 0;
  uint64_t new_bytes = 0;     // raw bytes of chunks this file added to the store
  uint64_t stored_bytes = 0;  // compressed bytes of those chunks
  // Regular files: the holes, in offset order, neither overlapping nor
  // touching, inside [0, size); the rest of the file is covered by extents.
  // Empty for a file without holes (and for every file of a store written
  // before holes were kept). Set by the writer; ignored when adding a file.
  std::vector<FileHole> holes;
  // Regular files: its bytes were made durable raw, in the store's spool,
  // and are still to be chunked (SnapshotWriterOptions::spool); it reads
  // the same either way. Set by the store; ignored when adding a file.
  bool spooled = false;
  // Its number among its snapshot's file records (set by Store::ListFiles):
  // Store::OpenListedFile() finds the file with it, without a scan.
  uint32_t index = 0;
};

struct SnapshotInfo {
  std::string id;
  uint64_t key = 0;  // internal number of the snapshot's index records
  int64_t created_ns = 0;
  std::string source;
  std::string extra_json;  // "{}" when none
  uint64_t file_count = 0;
  uint64_t logical_bytes = 0;  // sum of file sizes
  uint64_t chunk_count = 0;    // chunk references
  uint64_t new_chunks = 0;     // chunks this snapshot added to the store
  uint64_t new_bytes = 0;      // raw bytes of those chunks
  uint64_t stored_bytes = 0;   // what those chunks take in the store (compressed)
  std::string base;            // SnapshotSpec::base, if it was found
  uint64_t base_chunks = 0;    // chunks recognised as the base's, not hashed
  // SnapshotSpec::dedup_domain: nullopt for the shared domain.
  std::optional<uint32_t> dedup_domain;
  double duration_s = 0;
  // Of duration_s, the time Commit() took: the workers finishing what was
  // still staged, then `sync_s` to make everything durable (syncing the
  // packs, flushing the index) before publication.
  double commit_s = 0;
  double sync_s = 0;
  ChunkingOptions chunking;  // what it was cut with (informational)
  // The gpuckpt that wrote the snapshot, as its --version says ("gpuckpt
  // 0.1.0 (commit 9bb0662)"); "" for snapshots written before it was kept.
  std::string written_by;
  // With a shared pool (StoreOptions::pool): the snapshot's incarnation in
  // the pool's catalog when it is there (a random number given when it was
  // pushed, which tells it from a later snapshot of the same name), 0 while
  // it is in this store only.
  uint64_t pool_incarnation = 0;
  // Listed from the pool's catalog, and not yet fetched into this store:
  // its files are fetched when it is first read (Store::ListFiles() and
  // the readers), then it is a snapshot of this store like any other.
  bool pool_only = false;
};

// The shared pool's counters since the Store was opened (Store::pool_stats()).
struct PoolStats {
  std::string pool;         // the RADOS pool's name
  bool background = false;  // PoolOptions::background
  uint64_t pushes = 0;      // snapshots published in the pool
  uint64_t push_failures = 0;
  uint64_t pulls = 0;  // snapshots fetched from it
  uint64_t pull_failures = 0;
  uint64_t uploaded_chunks = 0;  // chunks the pool lacked, sent
  uint64_t uploaded_bytes = 0;   // their stored (compressed) size
  uint64_t reused_chunks = 0;    // chunks the pool had already
  uint64_t fetched_chunks = 0;   // chunks this store lacked, fetched
  uint64_t fetched_bytes = 0;    // their stored size
  uint64_t pending = 0;          // background: snapshots waiting to be pushed
  std::string last_error;        // the last push or pull that failed, "" if none
};

struct GcReport {
  uint64_t chunks_kept = 0;
  uint64_t chunks_deleted = 0;
  uint64_t bytes_deleted = 0;  // stored (compressed) bytes
  // Snapshots whose index records were deleted: never committed, or removed
  // while a reader still had one of their files open.
  uint64_t orphan_records_deleted = 0;
  uint64_t packs_removed = 0;    // pack files deleted (see core/store/chunk_packs.h)
  uint64_t packs_rewritten = 0;  // of those, packs whose live chunks were copied first
  uint64_t bytes_rewritten = 0;  // stored bytes of the live chunks copied
  // Disk space given back from packs that stay, by punching out the garbage
  // between their live chunks (done where copying them would not fit, and
  // for packs less than half garbage).
  uint64_t bytes_punched = 0;
  // The shared pool's collector (StoreOptions::pool), when the store has a
  // pool: whether it ran (false: another store's collector holds the
  // pool), the chunks it marked, whether it swept (a mark at least the
  // grace old), the chunks and the objects (packs, bodies, reservations)
  // it removed and their bytes, and when no sweep was due, in how many
  // seconds one is.
  bool pool_collected = false;
  uint64_t pool_marked_chunks = 0;
  bool pool_swept = false;
  uint64_t pool_swept_chunks = 0;
  uint64_t pool_swept_objects = 0;
  uint64_t pool_swept_bytes = 0;
  uint64_t pool_sweep_due_in_s = 0;
};

struct FsckReport {
  uint64_t chunks_checked = 0;
  uint64_t snapshots_checked = 0;
  uint64_t extents_checked = 0;
  // One line each; empty when clean. A damaged chunk is one line (its hash,
  // where its record lies, what is wrong) and each file that uses it one
  // more (snapshot, path, how many of its chunks are damaged), however many
  // times the chunk occurs.
  std::vector<std::string> problems;
  uint64_t damaged_chunks = 0;  // chunks whose record is unreadable or wrong
  uint64_t damaged_files = 0;   // files of snapshots that cannot be read back whole
  uint64_t spooled_files = 0;   // files still spooled, not yet chunked (checked for size only)
  bool clean() const { return problems.empty(); }
};

// The chunk cache's counters since the Store was opened.
struct CacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t capacity_bytes = 0;
};

struct StoreStats {
  uint64_t snapshot_count = 0;
  uint64_t logical_bytes = 0;  // sum over snapshots
  uint64_t chunk_count = 0;    // unique chunks in the store
  uint64_t unique_bytes = 0;   // raw bytes of those chunks
  uint64_t stored_bytes = 0;   // their compressed size
  uint64_t disk_bytes = 0;     // what the store directory takes on disk
  // Of disk_bytes, the reserve: space held back so that rm and gc work on
  // a full disk (0 while given up).
  uint64_t reserve_bytes = 0;
  // Bytes of spooled files not yet chunked (in disk_bytes, not in the
  // chunks' counts); 0 once everything is settled.
  uint64_t spooled_bytes = 0;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_STORE_TYPES_H_
