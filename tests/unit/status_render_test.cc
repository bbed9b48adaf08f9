// <pid>/status and <pid>/status.json rendered from a report made by hand:
// the exact text and JSON the manual documents, for each part present or
// absent.
#include "fs/status_render.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace gpuckpt {
namespace {

constexpr int64_t kDayNs = 86400LL * 1000 * 1000 * 1000;

ProcessStatusReport Idle() {
  ProcessStatusReport r;
  r.process.pid = 4242;
  r.process.state = 'S';
  r.process.threads = 3;
  r.process.creds.ruid = 1000;
  r.process.creds.rgid = 100;
  r.process.cmdline = {"python3", "train.py"};
  r.process.rss_bytes = 12'345'678;
  r.process.vm_bytes = 987'654'321;
  return r;
}

// A GPU process with an operation in flight, a shared pool, and a last
// operation that failed.
ProcessStatusReport Busy() {
  ProcessStatusReport r = Idle();
  r.process.gpu_devices = {"/dev/nvidia0", "/dev/nvidiactl"};
  r.process.gpu_children = {4243, 4244};
  GpuProcessState gpu;
  gpu.state = GpuState::kRunning;
  gpu.gpus = {{"NVIDIA H100", "GPU-1234", 80ull << 30}, {"NVIDIA H100", "", 80ull << 30}};
  gpu.device_memory_bytes = 3ull << 30;
  r.gpu.process = gpu;
  r.operation = OperationInFlight{"checkpoint", "dump", 250'000, 1.25, kDayNs};
  r.pool = PoolStatus{"ckpts", true, 2, false};
  OperationOutcome last;
  last.operation = "checkpoint";
  last.summary = "checkpoint failed: criu dump of process 4242 failed: bad \xff byte";
  last.detail = {"(00.25) Error: one", "(00.26) Error: two"};
  last.criu_log = "/var/lib/gpuckptfs/criu-logs/x/t-checkpoint-4242.log";
  last.started_ns = 2 * kDayNs;
  last.ended_ns = 2 * kDayNs + 1'000'000'000;
  r.last = last;
  return r;
}

TEST(StatusRenderTest, TextOfAnIdleProcessWithoutGpuSupport) {
  ProcessStatusReport r = Idle();
  r.gpu.unavailable_reason = "no driver";
  EXPECT_EQ(RenderStatusText(r),
            "pid: 4242\n"
            "command: python3 train.py\n"
            "owner: uid 1000 gid 100\n"
            "state: S\n"
            "threads: 3\n"
            "memory: rss 12.3 MB, virtual 987.7 MB\n"
            "gpu devices: none\n"
            "gpu: off, GPU state cannot be checkpointed here (no driver)\n"
            "operation: idle\n"
            "last: none\n");
}

TEST(StatusRenderTest, TextOfABusyGpuProcess) {
  EXPECT_EQ(RenderStatusText(Busy()),
            "pid: 4242\n"
            "command: python3 train.py\n"
            "owner: uid 1000 gid 100\n"
            "state: S\n"
            "threads: 3\n"
            "memory: rss 12.3 MB, virtual 987.7 MB\n"
            "gpu devices: /dev/nvidia0 /dev/nvidiactl\n"
            "job: launcher of GPU processes 4243 4244 (a checkpoint takes the whole tree)\n"
            "gpu state: running\n"
            "gpu: NVIDIA H100 GPU-1234 (80.0 GiB)\n"
            "gpu: NVIDIA H100 - (80.0 GiB)\n"
            "device memory: 3221225472 bytes (3.00 GiB)\n"
            "operation: checkpoint (copying memory, 0.2 MB read, 1.2 s)\n"
            "operation_started: 1970-01-02T00:00:00Z\n"
            "pool: ckpts (2 checkpoints waiting to be published)\n"
            "pool_last_checkpoint: pending\n"
            "last: checkpoint failed: criu dump of process 4242 failed: bad \\xFF byte\n"
            "last_error_detail: (00.25) Error: one\n"
            "last_error_detail: (00.26) Error: two\n"
            "last_criu_log: /var/lib/gpuckptfs/criu-logs/x/t-checkpoint-4242.log\n"
            "last_started: 1970-01-03T00:00:00Z\n"
            "last_ended: 1970-01-03T00:00:01Z\n");
}

// A GPU process whose backend could not tell its state shows no GPU lines;
// a pool without a checkpoint to place shows no pool_last_checkpoint.
TEST(StatusRenderTest, TextLeavesOutWhatIsNotKnown) {
  ProcessStatusReport r = Idle();
  r.pool = PoolStatus{"ckpts", false, 0, std::nullopt};
  const std::string text = RenderStatusText(r);
  EXPECT_EQ(text.find("gpu"), text.find("gpu devices: none"));
  EXPECT_NE(text.find("pool: ckpts (0 checkpoints waiting to be published)\n"), std::string::npos);
  EXPECT_EQ(text.find("pool_last_checkpoint"), std::string::npos);
  r.pool->last_checkpoint_published = true;
  EXPECT_NE(RenderStatusText(r).find("pool_last_checkpoint: published\n"), std::string::npos);
}

TEST(StatusRenderTest, JsonOfAnIdleProcess) {
  const nlohmann::json j = RenderStatusJson(Idle());
  EXPECT_EQ(j, nlohmann::json::parse(R"({
    "schema_version": 1, "pid": 4242, "command": "python3 train.py",
    "owner": {"uid": 1000, "gid": 100}, "state": "S", "threads": 3,
    "memory": {"rss_bytes": 12345678, "virtual_bytes": 987654321},
    "gpu_devices": [], "job_gpu_children": [],
    "gpu": {"available": true, "state": null, "gpus": []},
    "operation": null, "last": null, "schedule": null, "retention": null,
    "owner_retention": null, "lazy_restore": null})"))
      << j.dump(2);
}

TEST(StatusRenderTest, ALazilyRestoredTreeStillComingInSaysHowFar) {
  ProcessStatusReport r = Idle();
  EXPECT_EQ(RenderStatusText(r).find("lazy_restore"), std::string::npos);
  r.lazy = LazyRestoreProgress{"4242-3", 412300000, 1073700000, 0.4};
  EXPECT_NE(RenderStatusText(r).find("lazy_restore: 4242-3, resident 412.3 of about 1073.7 MB "
                                     "(38%), 0.4 s, 1030.8 MB/s\n"),
            std::string::npos)
      << RenderStatusText(r);
  EXPECT_EQ(RenderStatusJson(r)["lazy_restore"],
            nlohmann::json::parse(R"({"checkpoint": "4242-3", "bytes_read": 412300000,
                                      "expected_bytes": 1073700000, "seconds": 0.4})"));
}

TEST(StatusRenderTest, JsonOfABusyGpuProcess) {
  const nlohmann::json j = RenderStatusJson(Busy());
  EXPECT_EQ(j["gpu_devices"], nlohmann::json({"/dev/nvidia0", "/dev/nvidiactl"}));
  EXPECT_EQ(j["job_gpu_children"], nlohmann::json({4243, 4244}));
  EXPECT_EQ(j["gpu"], nlohmann::json::parse(R"({
    "available": true, "state": "running", "device_memory_bytes": 3221225472,
    "gpus": [{"name": "NVIDIA H100", "uuid": "GPU-1234", "memory_bytes": 85899345920},
             {"name": "NVIDIA H100", "uuid": "", "memory_bytes": 85899345920}]})"));
  EXPECT_EQ(j["operation"], nlohmann::json::parse(R"({
    "kind": "checkpoint", "stage": "dump", "stage_text": "copying memory",
    "bytes_read": 250000, "expected_bytes": null, "percent": null, "eta_s": null,
    "elapsed_s": 1.25, "started": "1970-01-02T00:00:00Z"})"));
  EXPECT_EQ(j["pool"], nlohmann::json::parse(R"({
    "name": "ckpts", "background": true, "pending_checkpoints": 2,
    "last_checkpoint": "pending"})"));
  EXPECT_EQ(j["last"], nlohmann::json::parse(R"({
    "operation": "checkpoint", "ok": false,
    "summary": "checkpoint failed: criu dump of process 4242 failed: bad \\xFF byte",
    "error_detail": ["(00.25) Error: one", "(00.26) Error: two"],
    "criu_log": "/var/lib/gpuckptfs/criu-logs/x/t-checkpoint-4242.log",
    "checkpoint": null,
    "started": "1970-01-03T00:00:00Z", "ended": "1970-01-03T00:00:01Z"})"))
      << j["last"].dump(2);
}

TEST(StatusRenderTest, JsonOfAnUnavailableGpuAndAPoolWithNothingToPlace) {
  ProcessStatusReport r = Idle();
  r.gpu.unavailable_reason = "no driver";
  r.pool = PoolStatus{"ckpts", false, 0, std::nullopt};
  const nlohmann::json j = RenderStatusJson(r);
  EXPECT_EQ(j["gpu"], nlohmann::json::parse(R"({
    "available": false, "unavailable_reason": "no driver", "state": null, "gpus": []})"));
  EXPECT_TRUE(j["pool"]["last_checkpoint"].is_null());
}

// The whole files add the process's checkpoints where they could be read,
// and nothing where they could not.
TEST(StatusRenderTest, TheFilesEndWithTheProcesssCheckpoints) {
  const std::string text = RenderStatusText(Idle());
  EXPECT_EQ(StatusFile(Idle(), std::nullopt), text);
  EXPECT_EQ(StatusFile(Idle(), std::vector<std::string>{}), text + "checkpoints: 0\n");
  EXPECT_EQ(StatusFile(Idle(), std::vector<std::string>{"4242-1", "4242-2"}),
            text + "checkpoints: 2 (latest 4242-2)\n");

  const nlohmann::json j = RenderStatusJson(Idle());
  EXPECT_EQ(StatusJsonFile(Idle(), std::nullopt), j.dump(2) + "\n");
  const nlohmann::json none =
      nlohmann::json::parse(StatusJsonFile(Idle(), std::vector<std::string>{}));
  EXPECT_EQ(none["checkpoints"], nlohmann::json::parse(R"({"count": 0, "latest": null})"));
  const nlohmann::json two =
      nlohmann::json::parse(StatusJsonFile(Idle(), std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(two["checkpoints"], nlohmann::json::parse(R"({"count": 2, "latest": "b"})"));
  EXPECT_EQ(two.size(), j.size() + 1);
}

// With an estimate of what it reads: the total, the share, the time left
// at the stage's pace; in words a user knows.
TEST(StatusRenderTest, ProgressWithAnEstimate) {
  ProcessStatusReport r = Idle();
  OperationInFlight op{"checkpoint", "dump", 250'000, 1.25, kDayNs};
  op.expected_bytes = 1'000'000;
  op.stage_elapsed_s = 1.0;
  r.operation = op;
  const std::string text = RenderStatusText(r);
  EXPECT_NE(text.find("operation: checkpoint (copying memory, 0.2 of about 1.0 MB (25%), 1.2 s, "
                      "about 3 s left)\n"),
            std::string::npos)
      << text;
  const nlohmann::json j = RenderStatusJson(r)["operation"];
  EXPECT_EQ(j["expected_bytes"], 1'000'000);
  EXPECT_EQ(j["percent"], 25);
  EXPECT_DOUBLE_EQ(j["eta_s"].get<double>(), 3.0);
  // Past the estimate (a tree that grew): never 100% while in flight.
  op.bytes = 2'000'000;
  op.stage = "store";
  r.operation = op;
  EXPECT_NE(RenderStatusText(r).find("(making it durable, 2.0 of about 1.0 MB (99%), 1.2 s)"),
            std::string::npos)
      << RenderStatusText(r);
}

// A schedule and a rule are shown where there is one, and only there.
TEST(StatusRenderTest, ScheduleAndRetentionWhereThereAreAny) {
  ProcessStatusReport r = Idle();
  const std::string plain = RenderStatusText(r);
  EXPECT_EQ(plain.find("schedule"), std::string::npos);
  EXPECT_EQ(plain.find("retention"), std::string::npos);
  r.schedule = ScheduleStatus{1800, 42, 3, 1};
  r.retention = RetentionRule{5, std::chrono::seconds(86400)};
  const std::string text = RenderStatusText(r);
  EXPECT_NE(text.find("schedule: every 30m, next in 42 s (3 run, 1 failed)\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("retention: keep last 5, within 1d\n"), std::string::npos) << text;
  // Before the last operation's lines, after the process's own.
  EXPECT_LT(text.find("schedule:"), text.find("last:"));
  const nlohmann::json j = RenderStatusJson(r);
  EXPECT_EQ(j["schedule"], nlohmann::json::parse(
                               R"({"every_s": 1800, "next_in_s": 42, "runs": 3, "failures": 1})"));
  EXPECT_EQ(j["retention"], nlohmann::json::parse(R"({"keep_last": 5, "keep_within_s": 86400})"));
  r.retention = RetentionRule{std::nullopt, std::chrono::seconds(60)};
  EXPECT_EQ(RenderStatusJson(r)["retention"],
            nlohmann::json::parse(R"({"keep_last": null, "keep_within_s": 60})"));
  EXPECT_EQ(text.find("owner_retention"), std::string::npos) << text;
  r.owner_retention = RetentionRule{20, std::nullopt};
  EXPECT_NE(RenderStatusText(r).find("owner_retention: keep last 20\n"), std::string::npos);
  EXPECT_EQ(RenderStatusJson(r)["owner_retention"],
            nlohmann::json::parse(R"({"keep_last": 20, "keep_within_s": null})"));
}

}  // namespace
}  // namespace gpuckpt
