// The system GPU backend (core/gpu/system_gpu_backend.h) without a GPU:
// with no driver it is off and says why, and refuses what would lose GPU
// state; with the stand-in libcuda (tests/unit/fake_libcuda.c) it sets up
// CRIU's plugin and gpuckpt's cuda-checkpoint, validates and completes a
// --gpu-map, and brings a process a failed checkpoint left checkpointed
// back to running; with a fabricated KFD sysfs it sets up amdgpu_plugin.
// The real driver path runs on the GPU machine (tests/gpu/).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/gpu/group_lock.h"
#include "core/gpu/system_gpu_backend.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;

const std::string kGpu0 = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f";  // the fake's device 0
const std::string kGpu1 = "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f";  // and device 1
const std::string kOther = "GPU-ffffffff-0405-0607-0809-0a0b0c0d0e0f";

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

class SystemGpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeDirs(plugins_);
    testing::WriteFile(plugins_ + "/cuda_plugin.so", "plugin");
    testing::WriteFile(plugins_ + "/amdgpu_plugin.so", "plugin");
    testing::MakeDirs(libexec_);
    testing::WriteFile(libexec_ + "/cuda-checkpoint", "#!/bin/sh\n", 0755);
    testing::MakeDirs(state_);
    setenv("FAKE_CUDA_STATE_DIR", state_.c_str(), 1);
    unsetenv("GPUCKPT_LIBCUDA");
  }
  void TearDown() override {
    unsetenv("GPUCKPT_LIBCUDA");
    unsetenv("FAKE_CUDA_STATE_DIR");
  }

  std::unique_ptr<GpuBackend> Make(bool fake_cuda, const std::string& sysfs = "/nonexistent") {
    if (fake_cuda)
      setenv("GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_PATH, 1);
    else
      setenv("GPUCKPT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    SystemGpuBackendOptions options;
    options.criu_plugin_dir = plugins_;
    options.cuda_checkpoint_dir = libexec_;
    options.work_dir = work_;
    options.sysfs_root = sysfs;
    return MakeSystemGpuBackend(options);
  }

  TempDir tmp_;
  const std::string plugins_ = tmp_.Sub("criu-plugins");
  const std::string libexec_ = tmp_.Sub("libexec");
  const std::string work_ = tmp_.Sub("work");
  const std::string state_ = tmp_.Sub("fake-cuda");
};

TEST_F(SystemGpuBackendTest, WithoutDriverItIsOffAndSaysWhy) {
  auto gpu = Make(false);
  EXPECT_EQ(gpu->stacks(), GpuStacks::kNone);
  const std::string why = gpu->unavailable_reason();
  EXPECT_NE(why.find("CUDA: "), std::string::npos) << why;
  EXPECT_NE(why.find("ROCm: "), std::string::npos) << why;
  EXPECT_EQ(gpu->driver_version(), "");
  // A process without GPU devices is dumped with no plugin.
  ASSERT_OK_AND_ASSIGN(CriuGpuSetup setup, gpu->SetupForCheckpoint({getpid()}, {}));
  EXPECT_EQ(setup.stacks, GpuStacks::kNone);
  EXPECT_TRUE(setup.plugin_dir.empty());
  EXPECT_TRUE(setup.environment.empty());
  ASSERT_OK_AND_ASSIGN(GpuProcessState state, gpu->Describe(getpid()));
  EXPECT_EQ(state.state, GpuState::kNone);
  // A CUDA checkpoint cannot be restored here; a map needs CUDA.
  GpuRestoreOptions cuda;
  cuda.checkpoint_stacks = GpuStacks::kCuda;
  EXPECT_CODE(gpu->SetupForRestore(cuda).status(), StatusCode::kUnavailable);
  GpuRestoreOptions map;
  map.gpu_map = kGpu0 + "=" + kGpu1;
  EXPECT_CODE(gpu->SetupForRestore(map).status(), StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(CriuGpuSetup plain, gpu->SetupForRestore({}));
  EXPECT_TRUE(plain.plugin_dir.empty());
  EXPECT_OK(gpu->Release({getpid()}));
}

TEST_F(SystemGpuBackendTest, CudaRestoreGetsPluginPathAndCompletedMap) {
  auto gpu = Make(true);
  ASSERT_EQ(gpu->stacks(), GpuStacks::kCuda) << gpu->unavailable_reason();
  EXPECT_EQ(gpu->unavailable_reason(), "");
  // No NVML here: the CUDA version alone.
  EXPECT_EQ(gpu->driver_version(), "CUDA 13.0");
  GpuRestoreOptions options;
  options.checkpoint_stacks = GpuStacks::kCuda;
  options.checkpoint_gpus = {kGpu0, kGpu1};
  ASSERT_OK_AND_ASSIGN(CriuGpuSetup same, gpu->SetupForRestore(options));
  EXPECT_EQ(same.stacks, GpuStacks::kCuda);
  EXPECT_EQ(same.plugin_dir, work_ + "/plugins-cuda");
  char target[4096] = {};
  ASSERT_GT(readlink((same.plugin_dir + "/cuda_plugin.so").c_str(), target, sizeof(target) - 1), 0);
  EXPECT_EQ(std::string(target), plugins_ + "/cuda_plugin.so");
  struct stat st {};
  EXPECT_NE(stat((same.plugin_dir + "/amdgpu_plugin.so").c_str(), &st), 0)
      << "only the CUDA plugin is loaded for a CUDA checkpoint";
  EXPECT_EQ(same.path_prepend, std::vector<std::string>{libexec_});
  EXPECT_TRUE(same.environment.empty());

  // Swapping the two GPUs; mapping one onto itself leaves the other to be
  // added as it was.
  options.gpu_map = kGpu0 + "=" + kGpu1 + "," + kGpu1 + "=" + kGpu0;
  ASSERT_OK_AND_ASSIGN(CriuGpuSetup swapped, gpu->SetupForRestore(options));
  EXPECT_TRUE(Has(swapped.environment, "GPUCKPT_GPU_MAP=" + options.gpu_map))
      << ::testing::PrintToString(swapped.environment);
  options.gpu_map = kGpu1 + "=" + kGpu1;
  ASSERT_OK_AND_ASSIGN(CriuGpuSetup one, gpu->SetupForRestore(options));
  EXPECT_TRUE(
      Has(one.environment, "GPUCKPT_GPU_MAP=" + kGpu1 + "=" + kGpu1 + "," + kGpu0 + "=" + kGpu0))
      << ::testing::PrintToString(one.environment);

  for (const std::string& bad : {
           kGpu0 + "=" + kOther,        // not a GPU of this machine
           kOther + "=" + kGpu0,        // not a GPU of the checkpoint
           kGpu1 + "=" + kGpu0,         // GPU 0 is taken and GPU 0's own is left unmapped
           std::string("GPU-1=GPU-2"),  // not UUIDs
           kGpu0 + "=" + kGpu1 + ",",   // a stray comma
           kGpu0 + "=" + kGpu1 + "," + kGpu0 + "=" + kGpu0,  // GPU 0 twice
       }) {
    SCOPED_TRACE(bad);
    options.gpu_map = bad;
    EXPECT_CODE(gpu->SetupForRestore(options).status(), StatusCode::kInvalidArgument);
  }
  // A checkpoint without GPUs takes no map.
  GpuRestoreOptions none;
  none.checkpoint_stacks = GpuStacks::kNone;
  none.gpu_map = kGpu0 + "=" + kGpu1;
  EXPECT_CODE(gpu->SetupForRestore(none).status(), StatusCode::kInvalidArgument);
}

TEST_F(SystemGpuBackendTest, ReleaseBringsCheckpointedProcessesBack) {
  auto gpu = Make(true);
  ASSERT_EQ(gpu->stacks(), GpuStacks::kCuda) << gpu->unavailable_reason();
  testing::WriteFile(state_ + "/4242", "state=checkpointed\n");
  testing::WriteFile(state_ + "/4243", "state=locked\n");
  testing::WriteFile(state_ + "/4244", "state=running\n");
  EXPECT_OK(gpu->Release({4242, 4243, 4244, 4245 /* no CUDA */}));
  for (const char* pid : {"4242", "4243", "4244"}) {
    const std::string state = testing::ReadFile(state_ + "/" + pid);
    EXPECT_NE(state.find("state=running"), std::string::npos) << pid << ": " << state;
  }
}

TEST_F(SystemGpuBackendTest, MissingPluginOrCommandTurnsCudaOff) {
  unlink((libexec_ + "/cuda-checkpoint").c_str());
  auto gpu = Make(true);
  EXPECT_EQ(gpu->stacks(), GpuStacks::kNone);
  EXPECT_NE(gpu->unavailable_reason().find("cuda-checkpoint"), std::string::npos)
      << gpu->unavailable_reason();
  testing::WriteFile(libexec_ + "/cuda-checkpoint", "#!/bin/sh\n", 0755);
  unlink((plugins_ + "/cuda_plugin.so").c_str());
  auto no_plugin = Make(true);
  EXPECT_NE(no_plugin->unavailable_reason().find("cuda_plugin.so"), std::string::npos)
      << no_plugin->unavailable_reason();
}

TEST_F(SystemGpuBackendTest, AmdGpuFromSysfsGetsTheAmdPlugin) {
  const std::string sysfs = tmp_.Sub("sys");
  const std::string node = sysfs + "/class/kfd/kfd/topology/nodes/1";
  testing::MakeDirs(node + "/mem_banks/0");
  testing::WriteFile(node + "/gpu_id", "4660\n");
  testing::WriteFile(node + "/name", "aldebaran\n");
  testing::WriteFile(node + "/properties",
                     "simd_count 416\nvendor_id 4098\ndevice_id 29711\n"
                     "gfx_target_version 90010\nunique_id 1234\ndrm_render_minor 128\n");
  testing::WriteFile(node + "/mem_banks/0/properties", "heap_type 1\nsize_in_bytes 68702699520\n");
  auto gpu = Make(false, sysfs);
  ASSERT_EQ(gpu->stacks(), GpuStacks::kRocm) << gpu->unavailable_reason();
  GpuRestoreOptions options;
  options.checkpoint_stacks = GpuStacks::kRocm;
  ASSERT_OK_AND_ASSIGN(CriuGpuSetup setup, gpu->SetupForRestore(options));
  EXPECT_EQ(setup.stacks, GpuStacks::kRocm);
  EXPECT_EQ(setup.plugin_dir, work_ + "/plugins-rocm");
  struct stat st {};
  EXPECT_EQ(stat((setup.plugin_dir + "/amdgpu_plugin.so").c_str(), &st), 0);
  EXPECT_TRUE(setup.path_prepend.empty()) << "no cuda-checkpoint for ROCm";
  options.gpu_map = kGpu0 + "=" + kGpu1;
  EXPECT_CODE(gpu->SetupForRestore(options).status(), StatusCode::kInvalidArgument);
  options.checkpoint_stacks = GpuStacks::kCuda;
  options.gpu_map.clear();
  EXPECT_CODE(gpu->SetupForRestore(options).status(), StatusCode::kUnavailable);
}

// The ranks of one job are locked together: when one cannot be locked in
// time (its collective waits on a peer), the ones already locked are
// unlocked so the job can move on, and all are tried again.
TEST_F(SystemGpuBackendTest, GroupLockRetriesUntilAllAreLockedTogether) {
  setenv("GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_PATH, 1);
  ASSERT_OK_AND_ASSIGN(auto cuda, CudaDriver::Load());
  testing::WriteFile(state_ + "/5001", "state=running\n");
  testing::WriteFile(state_ + "/5002", "state=running\nlock_timeouts=2\n");
  GroupLockOptions options;
  options.timeout_ms = 10000;
  options.first_attempt_ms = 10;
  options.backoff_ms = 1;
  EXPECT_OK(LockTogether(*cuda, {5001, 5002}, options));
  for (const char* pid : {"5001", "5002"}) {
    const std::string state = testing::ReadFile(state_ + "/" + pid);
    EXPECT_NE(state.find("state=locked"), std::string::npos) << pid << ": " << state;
  }
  // Each attempt doubles the lock timeout; 5001, locked in the first two,
  // was let go each time 5002 was not.
  EXPECT_EQ(testing::ReadFile(state_ + "/5001.calls"),
            "lock 10\nunlock\nlock 20\nunlock\nlock 40\n");
  EXPECT_EQ(testing::ReadFile(state_ + "/5002.calls"), "lock 10\nlock 20\nlock 40\n");
}

TEST_F(SystemGpuBackendTest, GroupLockGivesUpLeavingAllRunning) {
  setenv("GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_PATH, 1);
  ASSERT_OK_AND_ASSIGN(auto cuda, CudaDriver::Load());
  testing::WriteFile(state_ + "/5001", "state=running\n");
  testing::WriteFile(state_ + "/5002", "state=running\nlock_timeouts=100000\n");
  GroupLockOptions options;
  options.timeout_ms = 200;
  options.first_attempt_ms = 10;
  options.backoff_ms = 1;
  Status s = LockTogether(*cuda, {5001, 5002}, options);
  EXPECT_CODE(s, StatusCode::kAborted);
  EXPECT_NE(s.message().find("not locked together within 200 ms"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("5002 kept GPU work in flight"), std::string::npos) << s.message();
  for (const char* pid : {"5001", "5002"}) {
    const std::string state = testing::ReadFile(state_ + "/" + pid);
    EXPECT_NE(state.find("state=running"), std::string::npos) << pid << ": " << state;
  }

  // A process without CUDA state (gone, or never used CUDA) is no timeout:
  // no second attempt, and the other is let go at once.
  unlink((state_ + "/5001.calls").c_str());
  Status gone = LockTogether(*cuda, {5001, 5003}, options);
  EXPECT_FALSE(gone.ok());
  EXPECT_NE(gone.code(), StatusCode::kAborted) << gone.message();
  EXPECT_EQ(testing::ReadFile(state_ + "/5001.calls"), "lock 10\nunlock\n");
  EXPECT_NE(testing::ReadFile(state_ + "/5001").find("state=running"), std::string::npos);
}

}  // namespace
}  // namespace gpuckpt
