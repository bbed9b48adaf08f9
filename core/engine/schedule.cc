// EngineImpl: checkpoints on a schedule (`checkpoint --every`) and the
// retention applied after each checkpoint (retention.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>

#include "core/base/log.h"
#include "core/base/time_text.h"
#include "core/engine/engine_impl.h"
#include "core/proc/process_info.h"

namespace gpuckpt {

Status EngineImpl::CheckScheduleRequest(const CheckpointRequest& request) const {
  if (request.every.count() <= 0) return Status::Ok();
  if (request.kill)
    return Status::InvalidArgument(
        "--every takes checkpoints of a running process: not with --kill");
  if (!request.name.empty())
    return Status::InvalidArgument(
        "--every names its checkpoints <pid>-<n> itself: not with --name");
  return Status::Ok();
}

void EngineImpl::StartSchedule(const CheckpointRequest& request) {
  auto process = ReadProcess(request.pid, ProcReadOptions{.read_gpu_devices = false});
  if (!process.ok()) return;  // ended right after its checkpoint: nothing to schedule
  // The scheduled runs are no request of a caller who could interrupt them.
  CheckpointRequest scheduled = request;
  scheduled.caller.pid = 0;
  scheduled.caller.interrupted = nullptr;
  schedule_.Set(scheduled, process->start_time);
  spdlog::info("schedule uid={} pid={} every={} retention={}", request.caller.uid, request.pid,
               DurationText(request.every), LogValue(request.retention.ToString()));
}

bool EngineImpl::RunScheduled(const CheckpointRequest& request, uint64_t start_time, bool* ok) {
  auto process = ReadProcess(request.pid, ProcReadOptions{.read_gpu_devices = false});
  if (!process.ok() || process->start_time != start_time) {
    spdlog::info("schedule pid={} result=ended reason=process_ended", request.pid);
    return false;
  }
  CheckpointRequest once = request;
  once.every = std::chrono::seconds(0);  // this one checkpoint; the schedule goes on by itself
  auto made = Checkpoint(once);
  *ok = made.ok();
  if (made.ok()) return true;
  // The process ended during the run, or is no longer the caller's to
  // checkpoint: the schedule ends. Anything else (a full disk, another
  // operation in flight) is for the next run to try again.
  const StatusCode code = made.status().code();
  if (code == StatusCode::kNoSuchProcess || code == StatusCode::kPermissionDenied) {
    spdlog::info("schedule pid={} result=ended reason={}", request.pid, ResultLabel(code));
    return false;
  }
  return true;
}

Status EngineImpl::StopSchedule(int pid, const Caller& caller) {
  GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo info, ReadProcess(pid));
  GPUCKPT_RETURN_IF_ERROR(MayCheckpoint(caller, info));
  if (!schedule_.Stop(pid))
    return Status::NotFound(fmt::format("process {} is not checkpointed on a schedule", pid));
  spdlog::info("schedule uid={} pid={} result=stopped", caller.uid, pid);
  // Shown as the last operation, unless one is in flight (a scheduled
  // checkpoint, which still runs to its end).
  if (auto ticket = board_.Begin(pid, "schedule"); ticket.ok())
    (*ticket)->SetResult("schedule stopped: no more checkpoints every so often");
  return Status::Ok();
}

void EngineImpl::ApplyRetention(const CheckpointRequest& request, const SnapshotInfo& made) {
  const uint32_t owner = OwnerOf(made).uid;
  const RetentionRule& rule = request.retention.empty() ? options_.retention : request.retention;
  if (!rule.empty()) {
    const std::string scope = fmt::format("pid={}", request.pid);
    auto ids = catalog_.CheckpointsOfProcess(request.pid, owner);
    if (!ids.ok()) {
      spdlog::warn("retention {} result=failed error={}", scope, LogValue(ids.status().message()));
    } else {
      std::vector<std::string> series;
      for (const std::string& id : *ids)
        if (IsSeriesName(id, request.pid)) series.push_back(id);
      auto removed = RemoveNotKept(series, rule, made.id, scope);
      if (!removed.empty())
        spdlog::info("retention uid={} {} rule={} kept={} removed={} ids={}", owner, scope,
                     LogValue(rule.ToString()), series.size() - removed.size(), removed.size(),
                     LogValue(fmt::format("{}", fmt::join(removed, ","))));
    }
  }
  const RetentionRule& owner_rule =
      request.owner_retention.empty() ? options_.owner_retention : request.owner_retention;
  if (owner_rule.empty()) return;
  auto held = catalog_.HeldBy(owner);
  if (!held.ok()) {
    spdlog::warn("retention owner={} result=failed error={}", owner,
                 LogValue(held.status().message()));
    return;
  }
  // The engine-named checkpoints of every process of the owner's: those
  // someone named were kept on purpose.
  std::vector<std::string> numbered;
  for (const std::string& id : *held)
    if (NumberedName(id)) numbered.push_back(id);
  auto removed = RemoveNotKept(numbered, owner_rule, made.id, "owner");
  if (!removed.empty())
    spdlog::info("retention uid={} owner rule={} kept={} removed={} ids={}", owner,
                 LogValue(owner_rule.ToString()), numbered.size() - removed.size(), removed.size(),
                 LogValue(fmt::format("{}", fmt::join(removed, ","))));
}

std::vector<std::string> EngineImpl::RemoveNotKept(const std::vector<std::string>& ids,
                                                   const RetentionRule& rule,
                                                   const std::string& made_id,
                                                   const std::string& scope) {
  std::vector<SeriesMember> members;
  std::map<std::string, uint64_t> keys;  // of the members, by id
  for (const std::string& id : ids) {
    auto info = store_->Get(id);
    if (!info.ok()) continue;  // removed meanwhile
    members.push_back({id, info->created_ns});
    keys[id] = info->key;
  }
  std::vector<std::string> removed;
  for (const std::string& id : NotKept(members, rule, UnixNowNs())) {
    // Another checkpoint of the owner's made meanwhile may be newer than
    // this one, which stays all the same: it was just asked for.
    if (id == made_id) continue;
    // A lazily restored tree's memory still comes from it: the next
    // checkpoint's retention removes it.
    if (lazy_servers_.Serving(id)) continue;
    Status s = store_->Remove(id);
    if (!s.ok()) {
      spdlog::warn("retention {} id={} result=failed error={}", scope, LogValue(id),
                   LogValue(s.message()));
      continue;
    }
    catalog_.Remove(id, keys[id]);
    removed.push_back(id);
  }
  if (!removed.empty()) NoteStoreChanged();
  return removed;
}

}  // namespace gpuckpt
