// Tests of core/engine/checkpoint_resources: whether a checkpoint fits in
// host memory, in the memory cgroups of its GPU processes and of
// gpuckptfs, and on the store's disk; decided on figures alone, no daemon.
#include "core/engine/checkpoint_resources.h"

#include <cerrno>
#include <cstdint>
#include <string>

#include "core/base/log.h"
#include "core/engine/metrics.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

constexpr uint64_t kGB = 1000 * 1000 * 1000;
constexpr uint64_t kMB = 1000 * 1000;

CgroupLimits Limited(const std::string& cgroup, uint64_t limit, uint64_t used) {
  return {CgroupLimit{cgroup, limit, used}};
}

// A large GPU job: 32 GB of device memory, 2.4 GB of staging.
CheckpointMemoryNeed GpuNeed(uint64_t available) {
  CheckpointMemoryNeed need;
  need.pid = 123;
  need.device_memory = {{123, 32 * kGB, {}}};
  need.staging = {0, 2400 * kMB, {}};
  need.host_available_bytes = available;
  return need;
}

TEST(HostMemory, Fits) {
  EXPECT_OK(CheckCheckpointMemory(GpuNeed(100 * kGB)));
  // Exactly what is needed is enough.
  EXPECT_OK(CheckCheckpointMemory(GpuNeed(34400 * kMB)));
  // Unknown (no MemAvailable): not checked.
  CheckpointMemoryNeed need = GpuNeed(0);
  need.host_available_bytes.reset();
  EXPECT_OK(CheckCheckpointMemory(need));
}

TEST(HostMemory, JustDoesNotFit) {
  const Status s = CheckCheckpointMemory(GpuNeed(34400 * kMB - 1));
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_EQ(ErrnoFromStatus(s), ENOMEM);
  EXPECT_EQ(s.message(),
            "not enough host memory for a checkpoint of process 123: it needs 34.4 GB (32.0 GB of "
            "device memory the driver moves into host memory, 2.4 GB of staging) and 34.4 GB is "
            "available; free memory, or lower --staging-memory");
}

TEST(HostMemory, StagingAloneWithoutAGpu) {
  CheckpointMemoryNeed need;
  need.pid = 9;
  need.staging = {0, 256 * kMB, {}};
  need.host_available_bytes = 100 * kMB;
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_EQ(s.message(),
            "not enough host memory for a checkpoint of process 9: it needs 256.0 MB (256.0 MB of "
            "staging) and 100.0 MB is available; free memory, or lower --staging-memory");
}

TEST(CgroupMemory, DeviceMemoryAgainstTheProcessCgroup) {
  CheckpointMemoryNeed need = GpuNeed(100 * kGB);
  // Its cgroup has 40 GB, 10 GB used: 30 GB left, less than 32 GB.
  need.device_memory[0].cgroup = Limited("/job.slice/train.scope", 40 * kGB, 10 * kGB);
  // gpuckptfs's own cgroup has room for the staging.
  need.staging.cgroup = Limited("/system.slice/gpuckptfs.service", 8 * kGB, 1 * kGB);
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_EQ(s.message(),
            "not enough memory in the memory cgroup /job.slice/train.scope for a checkpoint of "
            "process 123: it needs 32.0 GB there (32.0 GB of device memory the driver moves into "
            "the host memory of process 123) and its limit of 40.0 GB leaves 30.0 GB; raise its "
            "limit, or free memory in it");
  // With 2 GB more room it fits.
  need.device_memory[0].cgroup = Limited("/job.slice/train.scope", 42 * kGB, 10 * kGB);
  EXPECT_OK(CheckCheckpointMemory(need));
}

TEST(CgroupMemory, DeviceMemoryAgainstAnAncestorOfTheProcessCgroup) {
  CheckpointMemoryNeed need = GpuNeed(100 * kGB);
  need.device_memory[0].cgroup = {CgroupLimit{"/job.slice/train.scope", 100 * kGB, 0},
                                  CgroupLimit{"/job.slice", 64 * kGB, 40 * kGB}};
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_NE(s.message().find("memory cgroup /job.slice for"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("leaves 24.0 GB"), std::string::npos) << s.message();
}

TEST(CgroupMemory, GpuProcessesSharingACgroupAddUp) {
  CheckpointMemoryNeed need;
  need.pid = 10;
  need.host_available_bytes = 1000 * kGB;
  // Two ranks, 20 GB each, in one cgroup with 30 GB left: each alone
  // would fit.
  need.device_memory = {{11, 20 * kGB, Limited("/job", 50 * kGB, 20 * kGB)},
                        {12, 20 * kGB, Limited("/job", 50 * kGB, 20 * kGB)}};
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_NE(s.message().find("40.0 GB of device memory the driver moves into the host memory of "
                             "processes 11, 12"),
            std::string::npos)
      << s.message();
  // A process without device memory charges nothing.
  need.device_memory[1].bytes = 0;
  EXPECT_OK(CheckCheckpointMemory(need));
}

TEST(CgroupMemory, StagingAgainstTheDaemonCgroup) {
  CheckpointMemoryNeed need;
  need.pid = 4242;
  need.host_available_bytes = 20 * kGB;
  need.staging = {0, 268 * kMB, Limited("/process_api/x/gpuckpt-room", 200 * kMB, 50 * kMB)};
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_EQ(s.message(),
            "not enough memory in the memory cgroup /process_api/x/gpuckpt-room for a checkpoint "
            "of process 4242: it needs 268.0 MB there (268.0 MB of staging for gpuckptfs) and its "
            "limit of 200.0 MB leaves 150.0 MB; lower --staging-memory, or raise its limit");
  // Just fits.
  need.staging.bytes = 150 * kMB;
  EXPECT_OK(CheckCheckpointMemory(need));
  need.staging.bytes = 150 * kMB + 1;
  EXPECT_CODE(CheckCheckpointMemory(need), StatusCode::kNoMemory);
}

TEST(CgroupMemory, AShareOfBothInOneContainer) {
  // gpuckptfs and the job in one container with 33 GB left: the device
  // memory (32 GB) and the staging (2.4 GB) fit apart, 34.4 GB together
  // does not.
  CheckpointMemoryNeed need = GpuNeed(100 * kGB);
  need.device_memory[0].cgroup = {CgroupLimit{"/ctr/job", 35 * kGB, 0},
                                  CgroupLimit{"/ctr", 40 * kGB, 7 * kGB}};
  need.staging.cgroup = {CgroupLimit{"/ctr", 40 * kGB, 7 * kGB}};
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_NE(s.message().find("memory cgroup /ctr for a checkpoint of process 123: it needs 34.4 GB "
                             "there (32.0 GB of device memory the driver moves into the host "
                             "memory of process 123, 2.4 GB of staging for gpuckptfs)"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("raise its limit, or lower --staging-memory"), std::string::npos);
  // With 2 GB more, both fit.
  need.device_memory[0].cgroup[1].limit_bytes = 42 * kGB;
  need.staging.cgroup[0].limit_bytes = 42 * kGB;
  EXPECT_OK(CheckCheckpointMemory(need));
}

TEST(CgroupMemory, CgroupNamesAreShownOnOneLine) {
  CheckpointMemoryNeed need;
  need.pid = 5;
  need.staging = {0, 2 * kMB, Limited("/user.slice/a\nlast: ok\xff", 1 * kMB, 0)};
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("/user.slice/a?last: ok\\xFF for"), std::string::npos) << s.message();
}

TEST(CgroupMemory, HostCheckedFirst) {
  CheckpointMemoryNeed need = GpuNeed(1 * kGB);
  need.staging.cgroup = Limited("/d", 1 * kMB, 0);
  const Status s = CheckCheckpointMemory(need);
  ASSERT_CODE(s, StatusCode::kNoMemory);
  EXPECT_EQ(s.message().rfind("not enough host memory", 0), 0u) << s.message();
}

TEST(Staging, PrefaultIsTheImageCappedAtTheStagingMemory) {
  EXPECT_EQ(StagingPrefaultBytes(100, 50, 1000), 150u);
  EXPECT_EQ(StagingPrefaultBytes(800, 500, 1000), 1000u);
  EXPECT_EQ(StagingPrefaultBytes(0, 0, 1000), 0u);
}

TEST(StoreSpace, WorstCaseHasAMargin) {
  EXPECT_EQ(WorstCaseStoreBytes(0), uint64_t{8} << 20);
  EXPECT_EQ(WorstCaseStoreBytes(64 * kGB), 65 * kGB + (uint64_t{8} << 20));
}

TEST(StoreSpace, FitsAndJustDoesNot) {
  const uint64_t memory = 300 * kMB;
  const uint64_t worst = WorstCaseStoreBytes(memory);
  EXPECT_OK(CheckStoreSpace(7, memory, worst));
  const Status s = CheckStoreSpace(7, memory, worst - 1);
  ASSERT_CODE(s, StatusCode::kNoSpace);
  EXPECT_EQ(ErrnoFromStatus(s), ENOSPC);
  EXPECT_EQ(s.message(),
            "the store's disk has 313.1 MB free and a checkpoint of process 7 may add up to "
            "313.1 MB (its memory and device memory, counted as new): free space, or rm -r some "
            "checkpoints and run gc");
}

TEST(NoMemoryCode, MapsToEnomemBothWays) {
  EXPECT_EQ(ErrnoFromStatus(Status::NoMemory("x")), ENOMEM);
  EXPECT_EQ(StatusFromErrno(ENOMEM, "mmap").code(), StatusCode::kNoMemory);
  EXPECT_EQ(StatusCodeName(StatusCode::kNoMemory), "NoMemory");
  EXPECT_EQ(ResultLabel(StatusCode::kNoMemory), "no_memory");
}

TEST(Bytes, ForPeople) {
  EXPECT_EQ(BytesForPeople(0), "0.0 MB");
  EXPECT_EQ(BytesForPeople(999 * kMB), "999.0 MB");
  EXPECT_EQ(BytesForPeople(kGB), "1.0 GB");
  EXPECT_EQ(BytesForPeople(34400 * kMB), "34.4 GB");
}

}  // namespace
}  // namespace gpuckpt
