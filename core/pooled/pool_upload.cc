// PoolLink::Push(): a snapshot of the local store into the pool: the
// chunks the pool lacks in pack objects, then their index entries, then
// the snapshot's body, then its catalog entry.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>
#include <vector>

#include "core/catalog/extent_index.h"
#include "core/catalog/records.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/pooled/pool_link.h"
#include "core/snapshot/local_store.h"
#include "core/store/chunk_store.h"

namespace gpuckpt {

namespace {

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

Result<uint64_t> PoolLink::Push(LocalStore* store, const SnapshotInfo& info) {
  auto pushed = PushOnce(store, info);
  Observe(pushed.status()).PermitUnchecked();
  if (!pushed.ok()) return Explain(pushed.status());
  return pushed;
}

Result<uint64_t> PoolLink::PushOnce(LocalStore* store, const SnapshotInfo& info) {
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
    LocalStore* store, const std::vector<ChunkHash>& order,
    const std::unordered_map<ChunkHash, std::pair<uint64_t, uint64_t>, ChunkHashHasher>& chunks) {
  GPUCKPT_ASSIGN_OR_RETURN(auto present, LookUpIndex(order));
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

}  // namespace gpuckpt
