// ExtentIndex: the extent records (column family `extents`, keys of
// catalog_keys.h) of one file of a snapshot, of a whole snapshot, or of
// the whole store: iterator bounds, key checks and decoding in one place.
//
// Two ways to walk it:
// - record by record (SeekToFirst(), Valid(), Key(), Decode(), Next()),
//   for gc's mark, fsck's domain pass and the base's fingerprint index,
//   which take the records as they come;
// - in offset order through one file (SeekToFirst() or SeekTo(), then
//   NextInOrder()), which says how each extent joins the bytes before it:
//   contiguous, past one of the file's recorded holes, past a gap, or
//   overlapping. Readers, export and fsck judge a damaged index from that
//   value instead of each re-deriving it.
//
// Borrows the SnapshotCatalog (and the DbView `view`, when given, and the
// holes a file scope is given), which must outlive it. Not thread-safe: one thread walks one
// ExtentIndex. Not copyable or movable (the iterator points into the bounds it owns).
#ifndef GPUCKPT_CORE_CATALOG_EXTENT_INDEX_H_
#define GPUCKPT_CORE_CATALOG_EXTENT_INDEX_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/catalog/records.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/store/store_db.h"
#include "gpuckpt/status.h"

// Held by pointer only, so that the modules walking the index see no RocksDB.
namespace rocksdb {
class Iterator;
class Slice;
}  // namespace rocksdb

namespace gpuckpt {

// Where an extent record belongs, from its key.
struct ExtentKeyParts {
  uint64_t snapshot_key = 0;
  uint32_t file_index = 0;
  uint64_t offset = 0;
};

// How an extent met by NextInOrder() joins the bytes walked before it.
enum class ExtentJoin {
  kContiguous,  // starts where they end (after SeekTo(): holds the offset asked for)
  // Starts where a recorded hole of the file (FileEntry::holes) that
  // begins where they end ends: the bytes in between are zeros.
  kAfterHole,
  kGap,      // starts past where they end: bytes in between have no extent
  kOverlap,  // starts before where they end: bytes with two extents
};

class ExtentIndex {
 public:
  // Which extents: those of one file, of one snapshot, or all of them.
  struct Scope {
    // `holes`: the file's (FileEntry::holes, borrowed), which the walk in
    // offset order steps over (kAfterHole); without them a hole is a gap.
    static Scope File(uint64_t snapshot_key, uint32_t file_index,
                      std::span<const FileHole> holes = {});
    static Scope Snapshot(uint64_t snapshot_key);
    static Scope Store() { return Scope(); }

    std::optional<std::string> lower, upper;  // none: unbounded
    std::span<const FileHole> holes;          // in offset order
  };
  struct ReadOptions {
    const DbView* view = nullptr;  // none: the database as it is now
    // False for one pass over records nobody reads again soon.
    bool fill_cache = true;
  };

  ExtentIndex(const SnapshotCatalog& catalog, Scope scope, ReadOptions options);
  ExtentIndex(const SnapshotCatalog& catalog, Scope scope)
      : ExtentIndex(catalog, std::move(scope), ReadOptions()) {}
  ~ExtentIndex();
  ExtentIndex(const ExtentIndex&) = delete;
  ExtentIndex& operator=(const ExtentIndex&) = delete;

  // Record by record.
  void SeekToFirst();
  // To the first record of a snapshot after `snapshot_key` (gc skips the
  // records of a snapshot it will delete whole).
  void SeekPastSnapshot(uint64_t snapshot_key);
  bool Valid() const;
  void Next();
  // The record's key; Corruption "malformed extent key" when it is not one.
  Result<ExtentKeyParts> Key() const;
  // The record; a malformed key or value is Corruption.
  Result<Extent> Decode() const;
  // Why Valid() is false, if not for the end of the scope: an error that
  // names `context`, or OK.
  Status status(std::string_view context) const;

  // In offset order, through a file's extents. SeekToFirst() starts the walk
  // at offset 0; SeekTo() at `offset`, on the extent at or before it.
  void SeekTo(uint64_t offset);
  struct Step {
    Extent extent;
    ExtentJoin join = ExtentJoin::kContiguous;
    uint64_t expected = 0;  // the offset the walk had reached before it
  };
  // The next extent and how it joins the walk; nullopt past the last one,
  // or when the iterator failed (see status()). A malformed key or value is
  // Corruption. Taking an extent does not step past it: a reader that
  // stops at the last extent it needs reads no record beyond.
  Result<std::optional<Step>> NextInOrder();
  // The end of the bytes the walk has covered: the end of the last extent
  // taken (after SeekTo(), the offset asked for until one is).
  uint64_t walked_to() const { return walked_to_; }
  // walked_to(), or the end of the recorded hole that starts there: where
  // the file's bytes are accounted for up to (its size, once a whole file
  // is walked, also when it ends in a hole).
  uint64_t covered_to() const;
  // After a walk from SeekToFirst() to the end: whether it stepped over
  // every recorded hole (kAfterHole, or the one covered_to() ends in). A
  // hole it did not is not between extents: readers would return zeros
  // over bytes an extent holds.
  bool crossed_every_hole() const;

 private:
  Scope scope_;  // the bounds the iterator points into
  std::unique_ptr<rocksdb::Slice> lower_slice_, upper_slice_;
  std::unique_ptr<rocksdb::Iterator> it_;
  // The recorded hole that starts at `offset`, if there is one.
  const FileHole* HoleAt(uint64_t offset) const;

  uint64_t walked_to_ = 0;
  size_t holes_crossed_ = 0;
  bool step_before_next_ = false;  // NextInOrder() took the record it is at
  bool may_start_inside_ = false;  // the first extent after SeekTo()
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_CATALOG_EXTENT_INDEX_H_
