#include "core/snapshot/pool_link.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/base/log.h"
#include "core/base/mono_clock.h"
#include "core/catalog/extent_index.h"
#include "core/catalog/records.h"
#include "core/pool/pool_gc.h"
#include "core/snapshot/store_impl.h"
#include "core/store/chunk_store.h"

namespace gpuckpt {

namespace {

// Keys per omap operation: large enough that a lookup of a snapshot's
// chunks is few round trips, small enough to stay far below the OSD's
// message limits (64 KiB of keys).
constexpr size_t kKeysPerOmapOp = 2048;
// Pack and body objects in flight at once.
constexpr unsigned kObjectsInFlight = 4;
// Ranged reads in flight while fetching chunks, and how far apart two
// records of one pack object may lie to be fetched in one read.
constexpr unsigned kReadsInFlight = 8;
constexpr uint64_t kReadGapBytes = 64u << 10;
constexpr uint64_t kReadRunBytes = 8u << 20;
// After an operation timed out, listings skip the pool for this long
// rather than each waiting out the timeout again (writes still try).
constexpr std::chrono::seconds kUnreachableFor{10};
// Fetched chunk bytes held at once before they are stored here.
constexpr uint64_t kFetchBatchBytes = 64u << 20;

uint64_t RandomNonZero64() {
  std::random_device device;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(device()) << 32) | device();
  return v;
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "unknown";
  return host;
}

// Chunk names grouped by index shard, each group in omap operations of at
// most kKeysPerOmapOp keys.
std::map<unsigned, std::vector<ChunkHash>> ByShard(const std::vector<ChunkHash>& hashes) {
  std::map<unsigned, std::vector<ChunkHash>> out;
  for (const ChunkHash& h : hashes) out[pool::IndexShardOf(h)].push_back(h);
  return out;
}

// The index entries the pool holds for `hashes` (absent ones are missing).
Result<std::unordered_map<ChunkHash, pool::IndexEntry, ChunkHashHasher>> LookUpIndex(
    RadosPool* rados, const std::vector<ChunkHash>& hashes) {
  std::unordered_map<ChunkHash, pool::IndexEntry, ChunkHashHasher> found;
  for (const auto& [shard, names] : ByShard(hashes)) {
    for (size_t begin = 0; begin < names.size(); begin += kKeysPerOmapOp) {
      const size_t end = std::min(names.size(), begin + kKeysPerOmapOp);
      std::vector<std::string> keys;
      for (size_t i = begin; i < end; ++i) keys.push_back(pool::IndexKey(names[i]));
      GPUCKPT_ASSIGN_OR_RETURN(auto values, rados->OmapGet(pool::IndexObject(shard), keys));
      for (const auto& [key, value] : values) {
        GPUCKPT_ASSIGN_OR_RETURN(ChunkHash hash, pool::ChunkHashOfIndexKey(key));
        GPUCKPT_ASSIGN_OR_RETURN(pool::IndexEntry entry, pool::DecodeIndexEntry(value));
        found.emplace(hash, entry);
      }
    }
  }
  return found;
}

// One regular file's extents in offset order, checked to cover it whole.
Result<std::vector<Extent>> FileExtents(const SnapshotCatalog& catalog, uint64_t key,
                                        const FileEntry& file) {
  std::vector<Extent> out;
  ExtentIndex index(catalog, ExtentIndex::Scope::File(key, file.index, file.holes));
  index.SeekToFirst();
  for (;;) {
    GPUCKPT_ASSIGN_OR_RETURN(auto step, index.NextInOrder());
    if (!step) break;
    // The body leaves offsets out: a fetch places each extent after the
    // one before, or after the recorded hole that starts there.
    if (step->join != ExtentJoin::kContiguous && step->join != ExtentJoin::kAfterHole) {
      return Status::Corruption(
          fmt::format("the extents of '{}' do not cover it in order", file.path));
    }
    out.push_back(step->extent);
  }
  GPUCKPT_RETURN_IF_ERROR(index.status("reading the extents of '" + file.path + "'"));
  if (index.covered_to() != file.size || !index.crossed_every_hole()) {
    return Status::Corruption(fmt::format("the extents of '{}' cover {} of its {} bytes", file.path,
                                          index.covered_to(), file.size));
  }
  return out;
}

}  // namespace

// The chunks of one push that the pool lacks, packed into pack objects as
// they are read from the store, and indexed once every pack is written.
class PoolLink::Upload {
 public:
  Upload(PoolLink* link, ChunkStore* chunks)
      : link_(link), chunks_(chunks), batch_(link->rados_->NewBatch(kObjectsInFlight)) {}

  Status Add(const ChunkHash& hash, uint64_t seq, uint64_t raw_length) {
    GPUCKPT_ASSIGN_OR_RETURN(std::string record, chunks_->ReadRecord(hash, seq));
    if (pack_.empty()) pack_number_ = link_->next_pack_.fetch_add(1);
    pool::IndexEntry entry;
    entry.pack_writer = link_->writer_;
    entry.pack_number = pack_number_;
    entry.offset = pack_.size();
    entry.length = record.size();
    entry.raw_length = raw_length;
    entries_.emplace_back(hash, entry);
    pack_ += record;
    bytes_ += record.size();
    if (pack_.size() >= pool::kPackObjectBytes) WritePack();
    return Status::Ok();
  }

  // Writes the last pack, waits for all, then indexes every chunk: an
  // index entry never points into an object that is not durable.
  Status Finish() {
    if (!pack_.empty()) WritePack();
    GPUCKPT_RETURN_IF_ERROR(batch_->Wait());
    std::map<unsigned, std::vector<std::pair<std::string, std::string>>> shards;
    for (const auto& [hash, entry] : entries_) {
      shards[pool::IndexShardOf(hash)].emplace_back(pool::IndexKey(hash),
                                                    pool::EncodeIndexEntry(entry));
    }
    for (auto& [shard, values] : shards) {
      for (size_t begin = 0; begin < values.size(); begin += kKeysPerOmapOp) {
        const size_t end = std::min(values.size(), begin + kKeysPerOmapOp);
        std::vector<std::pair<std::string, std::string>> part(values.begin() + begin,
                                                              values.begin() + end);
        GPUCKPT_RETURN_IF_ERROR(link_->rados_->OmapSet(pool::IndexObject(shard), part));
      }
    }
    return Status::Ok();
  }

  uint64_t chunks() const { return entries_.size(); }
  uint64_t bytes() const { return bytes_; }

 private:
  void WritePack() {
    batch_->WriteFull(pool::PackObject(link_->writer_, pack_number_), std::move(pack_));
    pack_.clear();
  }

  PoolLink* link_;
  ChunkStore* chunks_;
  std::unique_ptr<RadosPool::Batch> batch_;
  std::string pack_;
  uint64_t pack_number_ = 0;
  uint64_t bytes_ = 0;
  std::vector<std::pair<ChunkHash, pool::IndexEntry>> entries_;
};

PoolLink::PoolLink(PoolOptions options, std::unique_ptr<RadosPool> rados, StoreDb* db)
    : options_(std::move(options)), rados_(std::move(rados)), db_(db), writer_(RandomNonZero64()) {}

PoolLink::~PoolLink() = default;

Result<std::unique_ptr<PoolLink>> PoolLink::Open(const PoolOptions& options, StoreDb* db,
                                                 bool store_has_snapshots, bool read_only) {
  PoolConnection connection;
  connection.pool = options.pool;
  connection.conf_file = options.ceph_conf;
  connection.client_id = options.ceph_id;
  connection.op_timeout = options.op_timeout;
  GPUCKPT_ASSIGN_OR_RETURN(auto rados, RadosPool::Connect(connection));
  // The pool's seed is every store's: chunk names in a dedup domain and
  // fingerprints then mean the same on every machine. The first store to
  // use the pool gives its own.
  if (!read_only) {
    pool::PoolMeta mine;
    mine.fingerprint_seed = db->fingerprint_seed();
    Status created = rados->CreateExclusive(pool::MetaObject(), pool::EncodePoolMeta(mine));
    if (!created.ok() && created.code() != StatusCode::kAlreadyExists) return created;
  }
  auto meta_data = rados->ReadWhole(pool::MetaObject(), 1 << 16);
  if (read_only && !meta_data.ok() && meta_data.status().code() == StatusCode::kNotFound) {
    // Nobody has used the pool yet: nothing to list.
    return std::unique_ptr<PoolLink>(new PoolLink(options, std::move(rados), db));
  }
  if (!meta_data.ok()) return meta_data.status();
  GPUCKPT_ASSIGN_OR_RETURN(pool::PoolMeta meta, pool::DecodePoolMeta(*meta_data));
  if (meta.fingerprint_seed != db->fingerprint_seed()) {
    if (store_has_snapshots || read_only) {
      return Status::InvalidArgument(fmt::format(
          "store {} holds snapshots made before it used pool {}, whose chunks are named with "
          "another secret: give the daemon a new, empty store directory for the pool",
          db->dir(), options.pool));
    }
    GPUCKPT_RETURN_IF_ERROR(db->ReplaceFingerprintSeed(meta.fingerprint_seed));
  }
  return std::unique_ptr<PoolLink>(new PoolLink(options, std::move(rados), db));
}

std::string PoolLink::ReservationText() const {
  return fmt::format("writer {:016x} host {}\n", writer_, HostName());
}

Status PoolLink::ReserveName(const std::string& id) {
  Status s = Observe(rados_->CreateExclusive(pool::NameObject(id), ReservationText()));
  if (s.code() == StatusCode::kAlreadyExists) {
    return Status::AlreadyExists(
        fmt::format("snapshot '{}' already exists in pool {}", id, options_.pool));
  }
  return Explain(s);
}

Status PoolLink::Explain(const Status& s) const {
  if (s.code() == StatusCode::kNoSpace) {
    return Status::NoSpace(
        fmt::format("pool {} is full (its quota or its OSDs): {}", options_.pool, s.message()));
  }
  if (s.code() == StatusCode::kTimedOut) {
    return Status::TimedOut(
        fmt::format("pool {} cannot be reached (no answer within {:.0f} s): {}", options_.pool,
                    std::chrono::duration<double>(options_.op_timeout).count(), s.message()));
  }
  return s;
}

Status PoolLink::Observe(Status s) {
  if (s.code() == StatusCode::kTimedOut) {
    const int64_t until = MonotonicNowNs() + std::chrono::nanoseconds(kUnreachableFor).count();
    if (unreachable_until_ns_.exchange(until) == 0) {
      spdlog::warn("pool pool={} result=unreachable error={}", LogValue(options_.pool),
                   LogValue(s.message()));
    }
  } else if (s.ok() && unreachable_until_ns_.exchange(0) != 0) {
    spdlog::info("pool pool={} result=reachable", LogValue(options_.pool));
    if (on_reachable_) on_reachable_();
  }
  return s;
}

bool PoolLink::KnownUnreachable() const {
  const int64_t until = unreachable_until_ns_.load();
  return until != 0 && MonotonicNowNs() < until;
}

void PoolLink::ReleaseName(const std::string& id) {
  // Only our own reservation: read, compare, remove. Nobody else writes a
  // reservation once it exists, so the two steps need no lock.
  auto held = rados_->ReadWhole(pool::NameObject(id), 4096);
  if (held.ok() && *held == ReservationText())
    rados_->Remove(pool::NameObject(id)).PermitUnchecked();
}

Result<uint64_t> PoolLink::Push(StoreImpl* store, const SnapshotInfo& info) {
  auto pushed = PushOnce(store, info);
  Observe(pushed.status()).PermitUnchecked();
  if (!pushed.ok()) return Explain(pushed.status());
  return pushed;
}

Result<uint64_t> PoolLink::PushOnce(StoreImpl* store, const SnapshotInfo& info) {
  GPUCKPT_ASSIGN_OR_RETURN(auto files, store->catalog().ReadFiles(info.key));
  // The body, and each distinct chunk once (with where it lies here).
  pool::BodyEncoder body;
  std::unordered_map<ChunkHash, std::pair<uint64_t, uint64_t>, ChunkHashHasher> chunks;
  std::vector<ChunkHash> order;  // first use: the order they lie in the packs
  for (auto& [index, file] : files) {
    std::vector<pool::BodyExtent> extents;
    if (file.type == FileType::kRegular) {
      GPUCKPT_ASSIGN_OR_RETURN(auto stored, FileExtents(store->catalog(), info.key, file));
      for (const Extent& e : stored) {
        extents.push_back({e.hash, e.length, e.fingerprint});
        if (chunks.emplace(e.hash, std::make_pair(e.seq, e.length)).second) order.push_back(e.hash);
      }
    }
    GPUCKPT_RETURN_IF_ERROR(body.AddFile(EncodeFileRecord(file), extents));
  }
  // Lookups older than half the collector's grace are done again before
  // publishing: a chunk found live then may have been marked since, and
  // swept by the time the snapshot is published.
  GPUCKPT_ASSIGN_OR_RETURN(const std::chrono::seconds grace, pool::WriterGrace(rados_.get()));
  auto looked_up = std::chrono::steady_clock::now();
  GPUCKPT_ASSIGN_OR_RETURN(ChunkTally tally, EnsureChunksInPool(store, order, chunks));
  GPUCKPT_ASSIGN_OR_RETURN(std::string encoded, body.Finish());
  const uint64_t incarnation = RandomNonZero64();
  GPUCKPT_RETURN_IF_ERROR(WriteBody(info.id, incarnation, encoded));

  pool::CatalogEntry entry;
  entry.incarnation = incarnation;
  entry.body_parts = static_cast<uint32_t>(
      std::max<uint64_t>(1, (encoded.size() + pool::kBodyPartBytes - 1) / pool::kBodyPartBytes));
  entry.body_bytes = encoded.size();
  entry.body_checksum = pool::BodyChecksum(encoded);
  SnapshotInfo published = info;
  published.key = 0;
  published.pool_incarnation = 0;
  published.pool_only = false;
  entry.snapshot_record = EncodeSnapshotRecord(published);
  if (std::chrono::steady_clock::now() - looked_up > grace / 2) {
    GPUCKPT_ASSIGN_OR_RETURN(ChunkTally again, EnsureChunksInPool(store, order, chunks));
    tally.uploaded_chunks += again.uploaded_chunks;
    tally.uploaded_bytes += again.uploaded_bytes;
  }
  // The catalog entry is the publication: the snapshot is in the pool from
  // this write on, whole. Only under a name still ours.
  GPUCKPT_RETURN_IF_ERROR(ConfirmReservation(info.id));
  GPUCKPT_RETURN_IF_ERROR(
      rados_->OmapSet(pool::CatalogObject(), {{info.id, pool::EncodeCatalogEntry(entry)}}));
  counters_.pushes++;
  counters_.uploaded_chunks += tally.uploaded_chunks;
  counters_.uploaded_bytes += tally.uploaded_bytes;
  counters_.reused_chunks += tally.reused_chunks;
  return incarnation;
}

Result<PoolLink::ChunkTally> PoolLink::EnsureChunksInPool(
    StoreImpl* store, const std::vector<ChunkHash>& order,
    const std::unordered_map<ChunkHash, std::pair<uint64_t, uint64_t>, ChunkHashHasher>& chunks) {
  GPUCKPT_ASSIGN_OR_RETURN(auto present, LookUpIndex(rados_.get(), order));
  Upload upload(this, &store->chunks());
  ChunkTally tally;
  for (const ChunkHash& hash : order) {
    auto it = present.find(hash);
    if (it != present.end() && it->second.condemned_by != 0) {
      // Condemned by a collection that found no snapshot naming it: taken
      // back by clearing the mark, unless the collector swept it meanwhile.
      pool::IndexEntry saved = it->second;
      saved.condemned_by = 0;
      Status s = rados_->OmapReplaceIfEqual(
          pool::IndexObject(pool::IndexShardOf(hash)), pool::IndexKey(hash),
          pool::EncodeIndexEntry(it->second), pool::EncodeIndexEntry(saved));
      if (s.code() == StatusCode::kAborted) {
        present.erase(it);
        it = present.end();
      } else if (!s.ok()) {
        return s;
      }
    }
    if (it != present.end()) {
      ++tally.reused_chunks;
      continue;
    }
    const auto& [seq, length] = chunks.at(hash);
    GPUCKPT_RETURN_IF_ERROR(upload.Add(hash, seq, length));
  }
  GPUCKPT_RETURN_IF_ERROR(upload.Finish());
  tally.uploaded_chunks = upload.chunks();
  tally.uploaded_bytes = upload.bytes();
  return tally;
}

Status PoolLink::ConfirmReservation(const std::string& id) {
  auto held = rados_->ReadWhole(pool::NameObject(id), 4096);
  if (held.ok() && *held == ReservationText()) return Status::Ok();
  // Swept by a collector while the snapshot waited longer than its grace
  // (a push retried for long): reserved again if nobody took it meanwhile.
  if (!held.ok() && held.status().code() == StatusCode::kNotFound) return ReserveName(id);
  if (!held.ok()) return held.status();
  return Status::AlreadyExists(fmt::format(
      "snapshot '{}' was reserved in pool {} by another store meanwhile", id, options_.pool));
}

Result<pool::CollectReport> PoolLink::Collect() {
  pool::CollectOptions options;
  options.grace = options_.gc_grace;
  return pool::Collect(rados_.get(), options);
}

Status PoolLink::WriteBody(const std::string& id, uint64_t incarnation, const std::string& body) {
  auto batch = rados_->NewBatch(kObjectsInFlight);
  uint32_t part = 0;
  for (uint64_t offset = 0; offset < body.size() || part == 0; offset += pool::kBodyPartBytes) {
    batch->WriteFull(pool::BodyObject(id, incarnation, part++),
                     body.substr(offset, pool::kBodyPartBytes));
  }
  return batch->Wait();
}

Result<std::string> PoolLink::ReadBody(const std::string& id, const pool::CatalogEntry& entry) {
  std::vector<std::string> parts(entry.body_parts);
  auto batch = rados_->NewBatch(kObjectsInFlight);
  for (uint32_t i = 0; i < entry.body_parts; ++i) {
    batch->Read(pool::BodyObject(id, entry.incarnation, i), 0, pool::kBodyPartBytes, &parts[i]);
  }
  GPUCKPT_RETURN_IF_ERROR(batch->Wait());
  std::string body;
  for (const std::string& p : parts) body += p;
  if (body.size() != entry.body_bytes || pool::BodyChecksum(body) != entry.body_checksum) {
    return Status::Corruption(
        fmt::format("the body of snapshot '{}' in pool {} does not match its catalog entry", id,
                    options_.pool));
  }
  return body;
}

Result<PoolLink::CatalogListing> PoolLink::Catalog() {
  if (KnownUnreachable()) {
    return Status::TimedOut(fmt::format("pool {} did not answer a moment ago", options_.pool));
  }
  auto catalog = ReadCatalog();
  Observe(catalog.status()).PermitUnchecked();
  return catalog;
}

Result<PoolLink::CatalogListing> PoolLink::ReadCatalog() {
  CatalogListing out;
  std::string after;
  for (;;) {
    constexpr unsigned kPage = 512;
    GPUCKPT_ASSIGN_OR_RETURN(auto page, rados_->OmapList(pool::CatalogObject(), after, kPage));
    for (auto& [id, value] : page) {
      // An entry that does not decode, or a name no snapshot may have, is
      // not listed: one bad entry must not hide the pool's others.
      if (!ValidateSnapshotName(id).ok()) continue;
      auto entry = pool::DecodeCatalogEntry(value);
      if (entry.ok()) {
        out.entries.emplace(id, std::move(*entry));
      } else {
        out.unreadable.insert(id);
      }
    }
    if (page.size() < kPage) break;
    after = page.back().first;
  }
  return out;
}

Result<std::optional<pool::CatalogEntry>> PoolLink::CatalogEntryOf(const std::string& id) {
  GPUCKPT_ASSIGN_OR_RETURN(auto values, rados_->OmapGet(pool::CatalogObject(), {id}));
  if (values.empty()) return std::optional<pool::CatalogEntry>();
  GPUCKPT_ASSIGN_OR_RETURN(pool::CatalogEntry entry, pool::DecodeCatalogEntry(values[0].second));
  return std::optional<pool::CatalogEntry>(std::move(entry));
}

Result<SnapshotInfo> PoolLink::InfoOf(const std::string& id, const pool::CatalogEntry& entry) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, DecodeSnapshotRecord(id, entry.snapshot_record));
  info.key = 0;
  info.pool_incarnation = entry.incarnation;
  info.pool_only = true;
  return info;
}

// The chunks of one pull that the store lacks: looked up in the pool's
// index, read in runs of neighbouring records, checked against their names
// and stored here.
class PoolLink::Fetch {
 public:
  Fetch(PoolLink* link, ChunkStore* chunks, const ChunkDomainKey* domain)
      : link_(link), chunks_(chunks), domain_(domain) {}

  // Fetches `wanted` and adds the sequence number each gets here to `*seqs`.
  Status FetchAll(const std::vector<ChunkHash>& wanted, ChunkSeqs* seqs) {
    GPUCKPT_ASSIGN_OR_RETURN(auto entries, LookUpIndex(link_->rados_.get(), wanted));
    std::vector<std::pair<ChunkHash, pool::IndexEntry>> located;
    for (const ChunkHash& hash : wanted) {
      auto it = entries.find(hash);
      if (it == entries.end()) {
        return Status::Corruption(
            fmt::format("chunk {} is missing from pool {}", hash.Hex(), link_->options_.pool));
      }
      located.emplace_back(hash, it->second);
    }
    // In the order they lie in the pool, so that neighbours share a read.
    std::sort(located.begin(), located.end(), [](const auto& a, const auto& b) {
      return std::tie(a.second.pack_writer, a.second.pack_number, a.second.offset) <
             std::tie(b.second.pack_writer, b.second.pack_number, b.second.offset);
    });
    size_t begin = 0;
    while (begin < located.size()) {
      uint64_t held = 0;
      size_t end = begin;
      while (end < located.size() && (end == begin || held < kFetchBatchBytes)) {
        held += located[end].second.length;
        ++end;
      }
      GPUCKPT_RETURN_IF_ERROR(FetchAndStore({located.data() + begin, end - begin}, seqs));
      begin = end;
    }
    return Status::Ok();
  }

 private:
  struct ReadRun {
    std::string oid;
    uint64_t offset = 0;
    uint64_t length = 0;
    size_t first = 0, last = 0;  // the chunks it holds: [first, last)
    std::string data;
  };

  static std::vector<ReadRun> Runs(std::span<const std::pair<ChunkHash, pool::IndexEntry>> chunks) {
    std::vector<ReadRun> runs;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const pool::IndexEntry& e = chunks[i].second;
      const std::string oid = pool::PackObject(e.pack_writer, e.pack_number);
      if (!runs.empty()) {
        ReadRun& r = runs.back();
        const uint64_t end = r.offset + r.length;
        if (r.oid == oid && e.offset >= end && e.offset - end <= kReadGapBytes &&
            e.offset + e.length - r.offset <= kReadRunBytes) {
          r.length = e.offset + e.length - r.offset;
          r.last = i + 1;
          continue;
        }
      }
      runs.push_back(ReadRun{oid, e.offset, e.length, i, i + 1, {}});
    }
    return runs;
  }

  Status FetchAndStore(std::span<const std::pair<ChunkHash, pool::IndexEntry>> chunks,
                       ChunkSeqs* seqs) {
    std::vector<ReadRun> runs = Runs(chunks);
    auto batch = link_->rados_->NewBatch(kReadsInFlight);
    for (ReadRun& r : runs) batch->Read(r.oid, r.offset, r.length, &r.data);
    GPUCKPT_RETURN_IF_ERROR(batch->Wait());
    for (const ReadRun& r : runs) {
      for (size_t i = r.first; i < r.last; ++i) {
        const auto& [hash, entry] = chunks[i];
        const uint64_t at = entry.offset - r.offset;
        if (at + entry.length > r.data.size()) {
          return Status::Corruption(
              fmt::format("chunk {} lies past the end of pool object {}", hash.Hex(), r.oid));
        }
        GPUCKPT_ASSIGN_OR_RETURN(uint64_t seq,
                                 Store(hash, std::string_view(r.data).substr(at, entry.length)));
        (*seqs)[hash] = seq;
      }
    }
    return Status::Ok();
  }

  // Checks a fetched record (checksum, and its name in the snapshot's
  // domain: the pool is not trusted to hand back what was asked for) and
  // stores it here.
  Result<uint64_t> Store(const ChunkHash& hash, std::string_view record) {
    auto checked = ChunkStore::Check(record, 0, {domain_});
    if (!checked.ok()) {
      return Status::Corruption(fmt::format("chunk {} fetched from pool {} is damaged: {}",
                                            hash.Hex(), link_->options_.pool,
                                            checked.status().message()));
    }
    if (checked->first != hash) {
      return Status::Corruption(fmt::format("pool {} returned chunk {} for chunk {}",
                                            link_->options_.pool, checked->first.Hex(),
                                            hash.Hex()));
    }
    GPUCKPT_ASSIGN_OR_RETURN(auto put, chunks_->PutRecord(hash, record, checked->second));
    if (put.added) {
      link_->counters_.fetched_chunks++;
      link_->counters_.fetched_bytes += record.size();
    }
    return put.seq;
  }

  PoolLink* link_;
  ChunkStore* chunks_;
  const ChunkDomainKey* domain_;
};

Result<SnapshotInfo> PoolLink::Pull(StoreImpl* store, const std::string& id,
                                    const pool::CatalogEntry& entry, uint64_t key) {
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, InfoOf(id, entry));
  GPUCKPT_ASSIGN_OR_RETURN(std::string encoded, ReadBody(id, entry));
  GPUCKPT_ASSIGN_OR_RETURN(auto files, pool::DecodeBody(encoded, "'" + id + "'"));
  const std::optional<ChunkDomainKey> domain = db_->domain_key(info.dedup_domain);
  GPUCKPT_ASSIGN_OR_RETURN(auto seqs, StoreChunksOf(store, files, domain ? &*domain : nullptr));
  GPUCKPT_RETURN_IF_ERROR(WriteFetchedRecords(&store->catalog(), id, files, seqs, key));
  GPUCKPT_RETURN_IF_ERROR(store->catalog().MakeIndexDurable());
  counters_.pulls++;
  info.key = key;
  info.pool_only = false;
  return info;
}

Result<PoolLink::ChunkSeqs> PoolLink::StoreChunksOf(StoreImpl* store,
                                                    const std::vector<pool::BodyFile>& files,
                                                    const ChunkDomainKey* domain) {
  // Which chunks this store has, and which must be fetched.
  ChunkSeqs seqs;
  std::vector<ChunkHash> wanted;
  for (const pool::BodyFile& f : files) {
    for (const pool::BodyExtent& e : f.extents) {
      if (seqs.count(e.hash) != 0) continue;
      GPUCKPT_ASSIGN_OR_RETURN(auto meta, store->chunks().Lookup(e.hash));
      if (meta) {
        seqs.emplace(e.hash, meta->seq);
      } else if (seqs.emplace(e.hash, 0).second) {
        wanted.push_back(e.hash);
      }
    }
  }
  Fetch fetch(this, &store->chunks(), domain);
  GPUCKPT_RETURN_IF_ERROR(fetch.FetchAll(wanted, &seqs));
  return seqs;
}

Status PoolLink::WriteFetchedRecords(SnapshotCatalog* catalog, const std::string& id,
                                     const std::vector<pool::BodyFile>& files,
                                     const ChunkSeqs& seqs, uint64_t key) {
  // The records, as a writer of this store would have written them.
  // Made durable by the caller's MakeIndexDurable(), before publication.
  StoreBatch batch;
  for (size_t i = 0; i < files.size(); ++i) {
    const uint32_t index = static_cast<uint32_t>(i);
    GPUCKPT_ASSIGN_OR_RETURN(FileEntry file, DecodeFileRecord(files[i].file_record));
    GPUCKPT_RETURN_IF_ERROR(ValidateEntryPath(file.path));
    GPUCKPT_RETURN_IF_ERROR(catalog->AddFile(&batch, key, index, files[i].file_record));
    // Each extent follows the one before, or the recorded hole that starts
    // where that one ends (FORMAT.md, "The shared pool"); a hole no extent
    // steps over (but a last one) is not between extents.
    uint64_t offset = 0;
    size_t holes_crossed = 0;
    const auto past_hole = [&] {
      if (file.holes.size() > holes_crossed && file.holes[holes_crossed].offset == offset)
        offset = file.holes[holes_crossed++].end();
    };
    for (const pool::BodyExtent& e : files[i].extents) {
      past_hole();
      GPUCKPT_RETURN_IF_ERROR(
          catalog->AddExtent(&batch, key, index, offset,
                             EncodeExtentRecord(e.hash, seqs.at(e.hash), e.length, e.fingerprint)));
      offset += e.length;
    }
    past_hole();
    // A regular file's extents cover it exactly; anything else has none.
    if (holes_crossed != file.holes.size() ||
        (file.type == FileType::kRegular ? offset != file.size : offset != 0)) {
      return Status::Corruption(fmt::format(
          "snapshot '{}' in pool {}: the extents of '{}' cover {} bytes of its {}", id,
          options_.pool, file.path, offset, file.type == FileType::kRegular ? file.size : 0));
    }
    if (batch.bytes() > (4u << 20)) {
      GPUCKPT_RETURN_IF_ERROR(catalog->WriteIndex(&batch, "writing fetched records"));
    }
  }
  return catalog->WriteIndex(&batch, "writing fetched records");
}

Status PoolLink::Remove(const std::string& id, uint64_t incarnation) {
  GPUCKPT_ASSIGN_OR_RETURN(auto values, rados_->OmapGet(pool::CatalogObject(), {id}));
  if (!values.empty()) {
    GPUCKPT_ASSIGN_OR_RETURN(pool::CatalogEntry entry, pool::DecodeCatalogEntry(values[0].second));
    if (entry.incarnation != incarnation) return Status::Ok();
    Status s = rados_->OmapRemoveIfEqual(pool::CatalogObject(), id, values[0].second);
    if (s.code() == StatusCode::kAborted) return Status::Ok();  // replaced meanwhile
    GPUCKPT_RETURN_IF_ERROR(s);
    for (uint32_t part = 0; part < entry.body_parts; ++part) {
      Status r = rados_->Remove(pool::BodyObject(id, incarnation, part));
      if (!r.ok() && r.code() != StatusCode::kNotFound) return r;
    }
  }
  Status r = rados_->Remove(pool::NameObject(id));
  if (!r.ok() && r.code() != StatusCode::kNotFound) return r;
  return Status::Ok();
}

PoolStats PoolLink::stats() const {
  PoolStats s;
  s.pool = options_.pool;
  s.background = options_.background;
  s.pushes = counters_.pushes;
  s.push_failures = counters_.push_failures;
  s.pulls = counters_.pulls;
  s.pull_failures = counters_.pull_failures;
  s.uploaded_chunks = counters_.uploaded_chunks;
  s.uploaded_bytes = counters_.uploaded_bytes;
  s.reused_chunks = counters_.reused_chunks;
  s.fetched_chunks = counters_.fetched_chunks;
  s.fetched_bytes = counters_.fetched_bytes;
  s.pending = pending_;
  MutexLock lock(&error_mu_);
  s.last_error = last_error_;
  return s;
}

void PoolLink::CountPushFailure(const Status& error) {
  counters_.push_failures++;
  MutexLock lock(&error_mu_);
  last_error_ = "push: " + error.message();
}

void PoolLink::CountPullFailure(const Status& error) {
  counters_.pull_failures++;
  MutexLock lock(&error_mu_);
  last_error_ = "pull: " + error.message();
}

}  // namespace gpuckpt
