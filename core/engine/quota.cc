#include "core/engine/quota.h"

#include <fmt/format.h>

#include <limits>
#include <vector>

#include "core/engine/engine.h"

namespace gpuckpt {
namespace {

// How often a reservation measures again when the store keeps changing
// under it; then it goes on with the last measure, which the reservations
// of the operations that changed it still cover.
constexpr int kMeasureAttempts = 4;

}  // namespace

QuotaLedger::Reservation::~Reservation() { ledger_->Release(owner_, bytes_); }

Result<uint64_t> QuotaLedger::Held(uint32_t owner, uint64_t* epoch) {
  const uint64_t at = epoch_.load(std::memory_order_acquire);
  // Read before measuring: a snapshot settled meanwhile is measured again
  // next time.
  const uint64_t settled = store_->settled_snapshots();
  *epoch = at;
  {
    MutexLock lock(&mu_);
    auto it = held_.find(owner);
    if (it != held_.end() && it->second.epoch == at && it->second.settled == settled)
      return it->second.bytes;
  }
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<std::string> ids, catalog_->HeldBy(owner));
  GPUCKPT_ASSIGN_OR_RETURN(const uint64_t bytes, store_->HeldBytes(ids));
  MutexLock lock(&mu_);
  held_[owner] = Measured{at, settled, bytes};
  return bytes;
}

Status QuotaLedger::Refusal(uint32_t owner, uint64_t held, uint64_t reserved, uint64_t worst_case,
                            const std::string& what) const {
  return Status::NoSpace(fmt::format(
      "quota: the checkpoints of uid {} hold {:.1f} MB of the store{}, {} may add up to {:.1f} MB "
      "more, and the quota is {:.1f} MB (rm -r some checkpoints{})",
      owner, held / 1e6,
      reserved == 0 ? "" : fmt::format(", operations in flight may add {:.1f} MB", reserved / 1e6),
      what, worst_case / 1e6, limit_ / 1e6, reserved == 0 ? "" : ", or wait for those to finish"));
}

Result<std::unique_ptr<QuotaLedger::Reservation>> QuotaLedger::Reserve(const Caller& requester,
                                                                       uint32_t owner_uid,
                                                                       uint64_t worst_case_bytes,
                                                                       const std::string& what) {
  if (limit_ == 0) return std::make_unique<Reservation>(this, owner_uid, 0);
  for (int attempt = 1;; ++attempt) {
    uint64_t at = 0;
    GPUCKPT_ASSIGN_OR_RETURN(const uint64_t held, Held(owner_uid, &at));
    MutexLock lock(&mu_);
    // Changed since it was measured: an operation that stored a
    // checkpoint may have given back its reservation already.
    if (epoch_.load(std::memory_order_acquire) != at && attempt < kMeasureAttempts) continue;
    uint64_t& reserved = reserved_[owner_uid];
    if (!requester.is_root() && held + reserved + worst_case_bytes > limit_)
      return Refusal(owner_uid, held, reserved, worst_case_bytes, what);
    reserved += worst_case_bytes;
    return std::make_unique<Reservation>(this, owner_uid, worst_case_bytes);
  }
}

Result<uint64_t> QuotaLedger::Remaining(uint32_t owner_uid) {
  if (limit_ == 0) return std::numeric_limits<uint64_t>::max();
  uint64_t at = 0;
  GPUCKPT_ASSIGN_OR_RETURN(const uint64_t held, Held(owner_uid, &at));
  MutexLock lock(&mu_);
  const uint64_t taken = held + reserved_[owner_uid];
  return taken >= limit_ ? 0 : limit_ - taken;
}

Status QuotaLedger::CheckHeld(const Caller& requester, uint32_t owner_uid,
                              const std::string& what) {
  if (limit_ == 0 || requester.is_root()) return Status::Ok();
  NoteStoreChanged();
  uint64_t at = 0;
  GPUCKPT_ASSIGN_OR_RETURN(const uint64_t held, Held(owner_uid, &at));
  if (held <= limit_) return Status::Ok();
  return Status::NoSpace(
      fmt::format("quota: with {} the checkpoints of uid {} would hold {:.1f} MB of the store, "
                  "and the quota is {:.1f} MB (rm -r some checkpoints)",
                  what, owner_uid, held / 1e6, limit_ / 1e6));
}

void QuotaLedger::Release(uint32_t owner, uint64_t bytes) {
  MutexLock lock(&mu_);
  auto it = reserved_.find(owner);
  if (it == reserved_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) reserved_.erase(it);
}

}  // namespace gpuckpt
