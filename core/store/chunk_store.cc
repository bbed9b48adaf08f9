#include "core/store/chunk_store.h"

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include "core/store/keys.h"

namespace gpuckpt {
namespace {

rocksdb::Slice HashSlice(const ChunkHash& hash) {
  return rocksdb::Slice(hash.view().data(), hash.view().size());
}

}  // namespace

std::string ChunkSeqKey(uint64_t seq) {
  std::string k;
  keys::PutBigEndian(&k, seq, 8);
  return k;
}

Result<std::unique_ptr<ChunkStore>> ChunkStore::Open(StoreDb* db, ChunkCache* cache,
                                                     ReadVerification verify) {
  // Every chunk a published snapshot names was flushed before it was
  // published, so the last key on disk is at least the highest sequence
  // anyone refers to. Numbers of chunks lost in a crash may be handed out
  // again: nothing durable names them.
  std::unique_ptr<rocksdb::Iterator> it(
      db->db()->NewIterator(rocksdb::ReadOptions(), db->chunks()));
  it->SeekToLast();
  uint64_t next = 1;
  if (it->Valid()) {
    if (it->key().size() != 8) return Status::Corruption("malformed chunk key");
    next = keys::GetBigEndian(it->key().ToStringView(), 8) + 1;
  }
  GPUCKPT_RETURN_IF_ERROR(FromRocks(it->status(), "reading the last chunk"));
  return std::unique_ptr<ChunkStore>(new ChunkStore(db, cache, verify, next));
}

void ChunkStore::Claim(const ChunkHash& hash) {
  std::unique_lock lock(claims_mu_);
  claims_cv_.wait(lock, [&] { return claims_.count(hash) == 0; });
  claims_.insert(hash);
}

void ChunkStore::Release(const ChunkHash& hash) {
  {
    std::lock_guard lock(claims_mu_);
    claims_.erase(hash);
  }
  claims_cv_.notify_all();
}

Result<std::optional<ChunkMeta>> ChunkStore::Lookup(const ChunkHash& hash) const {
  std::string value;
  rocksdb::Status s =
      db_->db()->Get(rocksdb::ReadOptions(), db_->chunk_meta(), HashSlice(hash), &value);
  if (s.IsNotFound()) return std::optional<ChunkMeta>();
  if (!s.ok()) return FromRocks(s, "looking up chunk " + hash.Hex());
  GPUCKPT_ASSIGN_OR_RETURN(ChunkMeta meta, DecodeChunkMeta(value));
  return std::optional<ChunkMeta>(meta);
}

Result<ChunkStore::PutResult> ChunkStore::Put(const ChunkHash& hash, const uint8_t* data,
                                              size_t len, int zstd_level) {
  Claim(hash);
  struct Unclaim {
    ChunkStore* self;
    const ChunkHash& hash;
    ~Unclaim() { self->Release(hash); }
  } unclaim{this, hash};

  GPUCKPT_ASSIGN_OR_RETURN(auto existing, Lookup(hash));
  if (existing) return PutResult{existing->seq, false, 0};

  const uint64_t seq = next_seq_.fetch_add(1);
  std::string record;
  EncodeChunkRecord(data, len, hash, zstd_level, &record);
  rocksdb::WriteBatch batch;
  auto s = batch.Put(db_->chunks(), ChunkSeqKey(seq), record);
  if (s.ok()) {
    s = batch.Put(db_->chunk_meta(), HashSlice(hash),
                  EncodeChunkMeta(ChunkMeta{seq, len, record.size()}));
  }
  if (!s.ok()) return FromRocks(s, "batching chunk " + hash.Hex());
  rocksdb::WriteOptions w;
  // Bulk data skips the WAL (it would write every byte twice); the
  // snapshot's flush before publishing makes it durable.
  w.disableWAL = true;
  GPUCKPT_RETURN_IF_ERROR(FromRocks(db_->db()->Write(w, &batch), "writing chunk " + hash.Hex()));
  return PutResult{seq, true, record.size()};
}

Result<std::shared_ptr<const std::string>> ChunkStore::Read(const ChunkHash& hash, uint64_t seq,
                                                            uint64_t expected_len,
                                                            bool use_cache) const {
  auto wrong_length = [&](uint64_t got) {
    return Status::Corruption("chunk " + hash.Hex() + " is " + std::to_string(got) +
                              " bytes, its extent says " + std::to_string(expected_len));
  };
  if (use_cache) {
    if (auto hit = cache_->Lookup(hash)) {
      if (hit->size() != expected_len) return wrong_length(hit->size());
      return hit;
    }
  }
  rocksdb::PinnableSlice record;
  rocksdb::ReadOptions r;
  // RocksDB's CRC of the blob is redundant when we check the content
  // ourselves; it is still checked when verification is off.
  r.verify_checksums = verify_ == ReadVerification::kNone;
  rocksdb::Status s = db_->db()->Get(r, db_->chunks(), ChunkSeqKey(seq), &record);
  if (s.IsNotFound())
    return Status::Corruption("chunk " + hash.Hex() + " is missing from the store");
  if (!s.ok()) return FromRocks(s, "reading chunk " + hash.Hex());
  auto data = std::make_shared<std::string>();
  ChunkHash stored_hash;
  GPUCKPT_RETURN_IF_ERROR(DecodeChunkRecord(std::string_view(record.data(), record.size()),
                                            hash.Hex(), data.get(), &stored_hash,
                                            verify_ != ReadVerification::kNone));
  if (stored_hash != hash) {
    return Status::Corruption("chunk record " + std::to_string(seq) + " holds " +
                              stored_hash.Hex() + ", expected " + hash.Hex());
  }
  if (data->size() != expected_len) return wrong_length(data->size());
  if (verify_ == ReadVerification::kFullHash && HashChunk(reinterpret_cast<const uint8_t*>(data->data()), data->size()) != hash) {
    return Status::Corruption("chunk " + hash.Hex() + " does not match its hash (damaged store)");
  }
  if (use_cache) cache_->Insert(hash, data);
  return std::shared_ptr<const std::string>(std::move(data));
}

Result<std::pair<ChunkHash, uint64_t>> ChunkStore::Check(std::string_view record, uint64_t seq) {
  std::string data;
  ChunkHash hash;
  GPUCKPT_RETURN_IF_ERROR(DecodeChunkRecord(record, "record " + std::to_string(seq), &data, &hash));
  if (HashChunk(reinterpret_cast<const uint8_t*>(data.data()), data.size()) != hash) {
    return Status::Corruption("chunk " + hash.Hex() + " does not match its hash");
  }
  return std::make_pair(hash, static_cast<uint64_t>(data.size()));
}

}  // namespace gpuckpt
