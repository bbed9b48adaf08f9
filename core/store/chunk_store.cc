#include "core/store/chunk_store.h"

#include <rocksdb/db.h>

#include "core/store/chunk_codec.h"

namespace gpuckpt {

Result<bool> ChunkStore::Contains(const ChunkHash& hash) const {
  // The meta record is written in the same batch as the chunk and is tiny:
  // looking it up never touches chunk data.
  std::string value;
  rocksdb::Status s = db_->db()->Get(rocksdb::ReadOptions(), db_->chunk_meta(),
                                     rocksdb::Slice(hash.view().data(), hash.view().size()), &value);
  if (s.IsNotFound()) return false;
  if (!s.ok()) return FromRocks(s, "looking up chunk " + hash.Hex());
  return true;
}

Result<std::shared_ptr<const std::string>> ChunkStore::Read(const ChunkHash& hash,
                                                            uint64_t expected_len) const {
  if (auto hit = cache_->Lookup(hash)) {
    if (hit->size() != expected_len) {
      return Status::Corruption("chunk " + hash.Hex() + " is " + std::to_string(hit->size()) +
                                " bytes, its extent says " + std::to_string(expected_len));
    }
    return hit;
  }
  rocksdb::PinnableSlice record;
  rocksdb::Status s = db_->db()->Get(rocksdb::ReadOptions(), db_->chunks(),
                                     rocksdb::Slice(hash.view().data(), hash.view().size()), &record);
  if (s.IsNotFound()) return Status::Corruption("chunk " + hash.Hex() + " is missing from the store");
  if (!s.ok()) return FromRocks(s, "reading chunk " + hash.Hex());
  auto data = std::make_shared<std::string>();
  GPUCKPT_RETURN_IF_ERROR(
      DecodeChunkRecord(std::string_view(record.data(), record.size()), hash.Hex(), data.get()));
  if (data->size() != expected_len) {
    return Status::Corruption("chunk " + hash.Hex() + " is " + std::to_string(data->size()) +
                              " bytes, its extent says " + std::to_string(expected_len));
  }
  if (verify_ && HashChunk(reinterpret_cast<const uint8_t*>(data->data()), data->size()) != hash) {
    return Status::Corruption("chunk " + hash.Hex() + " does not match its hash (damaged store)");
  }
  cache_->Insert(hash, data);
  return std::shared_ptr<const std::string>(std::move(data));
}

Result<uint64_t> ChunkStore::Check(const ChunkHash& hash, std::string_view record) {
  std::string data;
  GPUCKPT_RETURN_IF_ERROR(DecodeChunkRecord(record, hash.Hex(), &data));
  if (HashChunk(reinterpret_cast<const uint8_t*>(data.data()), data.size()) != hash) {
    return Status::Corruption("chunk " + hash.Hex() + " does not match its hash");
  }
  return static_cast<uint64_t>(data.size());
}

}  // namespace gpuckpt
