#include "core/engine/checkpoint_catalog.h"

#include <algorithm>

#include "core/engine/engine_internal.h"
#include "core/engine/retention.h"

namespace gpuckpt {
namespace {

// Drops `key` from the index `index`[`at`], and the index's slot once empty.
template <typename Index, typename At, typename Key>
void Unindex(Index& index, const At& at, const Key& key) {
  auto it = index.find(at);
  if (it == index.end()) return;
  it->second.erase(key);
  if (it->second.empty()) index.erase(it);
}

}  // namespace

CheckpointCatalog::CheckpointCatalog(Store* store)
    : store_(store), follows_pool_(store->pool_stats().has_value()) {}

CheckpointCatalog::Entry CheckpointCatalog::EntryOf(const SnapshotInfo& info) {
  const Provenance p = ProvenanceOf(info);
  Entry e;
  e.id = info.id;
  e.key = info.key;
  e.owner = p.owner;
  e.maker_uid = p.maker.uid;
  e.own_dump = p.own_dump;
  return e;
}

Status CheckpointCatalog::Load() {
  size_t from = 0;
  {
    MutexLock lock(&mu_);
    ++loads_in_flight_;
    from = changes_.size();
  }
  auto all = store_->List();
  std::vector<Entry> entries;
  if (all.ok()) {
    entries.reserve(all->size());
    for (const SnapshotInfo& s : *all) entries.push_back(EntryOf(s));
  }
  MutexLock lock(&mu_);
  if (all.ok()) {
    Clear();
    for (Entry& e : entries) Insert(std::move(e));
    // What changed while List() ran may be missing from it, or be there
    // still: applied again, as it happened.
    for (size_t i = from; i < changes_.size(); ++i) Apply(changes_[i]);
    loaded_ = true;
  }
  if (--loads_in_flight_ == 0) changes_.clear();
  return all.status();
}

void CheckpointCatalog::Add(const SnapshotInfo& info) {
  Change change{info.id, EntryOf(info), std::nullopt};
  MutexLock lock(&mu_);
  Apply(change);
  if (loads_in_flight_ > 0) changes_.push_back(std::move(change));
}

void CheckpointCatalog::Remove(const std::string& id, std::optional<uint64_t> key) {
  MutexLock lock(&mu_);
  Change change{id, std::nullopt, key};
  Apply(change);
  if (loads_in_flight_ > 0) changes_.push_back(std::move(change));
}

void CheckpointCatalog::Apply(const Change& change) {
  if (change.added) {
    Insert(*change.added);
    return;
  }
  auto it = entries_.find(change.id);
  if (it != entries_.end() && (!change.removed_key || it->second.key == *change.removed_key))
    Erase(change.id);
}

void CheckpointCatalog::Insert(Entry entry) {
  Erase(entry.id);
  // List()'s order: the store's own is that of the keys, which BeginSnapshot
  // hands out in turn (not that of the commits); a pool's merges by time,
  // and is taken as it comes, every query loading it again.
  entry.order = follows_pool_ ? next_order_++ : entry.key;
  const Provenance p{entry.owner, SnapshotMaker{entry.maker_uid, 0, {}}, entry.own_dump};
  if (CountsForProcess(p, entry.owner.pid, entry.owner.uid))
    of_process_[{entry.owner.pid, entry.owner.uid}][entry.order] = entry.id;
  if (entry.own_dump) own_dumps_[entry.owner.pid][entry.order] = entry.id;
  by_owner_[entry.owner.uid].insert(entry.id);
  if (auto numbered = NumberedName(entry.id)) numbers_[numbered->first].insert(numbered->second);
  entries_.emplace(entry.id, std::move(entry));
}

void CheckpointCatalog::Erase(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  const Entry& e = it->second;
  Unindex(of_process_, std::make_pair(e.owner.pid, e.owner.uid), e.order);
  Unindex(own_dumps_, e.owner.pid, e.order);
  Unindex(by_owner_, e.owner.uid, e.id);
  // Ids are unique: no other entry holds the same number.
  if (auto numbered = NumberedName(e.id)) Unindex(numbers_, numbered->first, numbered->second);
  entries_.erase(it);
}

void CheckpointCatalog::Clear() {
  entries_.clear();
  of_process_.clear();
  own_dumps_.clear();
  by_owner_.clear();
  numbers_.clear();
  next_order_ = 0;
}

Status CheckpointCatalog::Refresh() {
  {
    MutexLock lock(&mu_);
    if (loaded_ && !follows_pool_) return Status::Ok();
  }
  return Load();
}

Result<std::optional<std::string>> CheckpointCatalog::LatestOfProcess(int pid, uint32_t owner_uid) {
  GPUCKPT_RETURN_IF_ERROR(Refresh());
  MutexLock lock(&mu_);
  auto it = of_process_.find({pid, owner_uid});
  if (it == of_process_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second.rbegin()->second);
}

Result<std::vector<std::string>> CheckpointCatalog::CheckpointsOfProcess(
    int pid, std::optional<uint32_t> owner_uid) {
  GPUCKPT_RETURN_IF_ERROR(Refresh());
  MutexLock lock(&mu_);
  if (!owner_uid) {
    auto dumps = own_dumps_.find(pid);
    if (dumps == own_dumps_.end()) return std::vector<std::string>();
    owner_uid = entries_.at(dumps->second.rbegin()->second).owner.uid;
  }
  std::vector<std::string> ids;
  auto it = of_process_.find({pid, *owner_uid});
  if (it != of_process_.end())
    for (const auto& [order, id] : it->second) ids.push_back(id);
  return ids;
}

Result<uint64_t> CheckpointCatalog::HighestNumber(int pid) {
  GPUCKPT_RETURN_IF_ERROR(Refresh());
  MutexLock lock(&mu_);
  auto it = numbers_.find(std::to_string(pid));
  return it == numbers_.end() ? uint64_t{0} : *it->second.rbegin();
}

Result<std::vector<std::string>> CheckpointCatalog::HeldBy(uint32_t owner_uid) {
  GPUCKPT_RETURN_IF_ERROR(Refresh());
  MutexLock lock(&mu_);
  auto it = by_owner_.find(owner_uid);
  if (it == by_owner_.end()) return std::vector<std::string>();
  return std::vector<std::string>(it->second.begin(), it->second.end());
}

Result<std::vector<std::string>> CheckpointCatalog::OwnDumpsOf(int pid, uint32_t maker_uid) {
  GPUCKPT_RETURN_IF_ERROR(Refresh());
  MutexLock lock(&mu_);
  std::vector<std::string> ids;
  auto it = own_dumps_.find(pid);
  if (it != own_dumps_.end())
    for (const auto& [order, id] : it->second)
      if (entries_.at(id).maker_uid == maker_uid) ids.push_back(id);
  return ids;
}

}  // namespace gpuckpt
