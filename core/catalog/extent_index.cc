#include "core/catalog/extent_index.h"

#include <rocksdb/db.h>

#include <algorithm>
#include <utility>

#include "core/catalog/catalog_keys.h"
#include "core/store/store_db_rocks.h"

namespace gpuckpt {

ExtentIndex::Scope ExtentIndex::Scope::File(uint64_t snapshot_key, uint32_t file_index,
                                            std::span<const FileHole> holes) {
  // From the file's bare prefix, not its extent at offset 0: a key of the
  // file too short to be an extent's is met, and reported as malformed.
  Scope scope;
  scope.lower = keys::FileKey(snapshot_key, file_index);
  scope.upper = keys::FileKey(snapshot_key, file_index + 1);
  scope.holes = holes;
  return scope;
}

ExtentIndex::Scope ExtentIndex::Scope::Snapshot(uint64_t snapshot_key) {
  Scope scope;
  scope.lower = keys::SnapshotPrefix(snapshot_key);
  scope.upper = keys::SnapshotPrefix(snapshot_key + 1);
  return scope;
}

ExtentIndex::ExtentIndex(const SnapshotCatalog& catalog, Scope scope, ReadOptions options)
    : scope_(std::move(scope)) {
  rocksdb::ReadOptions r;
  r.snapshot = options.view != nullptr ? StoreDbRocks::snapshot(*options.view) : nullptr;
  r.fill_cache = options.fill_cache;
  if (scope_.lower) {
    lower_slice_ = std::make_unique<rocksdb::Slice>(*scope_.lower);
    r.iterate_lower_bound = lower_slice_.get();
  }
  if (scope_.upper) {
    upper_slice_ = std::make_unique<rocksdb::Slice>(*scope_.upper);
    r.iterate_upper_bound = upper_slice_.get();
  }
  it_.reset(StoreDbRocks::db(*catalog.db_)->NewIterator(r, catalog.extents_));
}

void ExtentIndex::SeekToFirst() {
  if (scope_.lower) {
    it_->Seek(*scope_.lower);
  } else {
    it_->SeekToFirst();
  }
  walked_to_ = 0;
  holes_crossed_ = 0;
  step_before_next_ = false;
  may_start_inside_ = false;
}

void ExtentIndex::SeekPastSnapshot(uint64_t snapshot_key) {
  it_->Seek(keys::SnapshotPrefix(snapshot_key + 1));
  step_before_next_ = false;
}

void ExtentIndex::SeekTo(uint64_t offset) {
  // Every key of a file scope shares the prefix given to Scope::File().
  std::string target = scope_.lower.value_or(std::string());
  PutBigEndian(&target, offset, 8);
  it_->SeekForPrev(target);
  walked_to_ = offset;
  holes_crossed_ = 0;
  step_before_next_ = false;
  may_start_inside_ = true;
}

const FileHole* ExtentIndex::HoleAt(uint64_t offset) const {
  const auto& holes = scope_.holes;
  auto it = std::lower_bound(holes.begin(), holes.end(), offset,
                             [](const FileHole& h, uint64_t o) { return h.offset < o; });
  return it != holes.end() && it->offset == offset ? &*it : nullptr;
}

bool ExtentIndex::crossed_every_hole() const {
  const size_t last = HoleAt(walked_to_) != nullptr ? 1 : 0;
  return holes_crossed_ + last == scope_.holes.size();
}

uint64_t ExtentIndex::covered_to() const {
  const FileHole* hole = HoleAt(walked_to_);
  return hole != nullptr ? hole->end() : walked_to_;
}

ExtentIndex::~ExtentIndex() = default;

bool ExtentIndex::Valid() const { return it_->Valid(); }

Status ExtentIndex::status(std::string_view context) const {
  return FromRocks(it_->status(), context);
}

void ExtentIndex::Next() {
  it_->Next();
  step_before_next_ = false;
}

Result<ExtentKeyParts> ExtentIndex::Key() const {
  const std::string_view key = it_->key().ToStringView();
  if (key.size() != keys::kExtentKeySize) return Status::Corruption("malformed extent key");
  return ExtentKeyParts{keys::SnapshotKeyOf(key), keys::FileIndexOf(key),
                        keys::ExtentOffsetOf(key)};
}

Result<Extent> ExtentIndex::Decode() const {
  GPUCKPT_ASSIGN_OR_RETURN(const ExtentKeyParts key, Key());
  return DecodeExtentRecord(key.offset, it_->value().ToStringView());
}

Result<std::optional<ExtentIndex::Step>> ExtentIndex::NextInOrder() {
  if (step_before_next_) Next();
  if (!it_->Valid()) return std::optional<Step>();
  GPUCKPT_ASSIGN_OR_RETURN(Extent extent, Decode());
  Step step{std::move(extent), ExtentJoin::kContiguous, walked_to_};
  const uint64_t begin = step.extent.offset;
  const uint64_t end = begin + step.extent.length;
  if (begin > walked_to_) {
    const FileHole* hole = may_start_inside_ ? nullptr : HoleAt(walked_to_);
    step.join = hole != nullptr && hole->end() == begin ? ExtentJoin::kAfterHole : ExtentJoin::kGap;
    if (step.join == ExtentJoin::kAfterHole) ++holes_crossed_;
  } else if (may_start_inside_) {
    // The extent at or before the offset asked for: it must reach past it.
    if (end <= walked_to_) step.join = ExtentJoin::kGap;
  } else if (begin < walked_to_) {
    step.join = ExtentJoin::kOverlap;
  }
  may_start_inside_ = false;
  walked_to_ = end;
  step_before_next_ = true;
  return std::optional<Step>(std::move(step));
}

}  // namespace gpuckpt
