// ChunkStore: the deduplicated chunks of a store.
//
// Chunks are named by their SHA-256, keyed in an owner's dedup domain
// (core/store/chunk_hash.h; chunk_meta family: hash -> sequence
// number and sizes) and kept under a sequence number given in the order
// they arrive (chunks family: seq -> where the record lies in a pack file;
// stores written by version 1 hold the record itself there). Records are
// appended to the packs (core/store/chunk_packs.h) in arrival order, which
// is file order, so a sequential read of a file is a (mostly) sequential
// read of the disk.
//
// Put() stores a chunk unless one with its hash exists: a chunk is written
// once, whatever process, snapshot or file it comes from; the same bytes
// named in two dedup domains are two chunks. ChunkStore itself does not
// know domains: the caller names the chunk. Concurrent Put()s
// of the same hash wait for each other (for one compression and one small
// write), so the second finds the first's record.
//
// Reading checks each chunk as StoreOptions::verify_on_read says: a chunk
// whose bytes do not match its checksum (or its name) is kCorruption,
// never returned. ReadMany() decodes the chunks of a large read on helper
// threads beside its caller (one fewer than the CPUs, shared by the whole
// process), so a reader that waits for one large read at a time still has
// every core decoding for it.
//
// Thread-safe, except CompactPacks(), which no Put() may overlap. Borrows
// the StoreDb and the ChunkCache, which must outlive it. Locations and meta
// records are written without RocksDB's WAL: they are durable after
// StoreDb::FlushAll(), which a snapshot does before it is published.
#ifndef GPUCKPT_CORE_STORE_CHUNK_STORE_H_
#define GPUCKPT_CORE_STORE_CHUNK_STORE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/base/mutex.h"
#include "core/store/chunk_cache.h"
#include "core/store/chunk_codec.h"
#include "core/store/chunk_hash.h"
#include "core/store/store_db.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

class ChunkStore {
 public:
  // Reads the last sequence number in use. `direct_reads`: ReadMany()
  // reads records that are not in the page cache past it
  // (ChunkPacks::ReadRangeDirect(), StoreOptions::direct_reads), and asks
  // the kernel to read nothing ahead.
  static Result<std::unique_ptr<ChunkStore>> Open(StoreDb* db, ChunkCache* cache,
                                                  ReadVerification verify,
                                                  bool direct_reads = false);

  struct PutResult {
    uint64_t seq = 0;
    bool added = false;         // false: the store already had it
    uint64_t stored_bytes = 0;  // size of the new record (0 when not added)
  };
  Result<PutResult> Put(const ChunkHash& hash, const uint8_t* data, size_t len, int zstd_level);
  // Stores `record`, the encoded record of chunk `hash` (`raw_length`
  // bytes) as another store keeps it (the shared pool's), unless this
  // store has the chunk; as Put(). The caller has checked the record
  // (Check()): it is appended as it is.
  Result<PutResult> PutRecord(const ChunkHash& hash, std::string_view record, uint64_t raw_length);
  // The record of chunk `hash` stored under `seq`, as it lies in its pack,
  // undecoded and unchecked: what the shared pool is sent.
  Result<std::string> ReadRecord(const ChunkHash& hash, uint64_t seq) const;

  // The meta record of chunk `hash`, if stored.
  Result<std::optional<ChunkMeta>> Lookup(const ChunkHash& hash) const;

  // The raw bytes of chunk `hash` stored under `seq`, which must be
  // `expected_len` long (from the extent that names it). `domain` keys the
  // name in the dedup domain of the snapshot that names it (null: the
  // shared domain); only ReadVerification::kFullHash needs it. With
  // `use_cache`, served from and kept in the cache; a one-pass reader
  // (export) passes false so as not to churn it.
  Result<std::shared_ptr<const std::string>> Read(const ChunkHash& hash, uint64_t seq,
                                                  uint64_t expected_len,
                                                  const ChunkDomainKey* domain,
                                                  bool use_cache = true) const;

  // A chunk's bytes as ReadMany() gives them: `bytes` stays valid while
  // `owner` is held. The owner is the decoded chunk, or the read buffer a
  // raw record lies in (a chunk read without the cache is not copied out
  // of it). Hold it no longer than the request it serves: a read buffer is
  // a few MiB.
  struct ChunkBytes {
    std::string_view bytes;
    std::shared_ptr<const void> owner;
  };

  // One chunk of a batch for ReadMany().
  struct ChunkRef {
    ChunkHash hash;
    uint64_t seq = 0;
    uint64_t expected_len = 0;
    bool use_cache = true;  // as for Read()
  };
  // Reads many chunks at once, as Read() reads one: their locations in one
  // RocksDB MultiGet, records that lie next to each other in a pack in one
  // read (up to a few MiB), so a file's chunks come off the disk in its
  // order in large reads. `(*out)[i]` is chunk `refs[i]`; all are named in
  // dedup domain `domain` (those of one snapshot are), as for Read(). Fails
  // on the first chunk that Read() would fail on. A batch of 256 KiB or
  // more (a reader going through a file) has the kernel read on ahead in
  // the packs; a smaller one (a page fault's) reads only what it needs.
  Status ReadMany(const std::vector<ChunkRef>& refs, const ChunkDomainKey* domain,
                  std::vector<ChunkBytes>* out) const;

  // Decodes a stored record and checks its checksum, regardless of
  // verify_on_read (fsck), then re-hashes it in each of `domains` (null:
  // the shared domain) until one gives the name it carries; it is damaged
  // when none does. With no domains the name is not checked (a chunk no
  // snapshot names, whose domain is unknown). Returns the name and the raw
  // length.
  static Result<std::pair<ChunkHash, uint64_t>> Check(
      std::string_view record, uint64_t seq, const std::vector<const ChunkDomainKey*>& domains);

  // The record a value of the chunks family stands for: read from its pack,
  // or the value itself (version 1). For fsck, which scans the family.
  Result<std::string> RecordOf(std::string_view chunks_value) const;

  struct PackCompaction {
    uint64_t packs_removed = 0;
    uint64_t packs_rewritten = 0;  // live records copied, then removed
    uint64_t bytes_rewritten = 0;  // live record bytes copied
    uint64_t bytes_freed = 0;      // size of the pack files removed
    uint64_t bytes_punched = 0;    // garbage punched out of packs kept
  };
  // Gives back the space of deleted chunks (gc): removes packs no location
  // points into, copies the live records of packs that are more than half
  // garbage into a new pack before removing them (when the disk has room
  // for the copies), and punches the garbage out of the other packs in
  // place (which needs no room: gc works on a full disk). Safe against
  // crashes at any point (new locations are written only once the new pack
  // is durable; an old pack is removed, and garbage punched, only after the
  // deletions that made it garbage are durable). Readers may run; Put()
  // must not.
  Result<PackCompaction> CompactPacks();

  // Walking every chunk (gc, fsck, Stats): through here, never by the
  // families' records, whose encoding is this module's.
  struct Scan {
    const DbView* view = nullptr;  // none: the database as it is now
    bool fill_cache = true;        // false: one pass nobody repeats soon
  };
  // Calls `visit` with each chunk's meta record, in name order: its name
  // and its meta, either of which may be malformed (callers judge that:
  // gc stops, fsck reports it and goes on). Stops at the first error
  // `visit` returns, and returns it; a failed scan is an error "scanning
  // chunk meta records: ...".
  using MetaVisitor =
      std::function<Status(const Result<ChunkHash>& hash, const Result<ChunkMeta>& meta)>;
  Status ForEachChunk(const Scan& scan, const MetaVisitor& visit) const;
  // Calls `visit` with each chunk record, in sequence order: its sequence
  // number (kCorruption "chunk key of N bytes" for a malformed key) and its
  // value in the chunks family, for RecordOf(). As ForEachChunk(); a failed
  // scan is an error "scanning chunks: ...".
  using RecordVisitor = std::function<Status(const Result<uint64_t>& seq, std::string_view value)>;
  Status ForEachRecord(const Scan& scan, const RecordVisitor& visit) const;

  struct SweepCounts {
    uint64_t kept = 0;
    uint64_t deleted = 0;
    uint64_t bytes_deleted = 0;  // stored bytes of the chunks deleted
  };
  // Gc's sweep: deletes every chunk whose sequence number is not in `keep`
  // into `batch`, written (logged, not synced) whenever it grows past a
  // few MiB; the caller writes the rest, with whatever it added before.
  // The cache forgets them. A malformed meta record stops it (kCorruption).
  // A chunk record without a meta record (possible only through damage) is
  // never swept; fsck reports it. No Put() may overlap it.
  Status SweepUnmarked(const std::unordered_set<uint64_t>& keep, StoreBatch* batch,
                       SweepCounts* counts);
  // Gives the index space of deleted chunks back now: rewrites the chunk
  // tables (gc, after a sweep that deleted some).
  Status CompactIndex();

  ChunkCache* cache() const { return cache_; }

 private:
  ChunkStore(StoreDb* db, ChunkCache* cache, ReadVerification verify, bool direct_reads,
             uint64_t next_seq)
      : db_(db), cache_(cache), verify_(verify), direct_reads_(direct_reads), next_seq_(next_seq) {}

  // Appends `record` to the packs under a new sequence number and indexes
  // it; the caller holds the claim on `hash` and found no such chunk.
  Result<PutResult> AppendNew(const ChunkHash& hash, std::string_view record, uint64_t raw_length);
  // Holds `hash` for the caller until Release(); waits while someone else
  // holds it.
  void Claim(const ChunkHash& hash) EXCLUDES(claims_mu_);
  void Release(const ChunkHash& hash) EXCLUDES(claims_mu_);
  // Copies the live records of packs `ids` into new packs, points their
  // locations there and removes the old packs; returns the bytes copied. On
  // failure the copies are removed and the old packs stay.
  Result<uint64_t> RewritePacks(const std::vector<uint64_t>& ids);
  // Steps of ReadMany().
  // A chunk of ReadMany() that lies in a pack: refs[index] at `location`.
  struct PackedChunk {
    size_t index;
    PackLocation location;
  };
  class RunBuffers;
  // Sets (*out)[i] for each ref found in the cache; the indices of the
  // others go to `*wanted`.
  Status ServeFromCache(const std::vector<ChunkRef>& refs, std::vector<ChunkBytes>* out,
                        std::vector<size_t>* wanted) const;
  // Looks the records of refs[wanted] up in one MultiGet: those kept inline
  // are decoded into `*out`, the others' pack locations go to `*packed`.
  Status LookUpLocations(const std::vector<ChunkRef>& refs, const std::vector<size_t>& wanted,
                         const ChunkDomainKey* domain, std::vector<ChunkBytes>* out,
                         std::vector<PackedChunk>* packed) const;
  // The end of the run of `packed` (sorted by place) that starts at `begin`:
  // records of one pack close enough to be read in one go.
  static size_t EndOfRun(const std::vector<PackedChunk>& packed, size_t begin);
  // Reads `run` in one read and decodes its chunks into `*out`;
  // `read_ahead`: the reader goes through the pack (a large read), so the
  // kernel is asked to read on ahead of it.
  Status ReadRun(const std::vector<ChunkRef>& refs, std::span<const PackedChunk> run,
                 const ChunkDomainKey* domain, bool read_ahead, RunBuffers* buffers,
                 std::vector<ChunkBytes>* out) const;
  // A step of CompactPacks(): copies the live records of packs `rewrite`
  // (RewritePacks()) and counts them in `*report`; when the disk filled
  // meanwhile, adds them to `*punch` instead.
  Status RewriteOrLeaveToPunch(const std::vector<ChunkPacks::PackFile>& files,
                               const std::vector<uint64_t>& rewrite, std::vector<uint64_t>* punch,
                               PackCompaction* report);
  // The record stored under `seq` into `*storage`; `hash` names it in errors.
  Status LoadRecord(const ChunkHash& hash, uint64_t seq, std::string* storage) const;
  // Checks decoded chunk `data` against what its extent and its name say:
  // the hash the record claims, the length, and with kFullHash its SHA-256.
  Status CheckDecoded(const ChunkHash& hash, uint64_t seq, uint64_t expected_len,
                      const ChunkHash& stored_hash, std::string_view data,
                      const ChunkDomainKey* domain) const;
  // Decodes `record` of chunk `hash` (stored under `seq`, named in
  // `domain`) and checks it as verify_ says; caches the result when
  // `use_cache`.
  Result<std::shared_ptr<const std::string>> DecodeChecked(const ChunkHash& hash, uint64_t seq,
                                                           uint64_t expected_len,
                                                           std::string_view record,
                                                           const ChunkDomainKey* domain,
                                                           bool use_cache) const;
  // As DecodeChecked(), for a record that lies in `buffer`: a raw one that
  // is not to be cached is checked where it lies and handed out as a view
  // into `buffer`, without a copy.
  Result<ChunkBytes> DecodeCheckedInPlace(const ChunkRef& ref, std::string_view record,
                                          const ChunkDomainKey* domain,
                                          const std::shared_ptr<const void>& buffer) const;

  StoreDb* db_;
  ChunkCache* cache_;
  ReadVerification verify_;
  const bool direct_reads_;
  std::atomic<uint64_t> next_seq_;

  Mutex claims_mu_;
  CondVar claims_cv_;
  std::unordered_set<ChunkHash, ChunkHashHasher> claims_ GUARDED_BY(claims_mu_);
};

// Key of a chunk record: seq as 8 big-endian bytes.
std::string ChunkSeqKey(uint64_t seq);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_STORE_H_
