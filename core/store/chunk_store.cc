#include "core/store/chunk_store.h"

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/base/big_endian.h"
#include "core/base/block_pool.h"
#include "core/base/scope_exit.h"
#include "core/base/task_pool.h"
#include "core/base/work_queue.h"
#include "core/store/store_db_rocks.h"

namespace gpuckpt {
namespace {

rocksdb::Slice HashSlice(const ChunkHash& hash) {
  return rocksdb::Slice(hash.view().data(), hash.view().size());
}

Status WrongLength(const ChunkHash& hash, uint64_t got, uint64_t expected) {
  return Status::Corruption("chunk " + hash.Hex() + " is " + std::to_string(got) +
                            " bytes, its extent says " + std::to_string(expected));
}

// A reader beside the store's holder found a chunk gone after catching up:
// the holder removed the snapshots naming it and collected it meanwhile.
Status CollectedWhileRead(const ChunkHash& hash) {
  return Status::Aborted("chunk " + hash.Hex() +
                         " was collected while it was read: the store's holder (a running "
                         "gpuckptfs) removed what named it; list again and read what is there");
}

// ReadMany(): records closer than this in a pack are read together with the
// bytes between them; runs stop growing at kMaxRun.
constexpr uint64_t kMaxGap = 64u << 10;
constexpr uint64_t kMaxRun = 8u << 20;
// Every kReadAheadStep of a pack read, the kernel is asked to fetch the
// kReadAhead bytes after the next step boundary (into its cache: not for
// direct reads, which would only read them again).
constexpr uint64_t kReadAheadStep = 4u << 20;
constexpr uint64_t kReadAhead = 16u << 20;
// Only for a read of at least this many bytes: a reader going through a
// file asks for large reads (the kernel's read-ahead of the mount, CRIU's
// eager restore, a lazy server's background pass), a process's page faults
// (a lazy restore's) for small ones here and there. Those wait for the
// disk one after another, and 16 MiB read ahead for each put every one of
// them behind far more than it needs.
constexpr uint64_t kReadAheadMinRead = 256u << 10;

// ReadRun(): the chunks of a run of at least this many bytes are decoded
// on several cores at once. A reader that asks for one large read and waits
// for all of it (a lazy restore's server, through direct I/O, one request
// after another) would else have its chunks decoded one after another on
// one core, however many the machine has.
constexpr size_t kParallelDecodeBytes = 256u << 10;

// The helpers that decode a run's chunks beside the reading thread: one
// fewer than the CPUs, shared by every store of the process, made on first
// use and never destroyed (a request may still be decoding while the
// process exits).
TaskPool& DecodePool() {
  static TaskPool* const pool = new TaskPool(std::min(ResolveThreadCount(0), 16u) - 1);
  return *pool;
}

// The blocks runs are read into (RunBuffers): one a reader holds while its
// request is served, kKeptReadBlocks kept free for the next ones (the
// daemon's FUSE threads and the decode helpers); shared by every store of
// the process, never destroyed (a request may still hold one while the
// process exits).
constexpr size_t kReadBlockBytes = 2u << 20;
constexpr size_t kKeptReadBlocks = 16;
BlockPool& ReadBlocks() {
  static BlockPool* const pool = new BlockPool(kReadBlockBytes, kKeptReadBlocks);
  return *pool;
}

// A decoded (or cached) chunk as ReadMany() gives it out.
ChunkStore::ChunkBytes BytesOf(std::shared_ptr<const std::string> chunk) {
  const std::string_view bytes(*chunk);
  return ChunkStore::ChunkBytes{bytes, std::move(chunk)};
}

// CompactPacks(): pack id -> the records some location points at (offset,
// length).
using LiveRecords = std::unordered_map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>>;

Result<LiveRecords> LiveRecordsByPack(const StoreDb& db) {
  LiveRecords live;
  std::unique_ptr<rocksdb::Iterator> it(
      StoreDbRocks::db(db)->NewIterator(rocksdb::ReadOptions(), StoreDbRocks::chunks(db)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!IsPackLocation(it->value().ToStringView())) continue;
    GPUCKPT_ASSIGN_OR_RETURN(PackLocation l, DecodePackLocation(it->value().ToStringView()));
    live[l.pack].emplace_back(l.offset, l.length);
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning chunk locations"));
  return live;
}

uint64_t LiveBytes(const LiveRecords& live, uint64_t id) {
  uint64_t used = 0;
  if (auto found = live.find(id); found != live.end()) {
    for (const auto& r : found->second) used += r.second;
  }
  return used;
}

// What becomes of the packs that hold live records: copied (`rewrite`,
// `rewrite_bytes` of live records) or punched in place (`punch`).
struct PackPlan {
  std::vector<uint64_t> rewrite;
  uint64_t rewrite_bytes = 0;
  std::vector<uint64_t> punch;
};

// Removes the inactive packs nothing points into; plans the others.
Result<PackPlan> RemoveUnusedPacks(ChunkPacks& packs,
                                   const std::vector<ChunkPacks::PackFile>& files,
                                   const LiveRecords& live, ChunkStore::PackCompaction* report) {
  PackPlan plan;
  for (const auto& f : files) {
    if (f.active) continue;
    const uint64_t used = LiveBytes(live, f.id);
    if (used == 0) {
      GPUCKPT_RETURN_IF_ERROR(packs.Remove(f.id));
      ++report->packs_removed;
      report->bytes_freed += f.size;
    } else if (used < (f.size - std::min(f.size, ChunkPacks::kHeaderSize)) / 2) {
      plan.rewrite.push_back(f.id);
      plan.rewrite_bytes += used;
    } else {
      plan.punch.push_back(f.id);
    }
  }
  return plan;
}

// Punches the garbage between and after the live records of packs `punch`
// out (a no-op where the filesystem has no holes).
Status PunchGarbage(ChunkPacks& packs, const std::vector<ChunkPacks::PackFile>& files,
                    const std::vector<uint64_t>& punch, LiveRecords* live,
                    ChunkStore::PackCompaction* report) {
  for (uint64_t id : punch) {
    std::vector<std::pair<uint64_t, uint64_t>>& records = (*live)[id];
    std::sort(records.begin(), records.end());
    std::vector<std::pair<uint64_t, uint64_t>> gaps;
    uint64_t end = ChunkPacks::kHeaderSize;
    for (const auto& [offset, length] : records) {
      // Gaps under a page free nothing.
      if (offset > end && offset - end >= 4096) gaps.emplace_back(end, offset - end);
      end = std::max(end, offset + length);
    }
    for (const auto& f : files) {
      if (f.id == id && f.size > end && f.size - end >= 4096) gaps.emplace_back(end, f.size - end);
    }
    if (gaps.empty()) continue;
    auto punched = packs.PunchHoles(id, gaps);
    // A filesystem without holes keeps the garbage until the pack is
    // rewritten; nothing is lost.
    if (punched.status().code() == StatusCode::kUnavailable) break;
    GPUCKPT_RETURN_IF_ERROR(punched.status());
    report->bytes_punched += *punched;
  }
  return Status::Ok();
}

}  // namespace

std::string ChunkSeqKey(uint64_t seq) {
  std::string k;
  PutBigEndian(&k, seq, 8);
  return k;
}

Result<std::unique_ptr<ChunkStore>> ChunkStore::Open(StoreDb* db, ChunkCache* cache,
                                                     ReadVerification verify, bool direct_reads) {
  // Every chunk a published snapshot names was flushed before it was
  // published, so the last key on disk is at least the highest sequence
  // anyone refers to. Numbers of chunks lost in a crash may be handed out
  // again: nothing durable names them.
  std::unique_ptr<rocksdb::Iterator> it(
      StoreDbRocks::db(*db)->NewIterator(rocksdb::ReadOptions(), StoreDbRocks::chunks(*db)));
  it->SeekToLast();
  uint64_t next = 1;
  if (it->Valid()) {
    if (it->key().size() != 8) return Status::Corruption("malformed chunk key");
    next = GetBigEndian(it->key().ToStringView(), 8) + 1;
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "reading the last chunk"));
  return std::unique_ptr<ChunkStore>(new ChunkStore(db, cache, verify, direct_reads, next));
}

namespace {

rocksdb::ReadOptions ScanOptions(const ChunkStore::Scan& scan) {
  rocksdb::ReadOptions r;
  r.snapshot = scan.view != nullptr ? StoreDbRocks::snapshot(*scan.view) : nullptr;
  r.fill_cache = scan.fill_cache;
  return r;
}

}  // namespace

Status ChunkStore::ForEachChunk(const Scan& scan, const MetaVisitor& visit) const {
  std::unique_ptr<rocksdb::Iterator> it(
      StoreDbRocks::db(*db_)->NewIterator(ScanOptions(scan), StoreDbRocks::chunk_meta(*db_)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    GPUCKPT_RETURN_IF_ERROR(visit(ChunkHash::FromBytes(it->key().ToStringView()),
                                  DecodeChunkMeta(it->value().ToStringView())));
  }
  return FromRocks(it->status(), "scanning chunk meta records");
}

Status ChunkStore::ForEachRecord(const Scan& scan, const RecordVisitor& visit) const {
  std::unique_ptr<rocksdb::Iterator> it(
      StoreDbRocks::db(*db_)->NewIterator(ScanOptions(scan), StoreDbRocks::chunks(*db_)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::string_view key = it->key().ToStringView();
    Result<uint64_t> seq = key.size() == 8
                               ? Result<uint64_t>(GetBigEndian(key, 8))
                               : Result<uint64_t>(Status::Corruption(
                                     "chunk key of " + std::to_string(key.size()) + " bytes"));
    GPUCKPT_RETURN_IF_ERROR(visit(seq, it->value().ToStringView()));
  }
  return FromRocks(it->status(), "scanning chunks");
}

Status ChunkStore::SweepUnmarked(const std::unordered_set<uint64_t>& keep, StoreBatch* batch,
                                 SweepCounts* counts) {
  // Walks the small meta records, not the chunk data.
  return ForEachChunk(Scan(), [&](const Result<ChunkHash>& hash, const Result<ChunkMeta>& meta) {
    if (!hash.ok() || !meta.ok())
      return Status::Corruption("malformed chunk meta record; run fsck");
    if (keep.count(meta->seq) != 0) {
      ++counts->kept;
      return Status::Ok();
    }
    ++counts->deleted;
    counts->bytes_deleted += meta->stored_length;
    auto s = StoreDbRocks::batch(*batch).Delete(StoreDbRocks::chunks(*db_), ChunkSeqKey(meta->seq));
    if (s.ok())
      s = StoreDbRocks::batch(*batch).Delete(StoreDbRocks::chunk_meta(*db_),
                                             HashSlice(hash.value()));
    if (!s.ok()) return FromRocks(s, "batching chunk deletion");
    cache_->Erase(hash.value());
    if (batch->bytes() > (4u << 20)) {
      return db_->Write(batch, StoreDb::Durability::kLogged, "deleting chunks");
    }
    return Status::Ok();
  });
}

Status ChunkStore::CompactIndex() {
  // Forces blob garbage collection too, so that files holding only dead
  // chunks (stores of version 1) are deleted.
  rocksdb::CompactRangeOptions c;
  c.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  c.blob_garbage_collection_age_cutoff = 1.0;
  c.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  // A compaction flushes first: see StoreDb::Resume().
  GPUCKPT_RETURN_IF_ERROR(db_->Resume());
  return FromRocks(
      StoreDbRocks::db(*db_)->CompactRange(c, StoreDbRocks::chunks(*db_), nullptr, nullptr),
      "compacting after gc");
}

void ChunkStore::Claim(const ChunkHash& hash) {
  MutexLock lock(&claims_mu_);
  while (claims_.count(hash) != 0) claims_cv_.Wait(claims_mu_);
  claims_.insert(hash);
}

void ChunkStore::Release(const ChunkHash& hash) {
  {
    MutexLock lock(&claims_mu_);
    claims_.erase(hash);
  }
  claims_cv_.NotifyAll();
}

Result<std::optional<ChunkMeta>> ChunkStore::Lookup(const ChunkHash& hash) const {
  std::string value;
  rocksdb::Status s = StoreDbRocks::db(*db_)->Get(
      rocksdb::ReadOptions(), StoreDbRocks::chunk_meta(*db_), HashSlice(hash), &value);
  if (s.IsNotFound()) return std::optional<ChunkMeta>();
  if (!s.ok()) return FromRocks(s, "looking up chunk " + hash.Hex());
  GPUCKPT_ASSIGN_OR_RETURN(ChunkMeta meta, DecodeChunkMeta(value));
  return std::optional<ChunkMeta>(meta);
}

Result<ChunkStore::PutResult> ChunkStore::Put(const ChunkHash& hash, const uint8_t* data,
                                              size_t len, int zstd_level) {
  Claim(hash);
  ScopeExit unclaim([&] { Release(hash); });

  GPUCKPT_ASSIGN_OR_RETURN(auto existing, Lookup(hash));
  if (existing) return PutResult{existing->seq, false, 0};
  std::string record;
  EncodeChunkRecord(data, len, hash, zstd_level, &record);
  return AppendNew(hash, record, len);
}

Result<ChunkStore::PutResult> ChunkStore::PutRecord(const ChunkHash& hash, std::string_view record,
                                                    uint64_t raw_length) {
  Claim(hash);
  ScopeExit unclaim([&] { Release(hash); });

  GPUCKPT_ASSIGN_OR_RETURN(auto existing, Lookup(hash));
  if (existing) return PutResult{existing->seq, false, 0};
  return AppendNew(hash, record, raw_length);
}

Result<std::string> ChunkStore::ReadRecord(const ChunkHash& hash, uint64_t seq) const {
  std::string record;
  GPUCKPT_RETURN_IF_ERROR(LoadRecord(hash, seq, &record));
  return record;
}

Result<ChunkStore::PutResult> ChunkStore::AppendNew(const ChunkHash& hash, std::string_view record,
                                                    uint64_t raw_length) {
  const uint64_t seq = next_seq_.fetch_add(1);
  auto appended = db_->packs().Append(record);
  if (!appended.ok()) return OnStoreDisk(appended.status());
  const PackLocation location = *appended;
  rocksdb::WriteBatch batch;
  auto s = batch.Put(StoreDbRocks::chunks(*db_), ChunkSeqKey(seq), EncodePackLocation(location));
  if (s.ok()) {
    s = batch.Put(StoreDbRocks::chunk_meta(*db_), HashSlice(hash),
                  EncodeChunkMeta(ChunkMeta{seq, raw_length, record.size()}));
  }
  if (!s.ok()) return FromRocks(s, "batching chunk " + hash.Hex());
  rocksdb::WriteOptions w;
  // Skips the WAL (one small synced write per chunk otherwise); the
  // snapshot's flush before publishing makes it durable.
  w.disableWAL = true;
  GPUCKPT_RETURN_IF_ERROR(
      FromRocks(StoreDbRocks::db(*db_)->Write(w, &batch), "writing chunk " + hash.Hex()));
  return PutResult{seq, true, record.size()};
}

Result<std::shared_ptr<const std::string>> ChunkStore::Read(const ChunkHash& hash, uint64_t seq,
                                                            uint64_t expected_len,
                                                            const ChunkDomainKey* domain,
                                                            bool use_cache) const {
  if (use_cache) {
    if (auto hit = cache_->Lookup(hash)) {
      if (hit->size() != expected_len) return WrongLength(hash, hit->size(), expected_len);
      return hit;
    }
  }
  std::string record;
  GPUCKPT_RETURN_IF_ERROR(LoadRecord(hash, seq, &record));
  auto decoded = DecodeChecked(hash, seq, expected_len, record, domain, use_cache);
  if (decoded.ok() || decoded.status().code() != StatusCode::kCorruption || !db_->read_only()) {
    return decoded;
  }
  // A reader beside the holder: the holder's gc may have punched this
  // record out of its pack (its snapshots removed) after we looked it up.
  // Damage is what remains once our view is the holder's.
  GPUCKPT_RETURN_IF_ERROR(db_->CatchUp());
  rocksdb::PinnableSlice value;
  rocksdb::Status s = StoreDbRocks::db(*db_)->Get(
      rocksdb::ReadOptions(), StoreDbRocks::chunks(*db_), ChunkSeqKey(seq), &value);
  if (s.IsNotFound()) return CollectedWhileRead(hash);
  GPUCKPT_RETURN_IF_ERROR(FromRocks(s, "reading chunk " + hash.Hex()));
  GPUCKPT_RETURN_IF_ERROR(LoadRecord(hash, seq, &record));
  return DecodeChecked(hash, seq, expected_len, record, domain, use_cache);
}

Status ChunkStore::CheckDecoded(const ChunkHash& hash, uint64_t seq, uint64_t expected_len,
                                const ChunkHash& stored_hash, std::string_view data,
                                const ChunkDomainKey* domain) const {
  if (stored_hash != hash) {
    return Status::Corruption("chunk record " + std::to_string(seq) + " holds " +
                              stored_hash.Hex() + ", expected " + hash.Hex());
  }
  if (data.size() != expected_len) return WrongLength(hash, data.size(), expected_len);
  if (verify_ == ReadVerification::kFullHash &&
      HashChunk(reinterpret_cast<const uint8_t*>(data.data()), data.size(), domain) != hash) {
    return Status::Corruption("chunk " + hash.Hex() + " does not match its hash (damaged store)");
  }
  return Status::Ok();
}

Result<std::shared_ptr<const std::string>> ChunkStore::DecodeChecked(
    const ChunkHash& hash, uint64_t seq, uint64_t expected_len, std::string_view record,
    const ChunkDomainKey* domain, bool use_cache) const {
  auto data = std::make_shared<std::string>();
  ChunkHash stored_hash;
  GPUCKPT_RETURN_IF_ERROR(DecodeChunkRecord(record, hash.Hex(), data.get(), &stored_hash,
                                            verify_ != ReadVerification::kNone));
  GPUCKPT_RETURN_IF_ERROR(CheckDecoded(hash, seq, expected_len, stored_hash, *data, domain));
  if (use_cache) cache_->Insert(hash, data);
  return std::shared_ptr<const std::string>(std::move(data));
}

Result<ChunkStore::ChunkBytes> ChunkStore::DecodeCheckedInPlace(
    const ChunkRef& ref, std::string_view record, const ChunkDomainKey* domain,
    const std::shared_ptr<const void>& buffer) const {
  if (!ref.use_cache) {
    // A raw record is the chunk's bytes: checked where they lie, they need
    // no copy (the cache keeps strings of its own, so a cached one does).
    ChunkHash stored_hash;
    GPUCKPT_ASSIGN_OR_RETURN(
        std::optional<std::string_view> raw,
        RawChunkPayload(record, ref.hash.Hex(), &stored_hash, verify_ != ReadVerification::kNone));
    if (raw) {
      GPUCKPT_RETURN_IF_ERROR(
          CheckDecoded(ref.hash, ref.seq, ref.expected_len, stored_hash, *raw, domain));
      return ChunkBytes{*raw, buffer};
    }
  }
  GPUCKPT_ASSIGN_OR_RETURN(
      std::shared_ptr<const std::string> decoded,
      DecodeChecked(ref.hash, ref.seq, ref.expected_len, record, domain, ref.use_cache));
  return BytesOf(std::move(decoded));
}

// Where the records of a run are read into. Raw chunks are handed out as
// views into it, so it is held by what was read, not reused by the next
// call. Runs share blocks from ReadBlocks() (reused, never faulted in
// again: a fresh buffer per call cost a page fault and a clear for every
// byte read); a run longer than a block (a FUSE read is 1 MiB) gets a
// buffer of its own.
class ChunkStore::RunBuffers {
 public:
  struct Room {
    char* data = nullptr;
    std::shared_ptr<const void> owner;
  };
  // Room for the `run_bytes` at `pack_offset` of a pack, laid out for
  // ChunkPacks::ReadRangeDirect() (which direct_reads_ asks for; a few KiB
  // more per run for the others): `data` lies as far past an aligned
  // address as the run's offset past a block's start.
  Result<Room> For(size_t run_bytes, uint64_t pack_offset) {
    const size_t head = pack_offset % ChunkPacks::kDirectAlign;
    const size_t span = ChunkPacks::DirectSpan(pack_offset, run_bytes);
    if (span > kReadBlockBytes) {
      std::shared_ptr<char> own(
          static_cast<char*>(std::aligned_alloc(ChunkPacks::kDirectAlign, span)),
          [](char* p) { std::free(p); });
      if (!own) return NoRoom(run_bytes);
      return Room{own.get() + head, std::move(own)};
    }
    if (!block_ || kReadBlockBytes - used_ < span) {
      block_ = ReadBlocks().Get();
      used_ = 0;
      if (!block_) return NoRoom(run_bytes);
    }
    // Blocks are mapped whole pages, and every span is whole blocks of
    // kDirectAlign: each run starts aligned.
    char* at = reinterpret_cast<char*>(block_.get()) + used_ + head;
    used_ += span;
    return Room{at, block_};
  }

 private:
  static Status NoRoom(size_t run_bytes) {
    return Status::NoMemory("no memory to read " + std::to_string(run_bytes) +
                            " bytes of chunk records into");
  }

  std::shared_ptr<uint8_t[]> block_;  // the block runs are placed in now
  size_t used_ = 0;                   // bytes of it given to runs
};

Status ChunkStore::ReadMany(const std::vector<ChunkRef>& refs, const ChunkDomainKey* domain,
                            std::vector<ChunkBytes>* out) const {
  out->assign(refs.size(), ChunkBytes{});
  std::vector<size_t> wanted;  // indices not served by the cache
  GPUCKPT_RETURN_IF_ERROR(ServeFromCache(refs, out, &wanted));
  if (wanted.empty()) return Status::Ok();
  std::vector<PackedChunk> packed;
  GPUCKPT_RETURN_IF_ERROR(LookUpLocations(refs, wanted, domain, out, &packed));
  std::sort(packed.begin(), packed.end(), [](const PackedChunk& a, const PackedChunk& b) {
    return std::tie(a.location.pack, a.location.offset) <
           std::tie(b.location.pack, b.location.offset);
  });
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) in `packed`
  for (size_t begin = 0; begin < packed.size();) {
    const size_t end = EndOfRun(packed, begin);
    runs.emplace_back(begin, end);
    begin = end;
  }
  // The runs are read one after another, and a file's chunks lie in
  // several packs (written side by side): cold, a small read (a lazy
  // restore's page fault) would wait for the disk once per run. The disk
  // is asked for all but the first at once, so it waits about once
  // (through the cache: direct reads would only read them again).
  for (size_t r = 1; r < runs.size() && !direct_reads_; ++r) {
    const PackLocation& first = packed[runs[r].first].location;
    const PackLocation& last = packed[runs[r].second - 1].location;
    db_->packs().ReadAhead(first.pack, first.offset, last.offset + last.length - first.offset);
  }
  uint64_t read_bytes = 0;
  for (const ChunkRef& ref : refs) read_bytes += ref.expected_len;
  const bool read_ahead = read_bytes >= kReadAheadMinRead && !direct_reads_;
  RunBuffers buffers;
  for (const auto& [begin, end] : runs) {
    GPUCKPT_RETURN_IF_ERROR(ReadRun(refs, std::span(packed).subspan(begin, end - begin), domain,
                                    read_ahead, &buffers, out));
  }
  return Status::Ok();
}

Status ChunkStore::ServeFromCache(const std::vector<ChunkRef>& refs, std::vector<ChunkBytes>* out,
                                  std::vector<size_t>* wanted) const {
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].use_cache) {
      if (auto hit = cache_->Lookup(refs[i].hash)) {
        if (hit->size() != refs[i].expected_len) {
          return WrongLength(refs[i].hash, hit->size(), refs[i].expected_len);
        }
        (*out)[i] = BytesOf(std::move(hit));
        continue;
      }
    }
    wanted->push_back(i);
  }
  return Status::Ok();
}

Status ChunkStore::LookUpLocations(const std::vector<ChunkRef>& refs,
                                   const std::vector<size_t>& wanted, const ChunkDomainKey* domain,
                                   std::vector<ChunkBytes>* out,
                                   std::vector<PackedChunk>* packed) const {
  std::vector<std::string> keys(wanted.size());
  std::vector<rocksdb::Slice> key_slices(wanted.size());
  for (size_t k = 0; k < wanted.size(); ++k) {
    keys[k] = ChunkSeqKey(refs[wanted[k]].seq);
    key_slices[k] = keys[k];
  }
  std::vector<rocksdb::PinnableSlice> values(wanted.size());
  std::vector<rocksdb::Status> statuses(wanted.size());
  rocksdb::ReadOptions r;
  r.verify_checksums = verify_ == ReadVerification::kNone;
  StoreDbRocks::db(*db_)->MultiGet(r, StoreDbRocks::chunks(*db_), wanted.size(), key_slices.data(),
                                   values.data(), statuses.data());

  for (size_t k = 0; k < wanted.size(); ++k) {
    const ChunkRef& ref = refs[wanted[k]];
    if (statuses[k].IsNotFound())
      return Status::Corruption("chunk " + ref.hash.Hex() + " is missing from the store");
    if (!statuses[k].ok()) return FromRocks(statuses[k], "reading chunk " + ref.hash.Hex());
    const std::string_view v(values[k].data(), values[k].size());
    if (!IsPackLocation(v)) {  // version 1: the record itself
      GPUCKPT_ASSIGN_OR_RETURN(
          std::shared_ptr<const std::string> decoded,
          DecodeChecked(ref.hash, ref.seq, ref.expected_len, v, domain, ref.use_cache));
      (*out)[wanted[k]] = BytesOf(std::move(decoded));
      continue;
    }
    auto location = DecodePackLocation(v);
    if (!location.ok()) {
      return Status::Corruption("chunk " + ref.hash.Hex() + ": " + location.status().message());
    }
    packed->push_back(PackedChunk{wanted[k], *location});
  }
  return Status::Ok();
}

size_t ChunkStore::EndOfRun(const std::vector<PackedChunk>& packed, size_t begin) {
  const PackLocation& first = packed[begin].location;
  uint64_t run_end = first.offset + first.length;
  size_t end = begin + 1;
  while (end < packed.size() && packed[end].location.pack == first.pack &&
         packed[end].location.offset >= run_end &&
         packed[end].location.offset - run_end <= kMaxGap &&
         packed[end].location.offset + packed[end].location.length - first.offset <= kMaxRun) {
    run_end = packed[end].location.offset + packed[end].location.length;
    ++end;
  }
  return end;
}

Status ChunkStore::ReadRun(const std::vector<ChunkRef>& refs, std::span<const PackedChunk> run,
                           const ChunkDomainKey* domain, bool read_ahead, RunBuffers* buffers,
                           std::vector<ChunkBytes>* out) const {
  const PackLocation& first = run.front().location;
  const uint64_t run_end = run.back().location.offset + run.back().location.length;
  const size_t run_bytes = static_cast<size_t>(run_end - first.offset);
  GPUCKPT_ASSIGN_OR_RETURN(RunBuffers::Room room, buffers->For(run_bytes, first.offset));
  if (read_ahead && first.offset / kReadAheadStep != run_end / kReadAheadStep) {
    // Crossed into the next step: have the disk read the steps after it
    // while we decode this one. Readers go forward through a file, and a
    // file's chunks lie forward in the pack.
    const uint64_t next_step = run_end / kReadAheadStep * kReadAheadStep + kReadAheadStep;
    db_->packs().ReadAheadLater(first.pack, next_step, kReadAhead);
  }
  const Status read =
      direct_reads_ ? db_->packs().ReadRangeDirect(first.pack, first.offset, run_bytes, room.data)
                    : db_->packs().ReadRange(first.pack, first.offset, run_bytes, room.data);
  if (!read.ok() && read.code() != StatusCode::kNotFound) return read;
  // Each chunk into its own (*out)[chunk.index]: safe on several threads.
  auto decode = [&](size_t i) -> Status {
    const PackedChunk& chunk = run[i];
    const ChunkRef& ref = refs[chunk.index];
    if (read.code() == StatusCode::kNotFound) {
      // gc moved these records after our lookup: one at a time, anew.
      GPUCKPT_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> again,
                               Read(ref.hash, ref.seq, ref.expected_len, domain, ref.use_cache));
      (*out)[chunk.index] = BytesOf(std::move(again));
      return Status::Ok();
    }
    const std::string_view record(room.data + (chunk.location.offset - first.offset),
                                  chunk.location.length);
    auto decoded = DecodeCheckedInPlace(ref, record, domain, room.owner);
    if (!decoded.ok() && decoded.status().code() == StatusCode::kCorruption && db_->read_only()) {
      // Perhaps punched out by the holder's gc: Read() looks again.
      GPUCKPT_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> again,
                               Read(ref.hash, ref.seq, ref.expected_len, domain, ref.use_cache));
      decoded = BytesOf(std::move(again));
    }
    GPUCKPT_ASSIGN_OR_RETURN((*out)[chunk.index], std::move(decoded));
    return Status::Ok();
  };
  if (run.size() >= 2 && run_bytes >= kParallelDecodeBytes)
    return DecodePool().RunAll(run.size(), decode);
  for (size_t i = 0; i < run.size(); ++i) GPUCKPT_RETURN_IF_ERROR(decode(i));
  return Status::Ok();
}

Status ChunkStore::LoadRecord(const ChunkHash& hash, uint64_t seq, std::string* storage) const {
  // Twice at most: gc may move the record to another pack between our
  // lookup and our read, and then removes the old pack.
  for (int attempt = 0;; ++attempt) {
    rocksdb::PinnableSlice value;
    rocksdb::ReadOptions r;
    // RocksDB's CRC of a version 1 blob is redundant when we check the
    // content ourselves; it is still checked when verification is off.
    r.verify_checksums = verify_ == ReadVerification::kNone;
    rocksdb::Status s =
        StoreDbRocks::db(*db_)->Get(r, StoreDbRocks::chunks(*db_), ChunkSeqKey(seq), &value);
    if (s.IsNotFound() && attempt > 0 && db_->read_only()) return CollectedWhileRead(hash);
    if (s.IsNotFound())
      return Status::Corruption("chunk " + hash.Hex() + " is missing from the store");
    if (!s.ok()) return FromRocks(s, "reading chunk " + hash.Hex());
    const std::string_view v(value.data(), value.size());
    if (!IsPackLocation(v)) {
      storage->assign(v);
      return Status::Ok();
    }
    auto location = DecodePackLocation(v);
    if (!location.ok()) {
      return Status::Corruption("chunk " + hash.Hex() + ": " + location.status().message());
    }
    Status read = db_->packs().Read(*location, storage);
    if (read.code() == StatusCode::kNotFound && attempt == 0) {
      // A reader beside the holder learns where its gc moved the record.
      GPUCKPT_RETURN_IF_ERROR(db_->CatchUp());
      continue;
    }
    if (read.code() == StatusCode::kNotFound) {
      return Status::Corruption("chunk " + hash.Hex() + ": " + read.message());
    }
    return read;
  }
}

Result<std::string> ChunkStore::RecordOf(std::string_view chunks_value) const {
  if (!IsPackLocation(chunks_value)) return std::string(chunks_value);
  GPUCKPT_ASSIGN_OR_RETURN(PackLocation location, DecodePackLocation(chunks_value));
  std::string record;
  GPUCKPT_RETURN_IF_ERROR(db_->packs().Read(location, &record));
  return record;
}

Result<ChunkStore::PackCompaction> ChunkStore::CompactPacks() {
  ChunkPacks& packs = db_->packs();
  PackCompaction report;
  // The deletions that made space must be durable before a pack goes:
  // otherwise a crash could bring back locations pointing into it.
  GPUCKPT_RETURN_IF_ERROR(db_->SyncWal());
  // Nothing appends to the old packs from here on: they can be judged whole.
  packs.Rotate();
  GPUCKPT_ASSIGN_OR_RETURN(auto files, packs.List());
  GPUCKPT_ASSIGN_OR_RETURN(LiveRecords live, LiveRecordsByPack(*db_));
  // First what needs no room: packs nothing points into go, and the garbage
  // between the live records of the others is punched out, so that gc gives
  // space back on a full disk too (a failed snapshot leaves its records in
  // the pack the live ones are in).
  GPUCKPT_ASSIGN_OR_RETURN(PackPlan plan, RemoveUnusedPacks(packs, files, live, &report));
  // Packs more than half garbage have their live records copied into a new
  // pack, which keeps a file's chunks together, where there is room for the
  // copies beside the reserve; else their garbage is punched out too.
  auto free = db_->FreeBytes();
  if (!plan.rewrite.empty() && (!free.ok() || *free < plan.rewrite_bytes + db_->reserve_bytes())) {
    plan.punch.insert(plan.punch.end(), plan.rewrite.begin(), plan.rewrite.end());
    plan.rewrite.clear();
  }
  if (!plan.rewrite.empty()) {
    GPUCKPT_RETURN_IF_ERROR(RewriteOrLeaveToPunch(files, plan.rewrite, &plan.punch, &report));
  }
  GPUCKPT_RETURN_IF_ERROR(PunchGarbage(packs, files, plan.punch, &live, &report));
  return report;
}

Status ChunkStore::RewriteOrLeaveToPunch(const std::vector<ChunkPacks::PackFile>& files,
                                         const std::vector<uint64_t>& rewrite,
                                         std::vector<uint64_t>* punch, PackCompaction* report) {
  auto moved = RewritePacks(rewrite);
  if (moved.ok()) {
    report->packs_rewritten = rewrite.size();
    report->packs_removed += rewrite.size();
    report->bytes_rewritten = *moved;
    for (uint64_t id : rewrite) {
      for (const auto& f : files) {
        if (f.id == id) report->bytes_freed += f.size;
      }
    }
  } else if (moved.status().code() == StatusCode::kNoSpace) {
    // The disk filled meanwhile; RewritePacks removed its copies.
    punch->insert(punch->end(), rewrite.begin(), rewrite.end());
  } else {
    return moved.status();
  }
  return Status::Ok();
}

Result<uint64_t> ChunkStore::RewritePacks(const std::vector<uint64_t>& ids) {
  ChunkPacks& packs = db_->packs();
  std::unordered_set<uint64_t> rewrite(ids.begin(), ids.end());
  std::set<uint64_t> copies;  // packs the copies went to
  uint64_t bytes = 0;
  auto copy = [&]() -> Status {
    // Copy the live records in key order (their order in the old packs,
    // give or take), then point their keys at the copies.
    rocksdb::WriteBatch batch;
    std::unique_ptr<rocksdb::Iterator> it(
        StoreDbRocks::db(*db_)->NewIterator(rocksdb::ReadOptions(), StoreDbRocks::chunks(*db_)));
    std::string record;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (!IsPackLocation(it->value().ToStringView())) continue;
      GPUCKPT_ASSIGN_OR_RETURN(PackLocation l, DecodePackLocation(it->value().ToStringView()));
      if (rewrite.count(l.pack) == 0) continue;
      GPUCKPT_RETURN_IF_ERROR(packs.Read(l, &record));
      auto moved = packs.Append(record);
      if (!moved.ok()) return OnStoreDisk(moved.status());
      copies.insert(moved->pack);
      bytes += record.size();
      auto s = batch.Put(StoreDbRocks::chunks(*db_), it->key(), EncodePackLocation(*moved));
      if (!s.ok()) return FromRocks(s, "batching chunk locations");
    }
    GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning chunk locations"));
    GPUCKPT_RETURN_IF_ERROR(OnStoreDisk(packs.Sync()));
    rocksdb::WriteOptions w;
    w.sync = true;
    return FromRocks(StoreDbRocks::db(*db_)->Write(w, &batch), "moving chunk locations");
  };
  Status copied = copy();
  packs.Rotate();
  if (!copied.ok()) {
    // No location points at the copies: they go, or they would fill the
    // disk that was too full for them.
    for (uint64_t id : copies) packs.Remove(id).PermitUnchecked();
    return copied;
  }
  for (uint64_t id : ids) GPUCKPT_RETURN_IF_ERROR(packs.Remove(id));
  return bytes;
}

Result<std::pair<ChunkHash, uint64_t>> ChunkStore::Check(
    std::string_view record, uint64_t seq, const std::vector<const ChunkDomainKey*>& domains) {
  std::string data;
  ChunkHash hash;
  GPUCKPT_RETURN_IF_ERROR(DecodeChunkRecord(record, "record " + std::to_string(seq), &data, &hash));
  const auto named_in = [&](const ChunkDomainKey* domain) {
    return HashChunk(reinterpret_cast<const uint8_t*>(data.data()), data.size(), domain) == hash;
  };
  if (!domains.empty() && std::none_of(domains.begin(), domains.end(), named_in)) {
    return Status::Corruption("chunk " + hash.Hex() + " does not match its hash");
  }
  return std::make_pair(hash, static_cast<uint64_t>(data.size()));
}

}  // namespace gpuckpt
