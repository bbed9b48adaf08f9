#include "core/report/report_gather.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "core/base/user_name.h"
#include "core/manifest/checkpoint_manifest.h"

namespace gpuckpt {
namespace {

// Names looked up once per report, however many checkpoints an owner has.
class UserNames {
 public:
  const std::string& Of(uint32_t uid) {
    auto [it, added] = names_.try_emplace(uid);
    if (added) it->second = UserNameOrUid(uid);
    return it->second;
  }

 private:
  std::map<uint32_t, std::string> names_;
};

ReportCheckpoint PointOf(const SnapshotInfo& info, const CheckpointManifest& manifest) {
  ReportCheckpoint point;
  point.id = info.id;
  point.created_ns = info.created_ns;
  point.logical_bytes = info.logical_bytes;
  point.new_bytes = info.new_bytes;
  point.stored_bytes = info.stored_bytes;
  if (manifest.stages) point.frozen_s = manifest.stages->frozen_s;
  if (manifest.IsOwnDump()) point.durable_s = info.duration_s;
  return point;
}

// The checkpoints grouped into processes: by owner and pid, as
// <pid>/checkpoints/ groups them; each process's checkpoints oldest first
// and its command its latest checkpoint's.
std::vector<ReportProcess> GroupIntoProcesses(const std::vector<SnapshotInfo>& checkpoints,
                                              UserNames& names) {
  std::map<std::pair<uint32_t, int>, ReportProcess> by_process;
  // The command of each process's latest checkpoint so far, with its time.
  std::map<std::pair<uint32_t, int>, int64_t> command_time;
  for (const SnapshotInfo& info : checkpoints) {
    // A manifest that cannot be read names nobody: root's, of no process,
    // as the mount's permission checks read it.
    const CheckpointManifest manifest = ManifestOrEmpty(info.extra_json);
    const uint32_t uid = manifest.OwnerOrRoot().uid;
    const int pid = std::max(manifest.pid, 0);
    const auto key = std::pair{uid, pid};
    ReportProcess& process = by_process[key];
    process.pid = pid;
    process.owner_uid = uid;
    process.checkpoints.push_back(PointOf(info, manifest));
    auto [seen, first] = command_time.try_emplace(key, info.created_ns);
    if (manifest.command && (first || info.created_ns >= seen->second)) {
      process.command = *manifest.command;
      seen->second = info.created_ns;
    }
  }
  std::vector<ReportProcess> processes;
  for (auto& [key, process] : by_process) {
    process.owner_name = names.Of(process.owner_uid);
    std::stable_sort(process.checkpoints.begin(), process.checkpoints.end(),
                     [](const ReportCheckpoint& a, const ReportCheckpoint& b) {
                       return a.created_ns < b.created_ns;
                     });
    processes.push_back(std::move(process));
  }
  return processes;
}

// The checkpoints that added the most to the store, largest first (ties by
// id, so that the page does not reorder between reads).
std::vector<ReportHolder> TopCheckpoints(const std::vector<SnapshotInfo>& checkpoints) {
  std::vector<ReportHolder> holders;
  for (const SnapshotInfo& info : checkpoints) holders.push_back({info.id, info.stored_bytes});
  std::sort(holders.begin(), holders.end(), [](const ReportHolder& a, const ReportHolder& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });
  if (holders.size() > kReportTopCheckpoints) holders.resize(kReportTopCheckpoints);
  return holders;
}

// What each owner's checkpoints hold of the store, largest first.
Result<std::vector<ReportHolder>> OwnerHoldings(Store& store,
                                                const std::vector<SnapshotInfo>& checkpoints,
                                                UserNames& names) {
  std::map<uint32_t, std::vector<std::string>> ids_by_owner;
  for (const SnapshotInfo& info : checkpoints)
    ids_by_owner[ManifestOrEmpty(info.extra_json).OwnerOrRoot().uid].push_back(info.id);
  std::vector<ReportHolder> owners;
  for (const auto& [uid, ids] : ids_by_owner) {
    GPUCKPT_ASSIGN_OR_RETURN(const uint64_t held, store.HeldBytes(ids));
    owners.push_back({names.Of(uid), held});
  }
  std::sort(owners.begin(), owners.end(), [](const ReportHolder& a, const ReportHolder& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });
  return owners;
}

}  // namespace

Result<ReportData> GatherReport(Store& store, const std::vector<SnapshotInfo>& checkpoints,
                                const ReportScope& scope, int64_t now_ns) {
  UserNames names;
  ReportData data;
  data.generated_ns = now_ns;
  data.processes = GroupIntoProcesses(checkpoints, names);
  data.checkpoints = TopCheckpoints(checkpoints);
  ReportStoreTotals& totals = data.store;
  if (!scope.owner) {
    data.scope = "the checkpoints of every owner";
    GPUCKPT_ASSIGN_OR_RETURN(const StoreStats stats, store.Stats());
    totals.whole_store = true;
    totals.checkpoint_count = stats.snapshot_count;
    totals.logical_bytes = stats.logical_bytes;
    totals.unique_bytes = stats.unique_bytes;
    totals.stored_bytes = stats.stored_bytes;
    totals.disk_bytes = stats.disk_bytes;
    GPUCKPT_ASSIGN_OR_RETURN(data.owners, OwnerHoldings(store, checkpoints, names));
    return data;
  }
  data.scope = "the checkpoints of " + names.Of(*scope.owner);
  std::vector<std::string> ids;
  for (const SnapshotInfo& info : checkpoints) {
    ids.push_back(info.id);
    totals.logical_bytes += info.logical_bytes;
  }
  totals.checkpoint_count = checkpoints.size();
  GPUCKPT_ASSIGN_OR_RETURN(totals.stored_bytes, store.HeldBytes(ids));
  return data;
}

}  // namespace gpuckpt
