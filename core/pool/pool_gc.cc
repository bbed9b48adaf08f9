#include "core/pool/pool_gc.h"

#include <fmt/format.h>
#include <unistd.h>

#include <ctime>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/pool/pool_format.h"

namespace gpuckpt::pool {

namespace {

constexpr char kLockName[] = "collector";
constexpr char kEpochKey[] = "epoch";
constexpr char kMarkedAtKey[] = "marked_at";
constexpr char kGraceKey[] = "grace_s";
constexpr unsigned kPage = 1024;

int64_t NowUnix() { return static_cast<int64_t>(std::time(nullptr)); }

// What gpuckpt.gc's map says: the last mark's epoch, when it was made (0:
// no mark waits for its sweep), and the grace it was made with.
struct GcState {
  uint64_t epoch = 0;
  int64_t marked_at = 0;
  uint64_t grace_s = 0;
};

uint64_t ParseNumber(const std::string& text) {
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

Result<GcState> ReadState(RadosPool* rados) {
  GPUCKPT_ASSIGN_OR_RETURN(auto values,
                           rados->OmapGet(GcObject(), {kEpochKey, kMarkedAtKey, kGraceKey}));
  GcState state;
  for (const auto& [key, value] : values) {
    if (key == kEpochKey) state.epoch = ParseNumber(value);
    if (key == kMarkedAtKey) state.marked_at = static_cast<int64_t>(ParseNumber(value));
    if (key == kGraceKey) state.grace_s = ParseNumber(value);
  }
  return state;
}

Status WriteState(RadosPool* rados, const GcState& state) {
  return rados->OmapSet(GcObject(), {{kEpochKey, std::to_string(state.epoch)},
                                     {kMarkedAtKey, std::to_string(state.marked_at)},
                                     {kGraceKey, std::to_string(state.grace_s)}});
}

// Calls `fn` with every entry of an object's map, page by page.
Status ForEachOmapEntry(RadosPool* rados, const std::string& oid,
                        const std::function<Status(const std::string&, const std::string&)>& fn) {
  std::string after;
  for (;;) {
    GPUCKPT_ASSIGN_OR_RETURN(auto page, rados->OmapList(oid, after, kPage));
    for (const auto& [key, value] : page) GPUCKPT_RETURN_IF_ERROR(fn(key, value));
    if (page.size() < kPage) return Status::Ok();
    after = page.back().first;
  }
}

struct ChunkHashSet {
  std::unordered_set<ChunkHash, ChunkHashHasher> names;
};

// The chunks the published snapshots name, and the incarnations published.
// Any snapshot that cannot be read fails the run: what it names is unknown,
// and nothing may be swept then.
Status ReadLive(RadosPool* rados, ChunkHashSet* live,
                std::set<std::pair<std::string, uint64_t>>* published, CollectReport* report) {
  return ForEachOmapEntry(
      rados, CatalogObject(), [&](const std::string& id, const std::string& value) -> Status {
        GPUCKPT_ASSIGN_OR_RETURN(CatalogEntry entry, DecodeCatalogEntry(value));
        std::string body;
        for (uint32_t part = 0; part < entry.body_parts; ++part) {
          auto bytes = rados->ReadWhole(BodyObject(id, entry.incarnation, part), kBodyPartBytes);
          if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound) {
            // Removed since the catalog was listed (its entry goes first):
            // what it named is not live. Still listed, its body is damaged.
            GPUCKPT_ASSIGN_OR_RETURN(auto now, rados->OmapGet(CatalogObject(), {id}));
            if (now.empty() || now[0].second != value) return Status::Ok();
          }
          if (!bytes.ok()) return bytes.status();
          body += *bytes;
        }
        if (body.size() != entry.body_bytes || BodyChecksum(body) != entry.body_checksum) {
          return Status::Corruption(
              fmt::format("the body of snapshot '{}' does not match its catalog entry: nothing is "
                          "collected until it is removed",
                          id));
        }
        GPUCKPT_ASSIGN_OR_RETURN(auto files, DecodeBody(body, "'" + id + "'"));
        for (const BodyFile& f : files)
          for (const BodyExtent& e : f.extents) live->names.insert(e.hash);
        published->emplace(id, entry.incarnation);
        report->snapshots++;
        return Status::Ok();
      });
}

// Calls `fn(shard object, key, value, entry)` for every index entry.
Status ForEachIndexEntry(RadosPool* rados,
                         const std::function<Status(const std::string&, const std::string&,
                                                    const std::string&, const IndexEntry&)>& fn) {
  for (unsigned shard = 0; shard < kIndexShards; ++shard) {
    const std::string oid = IndexObject(shard);
    GPUCKPT_RETURN_IF_ERROR(ForEachOmapEntry(
        rados, oid, [&](const std::string& key, const std::string& value) -> Status {
          GPUCKPT_ASSIGN_OR_RETURN(IndexEntry entry, DecodeIndexEntry(value));
          return fn(oid, key, value, entry);
        }));
  }
  return Status::Ok();
}

bool IsLive(const ChunkHashSet& live, const std::string& key) {
  auto hash = ChunkHashOfIndexKey(key);
  // A key that names no chunk is garbage whatever it says.
  return hash.ok() && live.names.count(*hash) != 0;
}

// Replaces `value` under `key` with `entry` unless someone changed it
// since it was read (kAborted is no error here: theirs stands).
Status ReplaceUnlessChanged(RadosPool* rados, const std::string& oid, const std::string& key,
                            const std::string& value, const IndexEntry& entry) {
  Status s = rados->OmapReplaceIfEqual(oid, key, value, EncodeIndexEntry(entry));
  return s.code() == StatusCode::kAborted ? Status::Ok() : s;
}

Status Mark(RadosPool* rados, const ChunkHashSet& live, uint64_t epoch, CollectReport* report) {
  return ForEachIndexEntry(rados, [&](const std::string& oid, const std::string& key,
                                      const std::string& value, const IndexEntry& entry) {
    if (IsLive(live, key) || entry.condemned_by == epoch) return Status::Ok();
    IndexEntry marked = entry;
    marked.condemned_by = epoch;
    report->marked_chunks++;
    return ReplaceUnlessChanged(rados, oid, key, value, marked);
  });
}

// Removes what `prefix` names that `keep` does not want and that is older
// than the grace; `keep` gets the object's name.
Status RemoveStaleObjects(RadosPool* rados, const std::string& prefix, int64_t older_than,
                          const std::function<bool(const std::string&)>& keep,
                          CollectReport* report) {
  GPUCKPT_ASSIGN_OR_RETURN(auto objects, rados->ListObjects(prefix));
  for (const std::string& oid : objects) {
    if (keep(oid)) continue;
    GPUCKPT_ASSIGN_OR_RETURN(auto stat, rados->Stat(oid));
    if (!stat || stat->mtime_unix_s > older_than) continue;
    Status s = rados->Remove(oid);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    report->swept_objects++;
    report->swept_bytes += stat->size;
  }
  return Status::Ok();
}

Status Sweep(RadosPool* rados, const ChunkHashSet& live,
             const std::set<std::pair<std::string, uint64_t>>& published, const GcState& state,
             int64_t older_than, CollectReport* report) {
  std::set<std::pair<uint64_t, uint64_t>> packs_in_use;
  GPUCKPT_RETURN_IF_ERROR(ForEachIndexEntry(
      rados,
      [&](const std::string& oid, const std::string& key, const std::string& value,
          const IndexEntry& entry) -> Status {
        const bool live_now = IsLive(live, key);
        if (entry.condemned_by == state.epoch && !live_now) {
          Status s = rados->OmapRemoveIfEqual(oid, key, value);
          if (s.ok()) {
            report->swept_chunks++;
            return Status::Ok();
          }
          if (s.code() != StatusCode::kAborted) return s;
          // Taken back by a writer meanwhile: it stays, and so does its pack.
        } else if (entry.condemned_by != 0 && live_now) {
          // Named again since it was marked: the mark goes.
          IndexEntry cleared = entry;
          cleared.condemned_by = 0;
          GPUCKPT_RETURN_IF_ERROR(ReplaceUnlessChanged(rados, oid, key, value, cleared));
        }
        packs_in_use.emplace(entry.pack_writer, entry.pack_number);
        return Status::Ok();
      }));
  // Objects no entry or catalog entry needs, once older than the grace
  // (younger ones may belong to a push still under way).
  GPUCKPT_RETURN_IF_ERROR(RemoveStaleObjects(
      rados, "gpuckpt.pack.", older_than,
      [&](const std::string& oid) {
        auto pack = ParsePackObject(oid);
        return pack && packs_in_use.count(*pack) != 0;
      },
      report));
  std::set<std::string> published_ids;
  std::set<std::string> published_bodies;
  for (const auto& [id, incarnation] : published) {
    published_ids.insert(NameObject(id));
    published_bodies.insert(BodyObjectPrefix(id) + fmt::format("{:016x}.", incarnation));
  }
  GPUCKPT_RETURN_IF_ERROR(RemoveStaleObjects(
      rados, "gpuckpt.name.", older_than,
      [&](const std::string& oid) { return published_ids.count(oid) != 0; }, report));
  return RemoveStaleObjects(
      rados, "gpuckpt.body.", older_than,
      [&](const std::string& oid) {
        // gpuckpt.body.<id>.<incarnation>.<part>: kept when its prefix up
        // to the part is a published incarnation's.
        const size_t last_dot = oid.rfind('.');
        return last_dot != std::string::npos &&
               published_bodies.count(oid.substr(0, last_dot + 1)) != 0;
      },
      report);
}

std::string RandomCookie() {
  std::random_device device;
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  return fmt::format("{}-{:08x}{:08x}", host, device(), device());
}

}  // namespace

Result<CollectReport> Collect(RadosPool* rados, const CollectOptions& options) {
  CollectReport report;
  const std::string cookie = RandomCookie();
  Status locked = rados->LockExclusive(GcObject(), kLockName, cookie, options.lease);
  if (locked.code() == StatusCode::kBusy) return report;
  GPUCKPT_RETURN_IF_ERROR(locked);
  auto run = [&]() -> Status {
    GPUCKPT_ASSIGN_OR_RETURN(GcState state, ReadState(rados));
    ChunkHashSet live;
    std::set<std::pair<std::string, uint64_t>> published;
    GPUCKPT_RETURN_IF_ERROR(ReadLive(rados, &live, &published, &report));
    report.live_chunks = live.names.size();
    GPUCKPT_RETURN_IF_ERROR(rados->LockExclusive(GcObject(), kLockName, cookie, options.lease));
    const int64_t now = NowUnix();
    const int64_t grace = options.grace.count();
    if (state.marked_at != 0) {
      if (now - state.marked_at < grace) {
        report.sweep_due_in_s = static_cast<uint64_t>(grace - (now - state.marked_at));
        return Status::Ok();
      }
      GPUCKPT_RETURN_IF_ERROR(Sweep(rados, live, published, state, now - grace, &report));
      report.swept = true;
      state.marked_at = 0;
      GPUCKPT_RETURN_IF_ERROR(WriteState(rados, state));
      GPUCKPT_RETURN_IF_ERROR(rados->LockExclusive(GcObject(), kLockName, cookie, options.lease));
    }
    // The grace is recorded before anything is marked: writers read it.
    GcState next{state.epoch + 1, 0, static_cast<uint64_t>(grace)};
    GPUCKPT_RETURN_IF_ERROR(WriteState(rados, next));
    GPUCKPT_RETURN_IF_ERROR(Mark(rados, live, next.epoch, &report));
    next.marked_at = NowUnix();
    report.sweep_due_in_s = static_cast<uint64_t>(grace);
    return WriteState(rados, next);
  };
  Status s = run();
  rados->Unlock(GcObject(), kLockName, cookie).PermitUnchecked();
  GPUCKPT_RETURN_IF_ERROR(s);
  report.collected = true;
  return report;
}

Result<std::chrono::seconds> WriterGrace(RadosPool* rados) {
  GPUCKPT_ASSIGN_OR_RETURN(GcState state, ReadState(rados));
  if (state.grace_s == 0) return std::chrono::seconds(3600);
  return std::chrono::seconds(state.grace_s);
}

}  // namespace gpuckpt::pool
