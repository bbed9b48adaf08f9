// Store::Fsck's pass over the database (StoreImpl::FsckOnce): the chunk
// meta records, the dedup domain of each chunk, every chunk record
// re-hashed, the meta records against the chunks, and every file's extents
// against the chunks. Problems are collected in the report, not returned:
// fsck names everything it finds.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/catalog/extent_index.h"
#include "core/catalog/records.h"
#include "core/snapshot/store_impl.h"
#include "core/store/chunk_codec.h"
#include "core/store/chunk_packs.h"
#include "core/store/format.h"

namespace gpuckpt {
namespace {

// Every chunk is named by its meta record (hash -> seq): a damaged record
// is reported under that name, the one its extents use, not under
// whatever its damaged bytes say.
struct ChunkMetas {
  std::unordered_map<uint64_t, ChunkHash> names;  // seq -> hash
  std::vector<std::pair<ChunkHash, ChunkMeta>> records;
};

// Fsck reads every table as of one DbView (a RocksDB snapshot): a
// writer committing or the settler settling meanwhile (they hold off gc,
// not fsck) would otherwise show fsck file records whose chunks its
// earlier pass over the chunk records did not see. A read-only secondary's
// view moves only when it catches up (Fsck() does that between passes): it
// reads as it is. Every pass is one over records nobody reads again soon.
ChunkStore::Scan FsckScan(const DbView& view) {
  return ChunkStore::Scan{.view = &view, .fill_cache = false};
}

ChunkMetas ReadChunkMetas(const ChunkStore& chunk_store, const DbView& view, FsckReport* report) {
  ChunkMetas metas;
  Status scanned = chunk_store.ForEachChunk(
      FsckScan(view), [&](const Result<ChunkHash>& hash, const Result<ChunkMeta>& meta) {
        if (!hash.ok() || !meta.ok()) {
          report->problems.push_back("malformed chunk meta record");
          return Status::Ok();
        }
        metas.names.emplace(meta->seq, hash.value());
        metas.records.emplace_back(hash.value(), meta.value());
        return Status::Ok();
      });
  if (!scanned.ok()) report->problems.push_back(scanned.message());
  return metas;
}

// The dedup domain of each chunk, from the snapshots whose extents name
// it: its name is re-hashed with that domain's key. A chunk no snapshot
// names (garbage that gc has not collected yet, or a chunk of an import
// still running) has a domain nobody can tell any more, perhaps of an
// owner whose snapshots are all gone: only its checksum is checked (which
// catches accidental damage as well), never reported for its name.
class ChunkDomains {
 public:
  void Learn(const StoreDb& db, const SnapshotCatalog& catalog, const DbView& view,
             const std::vector<SnapshotInfo>& snapshots, FsckReport* report) {
    std::map<std::optional<uint32_t>, uint32_t> slots;  // domain -> slot
    for (const auto& snap : snapshots) {
      auto [slot, added] = slots.try_emplace(snap.dedup_domain, keys_.size());
      if (added) keys_.push_back(db.domain_key(snap.dedup_domain));
      LearnFrom(catalog, view, snap, slot->second, report);
    }
  }

  // The keys chunk `seq`'s name may be made with; empty when no snapshot
  // names it.
  std::vector<const ChunkDomainKey*> Of(uint64_t seq) const {
    std::vector<const ChunkDomainKey*> domains;
    const auto add_domain = [&](uint32_t slot) {
      domains.push_back(keys_[slot] ? &*keys_[slot] : nullptr);
    };
    if (auto d = first_.find(seq); d != first_.end()) {
      add_domain(d->second);
      if (auto more = more_.find(seq); more != more_.end()) {
        for (uint32_t slot : more->second) add_domain(slot);
      }
    }
    return domains;
  }

 private:
  void LearnFrom(const SnapshotCatalog& catalog, const DbView& view, const SnapshotInfo& snap,
                 uint32_t slot, FsckReport* report) {
    ExtentIndex extents(catalog, ExtentIndex::Scope::Snapshot(snap.key),
                        ExtentIndex::ReadOptions{.view = &view, .fill_cache = false});
    for (extents.SeekToFirst(); extents.Valid(); extents.Next()) {
      auto e = extents.Decode();
      if (!e.ok()) continue;  // reported by CheckFileExtents()
      auto [found, first] = first_.try_emplace(e->seq, slot);
      if (!first && found->second != slot) {
        auto& more = more_[e->seq];
        if (std::find(more.begin(), more.end(), slot) == more.end()) more.push_back(slot);
      }
    }
    if (Status s = extents.status("reading its extents"); !s.ok()) {
      report->problems.push_back("snapshot '" + snap.id + "': " + s.message());
    }
  }

  std::vector<std::optional<ChunkDomainKey>> keys_;  // by slot
  std::unordered_map<uint64_t, uint32_t> first_;     // seq -> slot
  // Further domains of a chunk named in more than one: only a damaged index
  // (or a SHA-256 collision) can do that; any of them makes its name good.
  std::unordered_map<uint64_t, std::vector<uint32_t>> more_;
};

// The chunk records as fsck found them, by sequence number.
struct CheckedChunks {
  std::unordered_map<uint64_t, std::pair<ChunkHash, uint64_t>> good;  // seq -> hash, length
  std::unordered_set<uint64_t> bad;
};

// Where a damaged chunk's record lies, for its line in the report.
std::string WhereChunkLies(uint64_t seq, std::string_view value) {
  std::string where = "record " + std::to_string(seq);
  if (IsPackLocation(value)) {
    if (auto l = DecodePackLocation(value); l.ok()) {
      char pack[32];
      std::snprintf(pack, sizeof(pack), "%016llx", static_cast<unsigned long long>(l->pack));
      where += ", " + std::to_string(l->length) + " bytes at offset " + std::to_string(l->offset) +
               " of " + format::kPacksDirName + "/" + pack + ".pack";
    }
  } else {
    where += ", kept in the chunks family (version 1)";
  }
  return where;
}

// One chunk record of CheckChunkRecords(), the one stored under `seq`
// (`value`: where it lies), into `chunks`.
void CheckChunkRecord(const ChunkStore& chunk_store, uint64_t seq, std::string_view value,
                      const ChunkMetas& metas, const ChunkDomains& domains, CheckedChunks* chunks,
                      FsckReport* report) {
  Status damage;
  auto record = chunk_store.RecordOf(value);
  if (!record.ok()) {
    damage = record.status();
  } else {
    auto checked = ChunkStore::Check(*record, seq, domains.Of(seq));
    if (checked.ok()) {
      chunks->good[seq] = *checked;
      return;
    }
    damage = checked.status();
  }
  chunks->bad.insert(seq);
  ++report->damaged_chunks;
  auto name = metas.names.find(seq);
  report->problems.push_back(
      "damaged chunk " +
      (name != metas.names.end() ? name->second.Hex() : std::string("(unnamed)")) + " (" +
      WhereChunkLies(seq, value) + "): " + damage.message());
}

// Every chunk record: decodes, and its bytes hash to the name it carries.
// A damaged chunk is one line, however many extents name it; the files
// that use it are named by CheckFileExtents(), once each.
CheckedChunks CheckChunkRecords(const DbView& view, const ChunkStore& chunk_store,
                                const ChunkMetas& metas, const ChunkDomains& domains,
                                FsckReport* report) {
  CheckedChunks chunks;
  Status scanned = chunk_store.ForEachRecord(
      FsckScan(view), [&](const Result<uint64_t>& seq, std::string_view value) {
        ++report->chunks_checked;
        if (!seq.ok()) {
          report->problems.push_back(seq.status().message());
        } else {
          CheckChunkRecord(chunk_store, seq.value(), value, metas, domains, &chunks, report);
        }
        return Status::Ok();
      });
  if (!scanned.ok()) report->problems.push_back(scanned.message());
  return chunks;
}

// Meta records: each names an existing chunk with its length; every chunk
// has one. A meta record without its chunk would make imports skip data
// they need.
void CheckMetaRecords(const ChunkMetas& metas, const CheckedChunks& chunks, FsckReport* report) {
  std::unordered_set<uint64_t> with_meta;
  for (const auto& [hash, meta] : metas.records) {
    with_meta.insert(meta.seq);
    auto found = chunks.good.find(meta.seq);
    if (found == chunks.good.end()) {
      if (chunks.bad.count(meta.seq) == 0) {
        report->problems.push_back("chunk " + hash.Hex() + " has a meta record but no data");
      }
    } else if (found->second.first != hash || found->second.second != meta.raw_length) {
      report->problems.push_back("chunk " + hash.Hex() + ": meta record disagrees with its data");
    }
  }
  for (const auto& [seq, chunk] : chunks.good) {
    if (with_meta.count(seq) == 0) {
      report->problems.push_back("chunk " + chunk.first.Hex() + " has no meta record");
    }
  }
}

// What is wrong with the chunks of one file's extents, counted: one line
// per file, however many of its extents name a bad chunk.
class FileDamage {
 public:
  void Count(const Extent& e, const CheckedChunks& chunks) {
    ++extents_;
    auto found = chunks.good.find(e.seq);
    bool wrong = true;
    if (found == chunks.good.end()) {
      if (chunks.bad.count(e.seq) != 0) {
        ++damaged_;
        damaged_distinct_.insert(e.seq);
      } else {
        ++missing_;
      }
    } else if (found->second.first != e.hash || found->second.second != e.length) {
      ++disagreeing_;
    } else {
      wrong = false;
    }
    if (wrong && !first_bad_) first_bad_ = e.offset;
  }
  // An extent that could not be judged (malformed, misplaced) still counts
  // among the file's chunks.
  void CountUnjudged() { ++extents_; }

  bool any() const { return damaged_ + missing_ + disagreeing_ > 0; }

  std::string Line(const std::string& where) const {
    std::vector<std::string> what;
    const std::string of = " of its " + std::to_string(extents_) + " chunks";
    if (damaged_ > 0) {
      what.push_back(std::to_string(damaged_) + of + " damaged (" +
                     std::to_string(damaged_distinct_.size()) + " distinct)");
    }
    if (missing_ > 0) what.push_back(std::to_string(missing_) + of + " missing");
    if (disagreeing_ > 0) {
      what.push_back(std::to_string(disagreeing_) + of + " not as its extents say");
    }
    std::string line = where + ": ";
    for (size_t i = 0; i < what.size(); ++i) line += (i ? "; " : "") + what[i];
    line += "; the first at offset " + std::to_string(*first_bad_);
    return line;
  }

 private:
  uint64_t extents_ = 0, damaged_ = 0, missing_ = 0, disagreeing_ = 0;
  std::optional<uint64_t> first_bad_;  // file offset
  std::unordered_set<uint64_t> damaged_distinct_;
};

// One regular file: its extents follow each other from offset 0 to its
// size, past its recorded holes only, and name good chunks of the lengths
// they say.
void CheckFileExtents(const SnapshotCatalog& catalog, const DbView& view, const SnapshotInfo& snap,
                      uint32_t index, const FileEntry& entry, const CheckedChunks& chunks,
                      FsckReport* report) {
  const std::string where = "snapshot '" + snap.id + "' file '" + entry.path + "'";
  ExtentIndex extents(catalog, ExtentIndex::Scope::File(snap.key, index, entry.holes),
                      ExtentIndex::ReadOptions{.view = &view, .fill_cache = false});
  FileDamage damage;
  bool broken = false;
  extents.SeekToFirst();
  for (;;) {
    auto step = extents.NextInOrder();
    if (step.ok() && !*step) break;
    ++report->extents_checked;
    if (!step.ok()) {
      damage.CountUnjudged();
      report->problems.push_back(where + ": " + step.status().message());
      broken = true;
      break;
    }
    const ExtentJoin join = (*step)->join;
    if (join != ExtentJoin::kContiguous && join != ExtentJoin::kAfterHole) {
      damage.CountUnjudged();
      report->problems.push_back(where + ": extent at " + std::to_string((*step)->extent.offset) +
                                 ", expected " + std::to_string((*step)->expected));
      broken = true;
      break;
    }
    damage.Count((*step)->extent, chunks);
  }
  if (Status s = extents.status("reading its extents"); !s.ok()) {
    report->problems.push_back(where + ": " + s.message());
    broken = true;
  }
  if (damage.any()) {
    ++report->damaged_files;
    report->problems.push_back(damage.Line(where));
  }
  if (!broken && extents.covered_to() != entry.size) {
    report->problems.push_back(where + ": extents cover " + std::to_string(extents.covered_to()) +
                               " bytes, the file has " + std::to_string(entry.size));
  } else if (!broken && !extents.crossed_every_hole()) {
    report->problems.push_back(where + ": a recorded hole lies inside its extents");
  }
}

// A file still spooled: its spool file is there, a regular file of its
// size. (Its bytes have no checksum until they are chunked.)
void CheckSpooledFile(const Spool& spool, const SnapshotInfo& snap, uint32_t index,
                      const FileEntry& entry, FsckReport* report) {
  const std::string where = "snapshot '" + snap.id + "' file '" + entry.path + "'";
  ++report->spooled_files;
  Result<UniqueFd> fd = spool.OpenForReading(snap.key, index);
  struct stat st {};
  if (!fd.ok()) {
    // Settled since the records were read, when it is gone: not damage.
    if (fd.status().code() == StatusCode::kNotFound) return;
    report->problems.push_back(where + ": its spool file: " + fd.status().ToString());
  } else if (fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode) ||
             static_cast<uint64_t>(st.st_size) != entry.size) {
    ++report->damaged_files;
    report->problems.push_back(where + ": its spool file " + Spool::FileName(snap.key, index) +
                               " is not a file of " + std::to_string(entry.size) + " bytes");
  }
}

// One snapshot: its file records are as many as its manifest says, and
// each regular file's extents are whole.
void CheckSnapshot(StoreImpl* store, const DbView& view, const SnapshotInfo& snap,
                   const CheckedChunks& chunks, FsckReport* report) {
  ++report->snapshots_checked;
  auto files = store->catalog().ReadFiles(snap.key, &view);
  if (!files.ok()) {
    report->problems.push_back("snapshot '" + snap.id + "': " + files.status().message());
    return;
  }
  if (files->size() != snap.file_count) {
    report->problems.push_back("snapshot '" + snap.id + "' has " + std::to_string(files->size()) +
                               " file records, its manifest says " +
                               std::to_string(snap.file_count));
  }
  for (const auto& [index, entry] : *files) {
    if (entry.type != FileType::kRegular) continue;
    if (entry.spooled) {
      CheckSpooledFile(store->spool(), snap, index, entry, report);
    } else {
      CheckFileExtents(store->catalog(), view, snap, index, entry, chunks, report);
    }
  }
}

}  // namespace

Result<FsckReport> StoreImpl::FsckOnce() {
  // Gc moves chunks between packs and punches them out: not while fsck
  // reads them. Writers and the settler run on; fsck's view is from before.
  SharedMutexHold gc_guard = LockAgainstGc();
  const DbView view(*db_);
  FsckReport report;
  const ChunkMetas metas = ReadChunkMetas(*chunk_store_, view, &report);
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<SnapshotInfo> snapshots, LocalList(&view));
  ChunkDomains domains;
  domains.Learn(*db_, *catalog_, view, snapshots, &report);
  const CheckedChunks chunks = CheckChunkRecords(view, *chunk_store_, metas, domains, &report);
  CheckMetaRecords(metas, chunks, &report);
  for (const auto& snap : snapshots) CheckSnapshot(this, view, snap, chunks, &report);
  return report;
}

}  // namespace gpuckpt
