// PoolLink (pool_link.h): connecting, names, the catalog, bodies, removal,
// collection and counters. Push() is in pool_upload.cc, Pull() in
// pool_fetch.cc.
#include "core/pooled/pool_link.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "core/base/log.h"
#include "core/base/mono_clock.h"
#include "core/pool/pool_gc.h"

namespace gpuckpt {

namespace {

// After an operation timed out, listings skip the pool for this long
// rather than each waiting out the timeout again (writes still try).
constexpr std::chrono::seconds kUnreachableFor{10};

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

}  // namespace

uint64_t PoolLink::RandomNonZero64() {
  std::random_device device;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(device()) << 32) | device();
  return v;
}

// The index entries the pool holds for `hashes` (absent ones are missing).
Result<PoolLink::IndexEntries> PoolLink::LookUpIndex(const std::vector<ChunkHash>& hashes) {
  IndexEntries found;
  for (const auto& [shard, names] : ByShard(hashes)) {
    for (size_t begin = 0; begin < names.size(); begin += kKeysPerOmapOp) {
      const size_t end = std::min(names.size(), begin + kKeysPerOmapOp);
      std::vector<std::string> keys;
      for (size_t i = begin; i < end; ++i) keys.push_back(pool::IndexKey(names[i]));
      GPUCKPT_ASSIGN_OR_RETURN(auto values, rados_->OmapGet(pool::IndexObject(shard), keys));
      for (const auto& [key, value] : values) {
        GPUCKPT_ASSIGN_OR_RETURN(ChunkHash hash, pool::ChunkHashOfIndexKey(key));
        GPUCKPT_ASSIGN_OR_RETURN(pool::IndexEntry entry, pool::DecodeIndexEntry(value));
        found.emplace(hash, entry);
      }
    }
  }
  return found;
}

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
