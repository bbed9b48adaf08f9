// BaseExtents: the extents of the snapshot a new one is based on
// (SnapshotSpec::base), so that an unchanged chunk can be recognised by its
// fingerprint: by path and offset while the new one is cut (a cursor per
// file, the common case), and by fingerprint wherever it lies in the base
// (an index built in the background from the moment the base is loaded:
// a process's memory may move between checkpoints, and with it the offsets
// of whole runs of its pages in CRIU's images).
//
// The index holds 16 bytes per distinct chunk of the base (32 MiB for a
// 32 GiB image of 16 KiB chunks).
//
// BaseExtents is read-only once made and may be shared by the threads of
// one writer; each file opens its own Cursor, used by one thread, which must
// go before the BaseExtents. Both borrow the store's SnapshotCatalog. They
// read the base as it was when the BaseExtents was made (a DbView), so the base
// may be deleted meanwhile; the caller holds the store's gc lock for as
// long as it uses what they return, so the base's chunks stay until the
// new snapshot, which names them, is published.
#ifndef GPUCKPT_CORE_SNAPSHOT_BASE_EXTENTS_H_
#define GPUCKPT_CORE_SNAPSHOT_BASE_EXTENTS_H_

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/catalog/extent_index.h"
#include "core/catalog/records.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/snapshot/store_impl.h"
#include "core/store/store_db.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

class BaseExtents {
 public:
  // Snapshot `id` of `store` as it holds it now; nullptr when there is no
  // such snapshot, or when it is not in dedup domain `dedup_domain` (a
  // chunk name never crosses domains). Borrows the store's catalog.
  static Result<std::unique_ptr<BaseExtents>> Load(StoreImpl* store, const std::string& id,
                                                   std::optional<uint32_t> dedup_domain);
  ~BaseExtents();
  BaseExtents(const BaseExtents&) = delete;
  BaseExtents& operator=(const BaseExtents&) = delete;

  const std::string& id() const { return id_; }
  // Whether some of its files are still spooled: they have no extents to
  // compare with yet.
  bool spooled() const { return spooled_; }

  // Walks one file's extents forward.
  class Cursor {
   public:
    // The base extent that starts at `offset`, if there is one. Offsets must
    // be asked for in increasing order (a file's chunks are cut in order);
    // skipping over the base's extents costs a step each, never a seek.
    Result<std::optional<Extent>> At(uint64_t offset);

   private:
    friend class BaseExtents;
    Cursor(const SnapshotCatalog& catalog, const DbView* view, uint64_t key, uint32_t file_index);

    ExtentIndex extents_;
  };

  // A cursor over the base's file at `path`; nullptr when the base has no
  // regular file there.
  std::unique_ptr<Cursor> Open(const std::string& path) const;

  // An extent of the base anywhere, whose chunk has `fingerprint` and
  // `length`, if there is one. Waits for the index the first time. Any
  // thread.
  Result<std::optional<Extent>> Find(const ChunkFingerprint& fingerprint, uint64_t length) const;

 private:
  struct IndexEntry {
    uint64_t fingerprint_low;  // the first 8 bytes of the fingerprint
    // File index in the top 20 bits, offset in the low 44: extents beyond
    // (files past the millionth, offsets past 16 TiB) are left out, which
    // costs a miss, never a wrong answer.
    uint64_t where;
  };
  using Index = std::vector<IndexEntry>;

  BaseExtents(const SnapshotCatalog& catalog, const StoreDb& db) : catalog_(catalog), view_(db) {}
  Result<Index> BuildIndex() const;

  const SnapshotCatalog& catalog_;
  const DbView view_;
  bool spooled_ = false;
  std::string id_;
  uint64_t key_ = 0;
  std::unordered_map<std::string, uint32_t> file_index_by_path_;
  std::shared_future<Result<Index>> index_;  // built by a thread of its own
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_BASE_EXTENTS_H_
