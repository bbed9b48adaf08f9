// The gpuckpt store: every checkpoint (snapshot) as a manifest plus, per
// file, an extent index into a deduplicated, compressed chunk store kept in
// RocksDB. Start here; the formats are in core/store/FORMAT.md.
//
// A Store is opened on one directory by one process at a time (an flock()ed
// lock file; a second opener gets kBusy naming the holder's pid); any number
// of others may open it for reading beside it (StoreOptions::read_only).
// Within a process a Store is safe for concurrent use from any number of threads:
// readers, imports, deletions, garbage collection and fsck may overlap
// (collection waits for imports in flight and vice versa; see Gc()).
//
// Objects handed out by a Store (SnapshotWriter, FileReader) borrow it: the
// Store must outlive them.
#ifndef GPUCKPT_STORE_H_
#define GPUCKPT_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/file_reader.h"
#include "gpuckpt/snapshot_writer.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

// A shared RADOS pool (Ceph) behind a store: see Store and
// core/store/FORMAT.md, "The shared pool".
struct PoolOptions {
  // The RADOS pool's name; it must exist.
  std::string pool;
  // ceph.conf; empty: librados's default search (CEPH_CONF, /etc/ceph/).
  std::string ceph_conf;
  // The cephx user without "client."; empty: "admin".
  std::string ceph_id;
  // How long one pool operation may take before it fails with kTimedOut
  // (an unreachable cluster is an error after this, never a hang).
  // Default: 30 s.
  std::chrono::milliseconds op_timeout{30000};
  // false: Commit() returns once the snapshot is published in the pool (a
  // pool that cannot be reached fails the snapshot, and nothing of it is
  // visible). true: Commit() returns once it is durable here, and it is
  // pushed to the pool by a background thread, in order, retried while the
  // pool is unreachable (PoolStats::pending). Default: false.
  bool background = false;
  // Collection of the pool's garbage (Gc()): how long a chunk no snapshot
  // names stays marked before it is swept, and how old an object nothing
  // needs must be before it goes. Longer than any push takes; a push whose
  // lookups are older than half of it checks its chunks again before it
  // publishes. Clocks of the machines on a pool must agree to well within
  // it. Default: an hour.
  std::chrono::seconds gc_grace{3600};
};

struct StoreOptions {
  // Create the store directory (mode 0700: images hold process memory) when
  // it does not exist. Default: true.
  bool create_if_missing = true;

  // Open for reading only, beside the process that holds the store (a
  // running gpuckptfs) or while none does: no lock is taken and nothing in
  // the store directory is written (create_if_missing is ignored). The
  // Store shows the snapshots committed when it was opened; reads of their
  // chunks follow records the holder's gc moves meanwhile, and a chunk the
  // holder collected (its snapshots removed) reads as kAborted. Fsck()
  // counts what it finds only if it is still there once this view has
  // caught up with the holder's. BeginSnapshot(), ImportDirectory(),
  // Remove() and Gc() fail with kPermissionDenied. Open() first reads the
  // whole index against its checksums and fails with kCorruption, naming
  // what is damaged, rather than show a damaged store as an older or empty
  // one. Default: false.
  bool read_only = false;

  // How data is cut into chunks; see ChunkingOptions. Default: as there.
  ChunkingOptions chunking;

  // zstd level for new chunks. Negative levels are zstd's fast modes. A chunk
  // is stored raw when compression saves less than 1/32 of it, so
  // incompressible memory costs one failed attempt (zstd gives up on random
  // data at about 1.6 GB/s per core), not a slower read. Level 1 was chosen
  // on 16 KiB chunks of tests/bench's page mix: 1.90x at 680 MB/s per core,
  // against 1.81x at 840 MB/s for level -1; on text pages level 1 gives 6.1x
  // to level -1's 3.7x at nearly the same speed (405 vs 452 MB/s), and
  // level 3 gains under 1% for 20% more time. Default: 1.
  int zstd_level = 1;

  // Threads that hash and compress during an import. 0 means one per online
  // CPU. Default: 0.
  unsigned worker_threads = 0;

  // Threads that fetch, decompress and verify chunks during an export.
  // Reads of a cold store block on the disk, so more threads than cores
  // keep the disk busy: on the 2-core benchmark machine 8 threads read a
  // cold store 1.5x faster than 2. Default: 8.
  unsigned read_threads = 8;

  // Export: syncfs() the destination before renaming it into place, so a
  // power loss cannot leave a complete-looking tree with missing data.
  // Default: true.
  bool sync_export = true;

  // Upper bound on chunk bytes held in memory by one import or export
  // (read but not yet written), unless the writer is given its own
  // (SnapshotWriterOptions::staging_bytes). This, plus two read blocks (4 MiB + max
  // chunk size each) and RocksDB's write buffers (2 x 16 MiB for chunk
  // locations, the records themselves go straight to pack files; 2 x 32 MiB
  // for each index family), bounds an import's memory
  // whatever the file size: a 100 GiB file takes no more than a 1 GiB one.
  // Default: 64 MiB.
  uint64_t max_in_flight_bytes = 64ull << 20;

  // How chunks read from disk are checked; see ReadVerification. fsck always
  // checks both the checksum and the SHA-256 name of every chunk a snapshot
  // names (see Fsck()).
  // Default: kChecksum.
  ReadVerification verify_on_read = ReadVerification::kChecksum;

  // Read chunk records that are not in the kernel's page cache straight
  // from the disk (direct I/O), past the cache, and have the kernel read
  // nothing ahead; records in the cache (a snapshot just written) are
  // read from there. Less CPU and memory per byte read: the cache is not
  // filled with a second copy of every record read and copied out again.
  // But each read waits for the disk as it comes, where the kernel's
  // read-ahead would have had it read already: on a disk slow to answer,
  // large reads are slower (see gpuckptfs --direct-reads). Default: false.
  bool direct_reads = false;

  // Bytes of decompressed, verified chunks kept for readers (LRU).
  // Default: 64 MiB.
  uint64_t chunk_cache_bytes = 64ull << 20;

  // A shared pool this store is the local index and cache of: every
  // snapshot committed here is published there too, the pool's snapshots
  // are listed beside this store's own, and one is fetched (its records
  // and the chunks this store lacks) when first read. All the stores on a
  // pool share its fingerprint seed: a store that holds snapshots made
  // with another one cannot join it (kInvalidArgument). Opened read_only,
  // the store lists the pool's snapshots but cannot fetch one: reading it
  // is kPermissionDenied. Default: none.
  std::optional<PoolOptions> pool;

  // Settle spooled snapshots (SnapshotWriterOptions::spool) on a thread of
  // the store's own, on idle CPU, as soon as they are committed and when
  // the store is opened. false: only Settle() of the implementation does
  // (tests). Default: true.
  bool settle_in_background = true;

  // fsync (RocksDB WAL sync) before a snapshot becomes visible, and on
  // delete. Without it a power loss can lose a snapshot that was reported
  // done. Default: true.
  bool sync = true;
};

class Store {
 public:
  // Opens (or creates) the store in `dir`. Errors: kBusy when another
  // process holds it, kCorruption/kUnavailable for a damaged store or a
  // format newer than this build, kPermissionDenied, kIOError.
  static Result<std::unique_ptr<Store>> Open(const std::string& dir, const StoreOptions& options);

  virtual ~Store() = default;

  // Starts a new snapshot; see SnapshotWriter. The name is validated and
  // reserved against other writers of this Store now, and checked again on
  // Commit(). kNoSpace ("no space left on the store's disk") when the
  // store's disk has not even room for the reserve that Remove() and Gc()
  // need; a snapshot that fills the disk fails the same way. A store whose
  // writes failed for want of space takes new snapshots again as soon as
  // there is room: nothing needs to be restarted.
  virtual Result<std::unique_ptr<SnapshotWriter>> BeginSnapshot(
      const SnapshotSpec& spec, const SnapshotWriterOptions& options) = 0;
  Result<std::unique_ptr<SnapshotWriter>> BeginSnapshot(const SnapshotSpec& spec) {
    return BeginSnapshot(spec, SnapshotWriterOptions{});
  }

  // Imports the tree under `src_dir` (regular files, directories, symlinks;
  // symlinks are stored, never followed) as one snapshot. Nothing is
  // visible unless all of it succeeded. A file that changes while it is read
  // fails the import with kAborted.
  virtual Result<SnapshotInfo> ImportDirectory(const std::string& src_dir, const SnapshotSpec& spec,
                                               const ProgressFn& progress = nullptr) = 0;

  // Writes snapshot `id` into `dest_dir`, which must not exist or be an empty
  // directory. The tree is written beside it under a temporary name and
  // renamed into place when complete, so `dest_dir` never holds half a
  // snapshot. Ownership is restored when running as root.
  virtual Status Export(const std::string& id, const std::string& dest_dir,
                        const ProgressFn& progress = nullptr) = 0;

  // All complete snapshots, oldest first.
  virtual Result<std::vector<SnapshotInfo>> List() = 0;
  virtual Result<SnapshotInfo> Get(const std::string& id) = 0;
  // The files of a snapshot in path order.
  virtual Result<std::vector<FileEntry>> ListFiles(const std::string& id) = 0;

  // Opens one regular file of a snapshot for random reads (a scan of the
  // snapshot's file records finds it).
  virtual Result<std::unique_ptr<FileReader>> OpenFile(const std::string& id,
                                                       const std::string& path) = 0;
  // Opens `entry`, a regular file as ListFiles() listed it for the snapshot
  // `id` whose key was `key`: one record is read, and only of that
  // snapshot. kNotFound when `id` has been removed (and perhaps made again:
  // another key) since, so that a listing never opens another snapshot's
  // file of the same name.
  virtual Result<std::unique_ptr<FileReader>> OpenListedFile(const std::string& id, uint64_t key,
                                                             const FileEntry& entry) = 0;

  // Deletes a snapshot: it is gone from List() and Get() at once. Its
  // chunks stay until Gc() finds them unreferenced; FileReaders of it that
  // are open go on reading it until they are destroyed (see FileReader).
  // Works on a full disk: when it fails for want of space, the store gives
  // up the space it holds in reserve for this and tries once more.
  virtual Status Remove(const std::string& id) = 0;

  // Mark and sweep: marks every chunk named by a visible snapshot's extent
  // index or by one an open FileReader still reads, deletes the rest, and
  // removes the index records of snapshots that were never committed or
  // were removed, then gives the space back (also on a full disk, like
  // Remove()). Blocks new imports while it runs. With a shared pool, then
  // runs the pool's collector (GcReport's pool fields), unless another
  // store's runs.
  virtual Result<GcReport> Gc() = 0;

  // Re-hashes every chunk and checks every extent of every snapshot points
  // at a chunk that exists with the right length. A chunk is re-hashed in
  // the dedup domain of the snapshots that name it; one that no snapshot
  // names (garbage for Gc(), or an import's still running) has only its
  // checksum checked, as its domain is unknown. Reports findings (a damaged
  // chunk once, each file using it once); repairs nothing. Checks the store
  // as it was when it began: writers and settling go on meanwhile, Gc()
  // waits for it.
  virtual Result<FsckReport> Fsck() = 0;

  virtual Result<StoreStats> Stats() = 0;

  // What the snapshots `ids` hold of the store together: the stored size of
  // the distinct chunks their extents name, each chunk once however many of
  // them name it (what a user's quota charges). A snapshot removed meanwhile
  // (or only in a pool, not fetched) counts nothing. A scan of their extents
  // and one index lookup per distinct chunk.
  virtual Result<uint64_t> HeldBytes(const std::vector<std::string>& ids) = 0;
  // How many snapshots this Store has settled (its spooled files chunked,
  // and their spool files removed) since it was opened. What HeldBytes()
  // says of a snapshot changes when it settles (a spooled file counts its
  // whole size, its chunks their stored size), so a caller that keeps
  // HeldBytes() measures again when this moves. Cheap (no I/O); thread-safe.
  virtual uint64_t settled_snapshots() const = 0;

  // Bytes new snapshots may still take on the store's filesystem: what is
  // free to an unprivileged writer, less the reserve that Remove() and
  // Gc() keep when it is not held now (a new snapshot makes it again
  // first). One statvfs; kIOError (or another errno's code) when that fails.
  virtual Result<uint64_t> FreeBytes() = 0;

  // Cheap (no I/O): for metrics.
  virtual CacheStats cache_stats() const = 0;
  // The shared pool's counters; nullopt without a pool. Cheap (no I/O).
  virtual std::optional<PoolStats> pool_stats() const = 0;

  virtual const std::string& dir() const = 0;
};

struct AddDirectoryOptions {
  // Stored paths are `dest_prefix/<path in the tree>`, and `dest_prefix`
  // itself is added as a directory. Empty: the tree's top. Default: "".
  std::string dest_prefix;
  // When set, every directory, file and symlink of the tree must belong to
  // this uid, else kPermissionDenied: the daemon reads as root on behalf of a
  // user, who must not get other people's files into a snapshot of theirs.
  std::optional<uint32_t> required_owner;
  // When set, only the top-level names of the tree it returns true for are
  // added (and what is below them). Default: all.
  std::function<bool(const std::string& name)> include_top;
};

// Adds the tree under the directory `dir_fd` (regular files, directories,
// symlinks, walked with O_NOFOLLOW) to `writer`. `shown_root` names the tree
// in messages. A file that changes while it is read is kAborted; so is an
// import the writer was told to cancel (SnapshotWriter::SetCancel()).
// Sparse files keep their holes (SnapshotWriter::AddFile()).
Status AddDirectoryToSnapshot(SnapshotWriter* writer, int dir_fd, const std::string& shown_root,
                              const AddDirectoryOptions& options);

// What importing a tree would take, measured before anything is read:
// MeasureDirectory().
struct DirectoryMeasure {
  // Directories, regular files and symlinks the import adds (with
  // AddDirectoryOptions::dest_prefix, that directory too).
  uint64_t entries = 0;
  // The regular files' sizes, holes included: what the snapshot's files
  // will say (SnapshotInfo::logical_bytes).
  uint64_t logical_bytes = 0;
  // Of that, the bytes the import reads, chunks and stores (before dedup
  // and compression): the files' runs of data, as SnapshotWriter::AddFile()
  // reads them (holes under 64 KiB, and those past kMaxFileHoles in one
  // file, count as data). The most the import can add to the store.
  uint64_t data_bytes = 0;
};

// Measures the tree under the directory `dir_fd` as AddDirectoryToSnapshot()
// with `options` would import it, without reading any file's data: the
// same walk and the same refusals (openat with O_NOFOLLOW, no open that can
// block, a depth limit, required_owner and include_top as there), each
// regular file's runs of data found with lseek's SEEK_DATA and SEEK_HOLE,
// so a 200 GB sparse file costs a few system calls. For a caller that
// refuses an import (a quota, the store's free space) before it starts.
// The tree may change before the import; the import stores what it then
// reads. `shown_root` names the tree in messages. Errors as the import's
// would be: kPermissionDenied for an entry of another owner,
// kInvalidArgument for what a snapshot cannot hold or a tree too deep.
Result<DirectoryMeasure> MeasureDirectory(int dir_fd, const std::string& shown_root,
                                          const AddDirectoryOptions& options);

// The whole of a small stored file (a CRIU record image, a JSON file), for
// parsing: kInvalidArgument when it is larger than `max_bytes`, so that a
// crafted snapshot cannot make the reader allocate its size.
Result<std::string> ReadSmallStoredFile(Store& store, const std::string& id,
                                        const std::string& path, uint64_t max_bytes);
// The same for a file already open as `reader` (say, by
// Store::OpenListedFile); `what` names it in errors.
Result<std::string> ReadSmallStoredFile(FileReader& reader, const std::string& what,
                                        uint64_t max_bytes);

// The manifest of a snapshot as users see it (`manifest.json`, `gpuckpt ls
// --json`): pretty-printed JSON, ending in a newline. Format in
// core/store/FORMAT.md.
std::string SnapshotManifestJson(const SnapshotInfo& info);

}  // namespace gpuckpt

#endif  // GPUCKPT_STORE_H_
