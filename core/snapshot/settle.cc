// StoreImpl's settler: chunks the files spooling writers made durable raw
// (see store_impl.h, "Settling", and spool.h).
#include <sched.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>

#include "core/base/log.h"
#include "core/catalog/records.h"
#include "core/snapshot/snapshot_writer_impl.h"
#include "core/snapshot/store_impl.h"
#include "core/store/chunker.h"

namespace gpuckpt {

void StoreImpl::QueueSettle(const std::string& id) {
  MutexLock lock(&settle_mu_);
  if (settle_stopping_) return;  // the next open resumes it
  settle_queue_.push_back(id);
  if (!settler_.joinable() && options_.settle_in_background) {
    settler_ = std::thread([this] { SettleInBackground(); });
  }
  settle_cv_.NotifyAll();
}

void StoreImpl::SettleInBackground() {
  // On CPU time nothing else wants, like a writer's background workers:
  // this thread reads and cuts the spooled files, which checkpoints must
  // never wait behind. (Lowering its own policy needs no privilege; best
  // effort.)
  sched_param param{};
  sched_setscheduler(0, SCHED_IDLE, &param);
  for (;;) {
    std::string id;
    {
      MutexLock lock(&settle_mu_);
      while (!settle_stopping_ && (settle_queue_.empty() || settle_pauses_ > 0))
        settle_cv_.Wait(settle_mu_);
      if (settle_stopping_) return;
      id = settle_queue_.front();
      settle_queue_.pop_front();
      ++settling_now_;
    }
    Status s = Settle(id);
    if (s.code() == StatusCode::kCancelled) {
      // A writer needed a snapshot settled at once and took over: this
      // one is settled again once it is done (what it did is redone).
      MutexLock lock(&settle_mu_);
      settle_queue_.push_front(id);
    } else if (!s.ok()) {
      // It stays spooled, and readable; the next open tries again.
      spdlog::warn("settle snapshot={} result=failed stays=spooled error={}", LogValue(id),
                   LogValue(s.ToString()));
    }
    MutexLock lock(&settle_mu_);
    --settling_now_;
    settle_cv_.NotifyAll();
  }
}

StoreImpl::SettlePause StoreImpl::PauseSettling() {
  MutexLock lock(&settle_mu_);
  ++settle_pauses_;
  return SettlePause(this);
}

void StoreImpl::EndSettlePause() {
  MutexLock lock(&settle_mu_);
  --settle_pauses_;
  settle_cv_.NotifyAll();
}

void StoreImpl::WaitSettled() {
  MutexLock lock(&settle_mu_);
  while (!settle_stopping_ && settler_.joinable() &&
         (!settle_queue_.empty() || settling_now_ > 0 || settle_pauses_ > 0)) {
    settle_cv_.Wait(settle_mu_);
  }
}

void StoreImpl::StopSettling() {
  std::thread settler;
  {
    MutexLock lock(&settle_mu_);
    settle_stopping_ = true;
    settler = std::move(settler_);
  }
  settle_cv_.NotifyAll();
  if (settler.joinable()) settler.join();
}

Status StoreImpl::ResumeSettling() {
  GPUCKPT_ASSIGN_OR_RETURN(const auto files, spool_->List());
  if (files.empty()) return Status::Ok();
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<SnapshotInfo> snapshots, LocalList());
  std::map<uint64_t, const SnapshotInfo*> by_key;
  for (const SnapshotInfo& s : snapshots) by_key[s.key] = &s;
  uint64_t last_key = 0;
  for (const auto& [key, index] : files) {
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      // A writer's that never published, or a removed snapshot's: no
      // reader can be open yet.
      GPUCKPT_RETURN_IF_ERROR(spool_->Remove(key, index));
      continue;
    }
    // Settle() removes what turns out settled already.
    if (key != last_key) QueueSettle(it->second->id);
    last_key = key;
  }
  return Status::Ok();
}

Status StoreImpl::Settle(const std::string& id) {
  // The hold against gc first, as a writer holds it when it settles its
  // base (SettleHoldingGcGuard()): one order for both.
  SharedMutexHold gc_guard = LockAgainstGc();
  MutexLock one(&settle_one_mu_);
  return SettleLocked(id, /*in_background=*/true);
}

Status StoreImpl::SettleHoldingGcGuard(const std::string& id) {
  // The settler gives up what it is doing (it is asked between blocks),
  // and this thread settles `id` at its own priority: a writer waiting on
  // a thread that runs on idle CPU only could wait for as long as the
  // machine is busy.
  settle_takeovers_.fetch_add(1);
  MutexLock one(&settle_one_mu_);
  settle_takeovers_.fetch_sub(1);
  return SettleLocked(id, /*in_background=*/false);
}

Status StoreImpl::SettleLocked(const std::string& id, bool in_background) {
  Result<SnapshotInfo> info = LocalGet(id);
  if (!info.ok() && info.status().code() == StatusCode::kNotFound) return Status::Ok();  // gc's
  GPUCKPT_RETURN_IF_ERROR(info.status());
  GPUCKPT_ASSIGN_OR_RETURN(auto records, catalog_->ReadFiles(info->key));
  std::vector<uint32_t> spooled;
  for (const auto& [index, e] : records) {
    if (e.spooled) spooled.push_back(index);
  }
  if (spooled.empty()) {
    // Settled before a crash kept its spool files from going.
    GPUCKPT_ASSIGN_OR_RETURN(const auto files, spool_->List());
    for (const auto& [key, index] : files) {
      if (key == info->key) GPUCKPT_RETURN_IF_ERROR(spool_->Remove(key, index));
    }
    return Status::Ok();
  }
  const auto start = std::chrono::steady_clock::now();
  GPUCKPT_ASSIGN_OR_RETURN(Chunker generic, Chunker::Create(options_.chunking.generic, 1));
  GPUCKPT_ASSIGN_OR_RETURN(Chunker pages,
                           Chunker::Create(options_.chunking.pages, options_.chunking.page_size));
  SnapshotSpec spec;
  spec.name = info->id;
  spec.base = info->base;
  spec.dedup_domain = info->dedup_domain;
  SnapshotWriterOptions writer_options;
  writer_options.background = in_background;  // on idle CPU: checkpoints come first
  SnapshotWriterImpl writer(this, spec, info->key, generic, pages, writer_options,
                            SharedMutexHold());
  if (in_background) {
    writer.SetCancel([this] {
      if (settle_takeovers_.load(std::memory_order_relaxed) > 0) return true;
      MutexLock lock(&settle_mu_);
      return settle_pauses_ > 0;
    });
  }
  writer.PrepareToSettle(records);
  GPUCKPT_RETURN_IF_ERROR(writer.LoadBase());

  // Extents an interrupted settle left go first: chunk sizes may differ now.
  StoreBatch stale;
  for (uint32_t index : spooled) {
    GPUCKPT_RETURN_IF_ERROR(catalog_->DeleteExtentsOf(&stale, info->key, index));
  }
  GPUCKPT_RETURN_IF_ERROR(
      catalog_->WriteIndex(&stale, "removing the stale extents of '" + id + "'"));

  for (uint32_t index : spooled) {
    Result<UniqueFd> fd = spool_->OpenForReading(info->key, index);
    if (!fd.ok()) {
      return Status::Corruption("snapshot '" + id + "': the spool file of file " +
                                std::to_string(index) + " is missing: " + fd.status().ToString());
    }
    GPUCKPT_RETURN_IF_ERROR(writer.SettleFile(index, fd->get()));
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto settled, writer.FinishSettling());
  GPUCKPT_ASSIGN_OR_RETURN(const bool recorded, RecordSettled(*info, settled));
  if (!recorded) return Status::Ok();  // removed meanwhile: gc's
  // The extents and records durable, then the spool files may go.
  GPUCKPT_RETURN_IF_ERROR(catalog_->MakeIndexDurable());
  Status removed = Status::Ok();
  for (uint32_t index : spooled)
    if (removed.ok()) removed = spool_->Remove(info->key, index);
  // Counted once its spool files are gone too: whoever measures the store
  // again when the count changes (quotas, metrics) then finds it settled
  // whole.
  settled_snapshots_.fetch_add(1, std::memory_order_acq_rel);
  GPUCKPT_RETURN_IF_ERROR(removed);
  spdlog::info("settle snapshot={} result=ok files={} total_s={:.3f}", LogValue(id), spooled.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return Status::Ok();
}

Result<bool> StoreImpl::RecordSettled(const SnapshotInfo& info,
                                      const std::vector<std::pair<uint32_t, FileEntry>>& settled) {
  // The file records only: the snapshot-record (its manifest.json) stays as
  // it was published, so that a copy taken before settling still compares
  // equal; its totals are what the snapshot held when it was committed.
  StoreBatch batch;
  for (const auto& [index, e] : settled) {
    GPUCKPT_RETURN_IF_ERROR(catalog_->AddFile(&batch, info.key, index, EncodeFileRecord(e)));
  }
  // Under the pins' lock, as Remove() writes: the snapshot is either still
  // there, and its records are replaced, or removed, and nothing is
  // written back.
  MutexLock pins_lock(&pins_->mu);
  GPUCKPT_ASSIGN_OR_RETURN(
      const std::optional<SnapshotInfo> current,
      catalog_->FindSnapshot(info.id, "looking up snapshot '" + info.id + "'"));
  if (!current || current->key != info.key) return false;
  GPUCKPT_RETURN_IF_ERROR(
      catalog_->WriteIndex(&batch, "writing the settled records of " + info.id));
  return true;
}

Status StoreImpl::RemoveOrphanSpoolFiles(const std::unordered_set<uint64_t>& live_or_pinned) {
  GPUCKPT_ASSIGN_OR_RETURN(const auto files, spool_->List());
  for (const auto& [key, index] : files) {
    if (live_or_pinned.count(key) == 0) GPUCKPT_RETURN_IF_ERROR(spool_->Remove(key, index));
  }
  return Status::Ok();
}

}  // namespace gpuckpt
