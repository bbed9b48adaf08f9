// PoolLink::Pull(): a snapshot of the pool into the local store: the
// chunks it lacks, read from the pool's pack objects in ranged reads, then
// the snapshot's file and extent records.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/catalog/records.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/pooled/pool_link.h"
#include "core/snapshot/local_store.h"
#include "core/store/chunk_store.h"

namespace gpuckpt {

namespace {

// Ranged reads in flight while fetching chunks, and how far apart two
// records of one pack object may lie to be fetched in one read.
constexpr unsigned kReadsInFlight = 8;
constexpr uint64_t kReadGapBytes = 64u << 10;
constexpr uint64_t kReadRunBytes = 8u << 20;
// Fetched chunk bytes held at once before they are stored here.
constexpr uint64_t kFetchBatchBytes = 64u << 20;

}  // namespace

// The chunks of one pull that the store lacks: looked up in the pool's
// index, read in runs of neighbouring records, checked against their names
// and stored here.
class PoolLink::Fetch {
 public:
  Fetch(PoolLink* link, ChunkStore* chunks, const ChunkDomainKey* domain)
      : link_(link), chunks_(chunks), domain_(domain) {}

  // Fetches `wanted` and adds the sequence number each gets here to `*seqs`.
  Status FetchAll(const std::vector<ChunkHash>& wanted, ChunkSeqs* seqs) {
    GPUCKPT_ASSIGN_OR_RETURN(auto entries, link_->LookUpIndex(wanted));
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

Result<SnapshotInfo> PoolLink::Pull(LocalStore* store, const std::string& id,
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

Result<PoolLink::ChunkSeqs> PoolLink::StoreChunksOf(LocalStore* store,
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

}  // namespace gpuckpt
