#include "fs/status_render.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

#include "core/base/display_text.h"
#include "core/base/time_text.h"

namespace gpuckpt {
namespace {

constexpr double kGiB = 1u << 30;

nlohmann::json GpuJson(const GpuStatus& gpu) {
  nlohmann::json j = {{"available", true}, {"state", nullptr}, {"gpus", nlohmann::json::array()}};
  if (!gpu.unavailable_reason.empty()) {
    j["available"] = false;
    j["unavailable_reason"] = gpu.unavailable_reason;
  } else if (gpu.process) {
    j["state"] = GpuStateName(gpu.process->state);
    for (const auto& d : gpu.process->gpus)
      j["gpus"].push_back({{"name", d.name}, {"uuid", d.uuid}, {"memory_bytes", d.memory_bytes}});
    j["device_memory_bytes"] = gpu.process->device_memory_bytes;
  }
  return j;
}

nlohmann::json OperationJson(const OperationInFlight& op) {
  const auto percent = op.Percent();
  const auto eta = op.EtaSeconds();
  return {{"kind", op.kind},
          {"stage", op.stage},
          {"stage_text", StageWords(op.stage)},
          {"bytes_read", op.bytes},
          {"expected_bytes",
           op.expected_bytes != 0 ? nlohmann::json(op.expected_bytes) : nlohmann::json()},
          {"percent", percent ? nlohmann::json(*percent) : nlohmann::json()},
          {"eta_s", eta ? nlohmann::json(*eta) : nlohmann::json()},
          {"elapsed_s", op.elapsed_s},
          {"started", Rfc3339Utc(op.started_ns)}};
}

nlohmann::json LastJson(const OperationOutcome& last) {
  auto or_null = [](const std::string& s) {
    return s.empty() ? nlohmann::json() : nlohmann::json(s);
  };
  nlohmann::json j = {{"operation", last.operation},
                      {"ok", last.ok},
                      {"summary", DisplayText(last.summary)},
                      {"error_detail", nlohmann::json::array()},
                      {"criu_log", or_null(last.criu_log)},
                      {"checkpoint", or_null(last.checkpoint)},
                      {"started", Rfc3339Utc(last.started_ns)},
                      {"ended", Rfc3339Utc(last.ended_ns)}};
  for (const auto& line : last.detail) j["error_detail"].push_back(DisplayText(line));
  return j;
}

// "published", "pending", or "" when there is no checkpoint to place.
std::string PoolPlacement(const PoolStatus& pool) {
  if (!pool.last_checkpoint_published) return "";
  return *pool.last_checkpoint_published ? "published" : "pending";
}

nlohmann::json ScheduleJson(const ScheduleStatus& s) {
  return {{"every_s", s.every_s},
          {"next_in_s", s.next_in_s},
          {"runs", s.runs},
          {"failures", s.failures}};
}

nlohmann::json RetentionJson(const RetentionRule& rule) {
  if (rule.empty()) return nullptr;
  return {{"keep_last", rule.keep_last ? nlohmann::json(*rule.keep_last) : nlohmann::json()},
          {"keep_within_s",
           rule.keep_within ? nlohmann::json(rule.keep_within->count()) : nlohmann::json()}};
}

nlohmann::json PoolJson(const PoolStatus& pool) {
  const std::string placement = PoolPlacement(pool);
  return {{"name", pool.name},
          {"background", pool.background},
          {"pending_checkpoints", pool.pending_checkpoints},
          {"last_checkpoint", placement.empty() ? nlohmann::json() : nlohmann::json(placement)}};
}

std::string ProcessText(const ProcessInfo& p) {
  std::string out;
  out += fmt::format("pid: {}\n", p.pid);
  out += fmt::format("command: {}\n", DisplayCommand(p));
  out += fmt::format("owner: uid {} gid {}\n", p.creds.ruid, p.creds.rgid);
  out += fmt::format("state: {}\n", std::string(1, p.state));
  out += fmt::format("threads: {}\n", p.threads);
  out += fmt::format("memory: rss {:.1f} MB, virtual {:.1f} MB\n",
                     static_cast<double>(p.rss_bytes) / 1e6, static_cast<double>(p.vm_bytes) / 1e6);
  out += fmt::format("gpu devices: {}\n", p.gpu_devices.empty()
                                              ? "none"
                                              : fmt::format("{}", fmt::join(p.gpu_devices, " ")));
  if (!p.gpu_children.empty())
    out += fmt::format("job: launcher of GPU processes {} (a checkpoint takes the whole tree)\n",
                       fmt::join(p.gpu_children, " "));
  return out;
}

std::string GpuText(const GpuStatus& gpu) {
  if (!gpu.unavailable_reason.empty())
    return fmt::format("gpu: off, GPU state cannot be checkpointed here ({})\n",
                       gpu.unavailable_reason);
  if (!gpu.process) return "";
  std::string out = fmt::format("gpu state: {}\n", GpuStateName(gpu.process->state));
  for (const auto& d : gpu.process->gpus)
    out += fmt::format("gpu: {} {} ({:.1f} GiB)\n", d.name, d.uuid.empty() ? "-" : d.uuid,
                       static_cast<double>(d.memory_bytes) / kGiB);
  const uint64_t device_memory = gpu.process->device_memory_bytes;
  if (device_memory > 0)
    out += fmt::format("device memory: {} bytes ({:.2f} GiB)\n", device_memory,
                       static_cast<double>(device_memory) / kGiB);
  return out;
}

std::string OperationText(const std::optional<OperationInFlight>& op) {
  if (!op) return "operation: idle\n";
  return "operation: " + op->kind + " (" + ProgressText(*op) + ")\n" +
         "operation_started: " + Rfc3339Utc(op->started_ns) + "\n";
}

std::string PoolText(const PoolStatus& pool) {
  std::string out = fmt::format("pool: {} ({} checkpoints waiting to be published)\n", pool.name,
                                pool.pending_checkpoints);
  const std::string placement = PoolPlacement(pool);
  if (!placement.empty()) out += "pool_last_checkpoint: " + placement + "\n";
  return out;
}

// Shown only where there is one: a process without a schedule or a rule
// reads as it always has.
std::string ScheduleText(const ProcessStatusReport& report) {
  std::string out;
  if (report.schedule) {
    const ScheduleStatus& s = *report.schedule;
    out +=
        fmt::format("schedule: every {}, next in {} s ({} run, {} failed)\n",
                    DurationText(std::chrono::seconds(s.every_s)), s.next_in_s, s.runs, s.failures);
  }
  if (!report.retention.empty()) out += "retention: " + report.retention.ToString() + "\n";
  if (!report.owner_retention.empty())
    out += "owner_retention: " + report.owner_retention.ToString() + "\n";
  return out;
}

// Shown only while a lazily restored tree's memory is still coming in.
std::string LazyText(const std::optional<LazyRestoreProgress>& lazy) {
  if (!lazy) return "";
  return "lazy_restore: " + lazy->id + ", resident " + LazyProgressText(*lazy) + "\n";
}

nlohmann::json LazyJson(const LazyRestoreProgress& lazy) {
  return {{"checkpoint", lazy.id},
          {"bytes_read", lazy.bytes},
          {"expected_bytes", lazy.expected_bytes},
          {"seconds", lazy.seconds}};
}

std::string LastText(const std::optional<OperationOutcome>& last) {
  if (!last) return "last: none\n";
  std::string out = "last: " + DisplayText(last->summary) + "\n";
  for (const auto& line : last->detail) out += "last_error_detail: " + DisplayText(line) + "\n";
  if (!last->criu_log.empty()) out += "last_criu_log: " + last->criu_log + "\n";
  out += "last_started: " + Rfc3339Utc(last->started_ns) + "\n";
  out += "last_ended: " + Rfc3339Utc(last->ended_ns) + "\n";
  return out;
}

}  // namespace

std::string RenderStatusText(const ProcessStatusReport& report) {
  std::string out =
      ProcessText(report.process) + GpuText(report.gpu) + OperationText(report.operation);
  if (report.pool) out += PoolText(*report.pool);
  return out + LazyText(report.lazy) + ScheduleText(report) + LastText(report.last);
}

nlohmann::json RenderStatusJson(const ProcessStatusReport& report) {
  const ProcessInfo& p = report.process;
  nlohmann::json j = {
      {"schema_version", 1},
      {"pid", p.pid},
      {"command", DisplayCommand(p)},
      {"owner", {{"uid", p.creds.ruid}, {"gid", p.creds.rgid}}},
      {"state", std::string(1, p.state)},
      {"threads", p.threads},
      {"memory", {{"rss_bytes", p.rss_bytes}, {"virtual_bytes", p.vm_bytes}}},
      {"gpu_devices", p.gpu_devices},
      {"job_gpu_children", p.gpu_children},
      {"gpu", GpuJson(report.gpu)},
      {"operation", report.operation ? OperationJson(*report.operation) : nlohmann::json()},
      {"last", report.last ? LastJson(*report.last) : nlohmann::json()},
      {"schedule", report.schedule ? ScheduleJson(*report.schedule) : nlohmann::json()},
      {"lazy_restore", report.lazy ? LazyJson(*report.lazy) : nlohmann::json()},
      {"retention", RetentionJson(report.retention)},
      {"owner_retention", RetentionJson(report.owner_retention)},
  };
  if (report.pool) j["pool"] = PoolJson(*report.pool);
  return j;
}

std::string StatusFile(const ProcessStatusReport& report,
                       const std::optional<std::vector<std::string>>& checkpoints) {
  std::string text = RenderStatusText(report);
  if (checkpoints)
    text += "checkpoints: " + std::to_string(checkpoints->size()) +
            (checkpoints->empty() ? "" : " (latest " + checkpoints->back() + ")") + "\n";
  return text;
}

std::string StatusJsonFile(const ProcessStatusReport& report,
                           const std::optional<std::vector<std::string>>& checkpoints) {
  nlohmann::json j = RenderStatusJson(report);
  if (checkpoints)
    j["checkpoints"] = {
        {"count", checkpoints->size()},
        {"latest", checkpoints->empty() ? nlohmann::json() : nlohmann::json(checkpoints->back())}};
  return j.dump(2) + "\n";
}

}  // namespace gpuckpt
