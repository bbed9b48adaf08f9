// Tests of the CUDA side of core/gpu without a GPU: GPU UUIDs and device
// maps, device ranges (/proc/PID/maps and their JSON file), CudaDriver on a
// stand-in driver (tests/unit/fake_libcuda.c), and the cuda-checkpoint
// command run as CRIU's cuda_plugin runs it. The real driver is tested on
// the GPU machine (tests/gpu/).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/gpu/cuda_driver.h"
#include "core/gpu/device_ranges.h"
#include "core/gpu/gpu_uuid.h"
#include "core/gpu/lock_events.h"
#include "tests/unit/test_util.h"

extern char** environ;

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::ReadFile;
using ::gpuckpt::testing::TempDir;
using ::gpuckpt::testing::WriteFile;

// Whether `text` contains `part`, saying what it holds when not.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

constexpr char kUuidA[] = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f";
constexpr char kUuidB[] = "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f";
constexpr char kUuidC[] = "GPU-aabbccdd-eeff-0011-2233-445566778899";

// ---- GPU UUIDs and device maps -----------------------------------------------

TEST(GpuUuidTest, ParsesAnyCaseWithOrWithoutPrefix) {
  for (const char* text :
       {"GPU-AABBCCDD-EEFF-0011-2233-445566778899", "gpu-aabbccdd-eeff-0011-2233-445566778899",
        "aabbccdd-EEFF-0011-2233-445566778899"}) {
    ASSERT_OK_AND_ASSIGN(GpuUuid uuid, ParseGpuUuid(text));
    EXPECT_EQ(uuid[0], 0xaa);
    EXPECT_EQ(uuid[15], 0x99);
    EXPECT_EQ(FormatGpuUuid(uuid), kUuidC) << text;
  }
}

TEST(GpuUuidTest, RejectsMalformed) {
  for (const char* text :
       {"", "GPU-", "GPU-aabbccdd-eeff-0011-2233-44556677889",
        "GPU-aabbccdd-eeff-0011-2233-4455667788990", "GPU-aabbccdd-eeff-0011-2233-44556677889g",
        "GPU-aabbccdd0eeff-0011-2233-445566778899", "GPU-aabbccd-deeff-0011-2233-445566778899",
        "GPU--aabbccdd-eeff-0011-2233-445566778899", "MIG-aabbccdd-eeff-0011-2233-445566778899",
        " GPU-aabbccdd-eeff-0011-2233-445566778899"}) {
    Result<GpuUuid> r = ParseGpuUuid(text);
    ASSERT_CODE(r, StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(Contains(r.status().message(), "invalid GPU UUID")) << text;
    EXPECT_TRUE(Contains(r.status().message(), "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"));
  }
}

TEST(GpuUuidTest, LongBadInputIsQuotedShort) {
  Result<GpuUuid> r = ParseGpuUuid(std::string(10000, 'x'));
  ASSERT_CODE(r, StatusCode::kInvalidArgument);
  EXPECT_LT(r.status().message().size(), 200u);
}

TEST(GpuMapTest, ParsesAndFormats) {
  const std::string text = std::string(kUuidA) + "=" + kUuidB + "," + kUuidB + "=" + kUuidC;
  ASSERT_OK_AND_ASSIGN(std::vector<GpuUuidPair> map, ParseGpuMap(text));
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(FormatGpuUuid(map[0].old_uuid), kUuidA);
  EXPECT_EQ(FormatGpuUuid(map[0].new_uuid), kUuidB);
  EXPECT_EQ(FormatGpuUuid(map[1].old_uuid), kUuidB);
  EXPECT_EQ(FormatGpuUuid(map[1].new_uuid), kUuidC);
  EXPECT_EQ(FormatGpuMap(map), text);
  EXPECT_EQ(FormatGpuMap({}), "");
}

TEST(GpuMapTest, AllowsBlanksAndIdentity) {
  const std::string text = std::string(" ") + kUuidA + " = " + kUuidA + " ,\t" + kUuidB + "=" +
                           "aabbccdd-eeff-0011-2233-445566778899 ";
  ASSERT_OK_AND_ASSIGN(std::vector<GpuUuidPair> map, ParseGpuMap(text));
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(map[0].old_uuid, map[0].new_uuid);
  EXPECT_EQ(FormatGpuUuid(map[1].new_uuid), kUuidC);
}

TEST(GpuMapTest, RejectsEachKindOfMistakeWithItsOwnMessage) {
  const std::string a = kUuidA, b = kUuidB, c = kUuidC;
  struct Case {
    std::string text;
    std::string expect;
  };
  const Case cases[] = {
      {"", "empty GPU map"},
      {"  ", "empty GPU map"},
      {a, "expected OLD=NEW"},
      {a + "=" + b + "=" + c, "expected OLD=NEW"},
      {a + "=GPU-12", "invalid GPU UUID \"GPU-12\""},
      {"nope=" + b, "invalid GPU UUID \"nope\""},
      {"," + a + "=" + b, "entry 1 is empty"},
      {a + "=" + b + ",", "entry 2 is empty"},
      {a + "=" + b + ",," + b + "=" + c, "entry 2 is empty"},
      {a + "=" + b + "," + a + "=" + c, "names old GPU " + a + " twice"},
      {a + "=" + c + "," + b + "=" + c, "two GPUs onto new GPU " + c},
  };
  for (const Case& tc : cases) {
    Result<std::vector<GpuUuidPair>> r = ParseGpuMap(tc.text);
    ASSERT_CODE(r, StatusCode::kInvalidArgument) << tc.text;
    EXPECT_TRUE(Contains(r.status().message(), tc.expect)) << tc.text;
  }
}

// ---- device ranges ------------------------------------------------------------

Mapping M(uint64_t start, uint64_t end, std::string perms = "rw-p", std::string path = "",
          uint64_t offset = 0) {
  return Mapping{start, end, std::move(perms), offset, std::move(path)};
}

TEST(DeviceRangesTest, ParsesMapsLines) {
  const std::string text =
      "55d0c0a00000-55d0c0a21000 r-xp 00002000 fd:01 1234                       /usr/bin/my "
      "prog\n"
      "55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0                          [heap]\n"
      "7f0000000000-7f0000200000 rw-s 00000000 00:05 99                         /dev/nvidia-uvm "
      "(deleted)\n"
      "7f0000200000-7f0000400000 ---p 00000000 00:00 0 \n"
      "7ffff7ff0000-7ffff7ff1000 rw-p 00000000 00:00 0\n"
      "\n";
  ASSERT_OK_AND_ASSIGN(std::vector<Mapping> m, ParseMappings(text));
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], M(0x55d0c0a00000, 0x55d0c0a21000, "r-xp", "/usr/bin/my prog", 0x2000));
  EXPECT_EQ(m[1].path, "[heap]");
  EXPECT_EQ(m[2].path, "/dev/nvidia-uvm (deleted)");
  EXPECT_EQ(m[2].perms, "rw-s");
  EXPECT_EQ(m[3], M(0x7f0000200000, 0x7f0000400000, "---p"));
  EXPECT_EQ(m[4], M(0x7ffff7ff0000, 0x7ffff7ff1000));
}

TEST(DeviceRangesTest, MalformedMapsLineNamesTheLine) {
  for (const char* text : {"1000-2000 rw-p 0 00:00 0\nzz-3000 rw-p 0 00:00 0\n",
                           "1000-2000 rw-p 0 00:00 0\n2000-1000 rw-p 0 00:00 0\n",
                           "1000-2000 rw-p 0 00:00 0\n2000-3000 rwxx 0 00:00 0\n",
                           "1000-2000 rw-p 0 00:00 0\n2000-3000 rw-p 0 0000 0\n",
                           "1000-2000 rw-p 0 00:00 0\n2000-3000 rw-p\n"}) {
    Result<std::vector<Mapping>> r = ParseMappings(text);
    ASSERT_CODE(r, StatusCode::kIOError) << text;
    EXPECT_TRUE(Contains(r.status().message(), "maps line 2")) << text;
  }
}

TEST(DeviceRangesTest, NewMappingsReportsOnlyWhatIsNew) {
  const std::vector<Mapping> before = {M(0x1000, 0x3000), M(0x3000, 0x5000, "r--p", "/lib/a.so"),
                                       M(0x8000, 0xa000, "---p"),
                                       M(0x10000, 0x14000, "rw-s", "/dev/nvidia-uvm")};
  // Nothing changed; something removed.
  EXPECT_TRUE(NewMappings(before, before).empty());
  EXPECT_TRUE(NewMappings(before, {before[0]}).empty());
  // A new mapping is reported whole.
  std::vector<Mapping> after = before;
  after.push_back(M(0x20000, 0x23000));
  EXPECT_EQ(NewMappings(before, after), (std::vector<Mapping>{M(0x20000, 0x23000)}));
  // A mapping that grew (the kernel merged a new neighbour into it): the new
  // part only, on both sides.
  after = before;
  after[0] = M(0x0800, 0x3000);
  EXPECT_EQ(NewMappings(before, after), (std::vector<Mapping>{M(0x0800, 0x1000)}));
  after = before;
  after[3] = M(0x10000, 0x18000, "rw-s", "/dev/nvidia-uvm", 0);
  EXPECT_EQ(NewMappings(before, after),
            (std::vector<Mapping>{M(0x14000, 0x18000, "rw-s", "/dev/nvidia-uvm", 0x4000)}));
  // Split by mprotect with the same permissions: nothing new.
  after = before;
  after[0] = M(0x1000, 0x2000);
  after.insert(after.begin() + 1, M(0x2000, 0x3000));
  EXPECT_TRUE(NewMappings(before, after).empty());
  // A reservation that became accessible, and device memory replaced by
  // anonymous host memory at the same addresses.
  after = before;
  after[2] = M(0x8000, 0xa000, "rw-p");
  after[3] = M(0x10000, 0x14000, "rw-p");
  EXPECT_EQ(NewMappings(before, after),
            (std::vector<Mapping>{M(0x8000, 0xa000), M(0x10000, 0x14000)}));
  // `before` out of order gives the same answer.
  std::vector<Mapping> shuffled(before.rbegin(), before.rend());
  EXPECT_EQ(NewMappings(shuffled, after), NewMappings(before, after));
}

TEST(DeviceRangesTest, ReadMappingsSeesANewMappingOfThisProcess) {
  ASSERT_OK_AND_ASSIGN(std::vector<Mapping> before, ReadMappings(getpid()));
  EXPECT_FALSE(before.empty());
  const size_t len = 7 * static_cast<size_t>(getpagesize());
  void* p = mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  Result<std::vector<Mapping>> after = ReadMappings(getpid());
  munmap(p, len);
  ASSERT_OK(after);
  const uint64_t start = reinterpret_cast<uintptr_t>(p);
  std::vector<Mapping> added = NewMappings(before, after.value());
  bool found = false;
  for (const Mapping& m : added) found |= m.start <= start && m.end >= start + len;
  EXPECT_TRUE(found) << "the new mapping at " << std::hex << start << " was not reported";
}

TEST(DeviceRangesTest, ReadMappingsOfAGoneProcess) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  Result<std::vector<Mapping>> r = ReadMappings(child);
  ASSERT_CODE(r, StatusCode::kNoSuchProcess);
  EXPECT_TRUE(Contains(r.status().message(), "pid " + std::to_string(child)));
}

TEST(DeviceRangesTest, FileRoundTrip) {
  TempDir dir;
  EXPECT_EQ(DeviceRangesFileName(42), "cuda-ranges-42.json");
  const std::string path = dir.Sub(DeviceRangesFileName(42));
  DeviceRanges ranges{42,
                      {M(0x1000, 0x3000), M(0x7f0000000000, 0xffffffffffff000, "r--s",
                                            "/dev/nvidia0 \"odd\" name", 0x1000)}};
  ASSERT_OK(WriteDeviceRangesFile(path, ranges));
  ASSERT_OK_AND_ASSIGN(DeviceRanges read, ReadDeviceRangesFile(path));
  EXPECT_EQ(read.pid, 42);
  EXPECT_EQ(read.ranges, ranges.ranges);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_EQ(::gpuckpt::testing::ListDir(dir.path()),
            std::vector<std::string>{"cuda-ranges-42.json"});
  // Overwriting replaces; an empty list is fine.
  ASSERT_OK(WriteDeviceRangesFile(path, DeviceRanges{42, {}}));
  ASSERT_OK_AND_ASSIGN(read, ReadDeviceRangesFile(path));
  EXPECT_TRUE(read.ranges.empty());
  // The documented shape, written by hand, reads; unknown fields are ignored.
  WriteFile(path, R"({"version":1,"pid":7,"later":true,"ranges":[)"
                  R"({"start":4096,"end":8192,"perms":"rw-p","offset":0,"path":"","x":1}]})");
  ASSERT_OK_AND_ASSIGN(read, ReadDeviceRangesFile(path));
  EXPECT_EQ(read.pid, 7);
  EXPECT_EQ(read.ranges, (std::vector<Mapping>{M(4096, 8192)}));
}

TEST(DeviceRangesTest, WriteIntoMissingDirectoryFails) {
  TempDir dir;
  Status s = WriteDeviceRangesFile(dir.Sub("no/such.json"), DeviceRanges{1, {}});
  EXPECT_CODE(s, StatusCode::kNotFound);
}

TEST(DeviceRangesTest, MalformedFilesAreRejectedWithTheReason) {
  TempDir dir;
  const std::string path = dir.Sub("r.json");
  EXPECT_CODE(ReadDeviceRangesFile(path), StatusCode::kNotFound);
  auto range = [](const std::string& fields) {
    return R"({"version":1,"pid":5,"ranges":[)" + fields + "]}";
  };
  const std::string ok = R"({"start":4096,"end":8192,"perms":"rw-p","offset":0,"path":""})";
  struct Case {
    std::string text;
    std::string expect;
  };
  const Case cases[] = {
      {"", "not JSON"},
      {"{\"version\":1,", "not JSON"},
      {"[1,2]", "not a JSON object"},
      {R"({"pid":5,"ranges":[]})", "\"version\""},
      {R"({"version":2,"pid":5,"ranges":[]})", "unsupported version 2"},
      {R"({"version":-1,"pid":5,"ranges":[]})", "unsupported version"},
      {R"({"version":1,"ranges":[]})", "\"pid\""},
      {R"({"version":1,"pid":0,"ranges":[]})", "\"pid\""},
      {R"({"version":1,"pid":-3,"ranges":[]})", "\"pid\""},
      {R"({"version":1,"pid":99999999999,"ranges":[]})", "\"pid\""},
      {R"({"version":1,"pid":"5","ranges":[]})", "\"pid\""},
      {R"({"version":1,"pid":5})", "\"ranges\""},
      {R"({"version":1,"pid":5,"ranges":{}})", "\"ranges\""},
      {range("1"), "ranges[0]: not an object"},
      {range(R"({"end":8192,"perms":"rw-p","offset":0,"path":""})"),
       "ranges[0]: no unsigned \"start\""},
      {range(R"({"start":-1,"end":8192,"perms":"rw-p","offset":0,"path":""})"), "\"start\""},
      {range(R"({"start":1.5,"end":8192,"perms":"rw-p","offset":0,"path":""})"), "\"start\""},
      {range(R"({"start":4096,"end":4096,"perms":"rw-p","offset":0,"path":""})"), "not below end"},
      {range(R"({"start":4096,"end":8192,"perms":"rwzp","offset":0,"path":""})"), "\"perms\""},
      {range(R"({"start":4096,"end":8192,"perms":"rw-p","path":""})"), "\"offset\""},
      {range(R"({"start":4096,"end":8192,"perms":"rw-p","offset":0,"path":3})"), "\"path\""},
      {range(R"({"start":4096,"end":8192,"perms":"rw-p","offset":0,"path":"a\u0000b"})"), "NUL"},
      {range(ok + "," + ok), "ranges[1]: overlaps"},
  };
  for (const Case& tc : cases) {
    WriteFile(path, tc.text);
    Result<DeviceRanges> r = ReadDeviceRangesFile(path);
    ASSERT_CODE(r, StatusCode::kCorruption) << tc.text;
    EXPECT_TRUE(Contains(r.status().message(), path)) << tc.text;
    EXPECT_TRUE(Contains(r.status().message(), tc.expect)) << tc.text;
  }
}

// ---- CudaDriver on the stand-in driver -----------------------------------------

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Key/value lines of the fake driver's state file for `pid`.
std::map<std::string, std::string> ReadFakeState(const TempDir& dir, int pid) {
  std::map<std::string, std::string> kv;
  std::string text = ReadFile(dir.Sub(std::to_string(pid)));
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    size_t eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

TEST(CudaDriverTest, NoDriverIsUnavailableWithAClearSentence) {
  {
    ScopedEnv env("GPUCKPT_LIBCUDA", std::nullopt);
    Result<std::unique_ptr<CudaDriver>> d = CudaDriver::Load();
    if (d.ok()) GTEST_SKIP() << "this machine has an NVIDIA driver";
    ASSERT_CODE(d, StatusCode::kUnavailable);
    EXPECT_TRUE(Contains(d.status().message(), "no NVIDIA driver: libcuda.so.1"));
  }
  ScopedEnv env("GPUCKPT_LIBCUDA", "/nonexistent/libcuda.so.1");
  Result<std::unique_ptr<CudaDriver>> d = CudaDriver::Load();
  ASSERT_CODE(d, StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.status().message(), "no NVIDIA driver: /nonexistent/libcuda.so.1"));
}

TEST(CudaDriverTest, ALibraryThatIsNotADriver) {
  ScopedEnv env("GPUCKPT_LIBCUDA", "libc.so.6");
  Result<std::unique_ptr<CudaDriver>> d = CudaDriver::Load();
  ASSERT_CODE(d, StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.status().message(), "lacks cuInit"));
}

TEST(CudaDriverTest, ADriverWithoutTheCheckpointApiIsTooOld) {
  ScopedEnv env("GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_NO_CKPT_PATH);
  ScopedEnv version("FAKE_CUDA_VERSION", "12040");
  Result<std::unique_ptr<CudaDriver>> d = CudaDriver::Load();
  ASSERT_CODE(d, StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.status().message(), "too old: CUDA 12.4"));
  EXPECT_TRUE(Contains(d.status().message(), "cuCheckpointProcess"));
  EXPECT_TRUE(Contains(d.status().message(), ">= 570"));
}

TEST(CudaDriverTest, CuInitFailure) {
  ScopedEnv env("GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_PATH);
  ScopedEnv init("FAKE_CUDA_INIT_ERROR", "100");
  Result<std::unique_ptr<CudaDriver>> d = CudaDriver::Load();
  ASSERT_CODE(d, StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.status().message(), "cuInit: CUDA_ERROR_NO_DEVICE"));
}

class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<CudaDriver>> d = CudaDriver::Load();
    ASSERT_OK(d);
    driver_ = std::move(d).value();
  }
  void SetState(int pid, const std::string& content) {
    WriteFile(state_.Sub(std::to_string(pid)), content);
  }

  TempDir state_{"gpuckpt-fake-cuda"};
  ScopedEnv lib_{"GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_PATH};
  ScopedEnv dir_{"FAKE_CUDA_STATE_DIR", state_.path()};
  std::unique_ptr<CudaDriver> driver_;
  const int pid_ = getpid();
};

TEST_F(FakeDriverTest, VersionAndDevices) {
  EXPECT_EQ(driver_->version(), 13000);
  EXPECT_EQ(driver_->version_string(), "13.0");
  ASSERT_OK_AND_ASSIGN(std::vector<CudaDevice> devices, driver_->Devices());
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].ordinal, 0);
  EXPECT_EQ(devices[0].name, "NVIDIA Fake GPU 0");
  EXPECT_EQ(devices[0].uuid, kUuidA);
  EXPECT_EQ(devices[0].total_memory_bytes, uint64_t{80} << 30);
  EXPECT_EQ(devices[1].uuid, kUuidB);
  {
    ScopedEnv version("FAKE_CUDA_VERSION", "12080");
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaDriver> d, CudaDriver::Load());
    EXPECT_EQ(d->version_string(), "12.8");
  }
  ScopedEnv count("FAKE_CUDA_DEVICE_COUNT", "0");
  ASSERT_OK_AND_ASSIGN(devices, driver_->Devices());
  EXPECT_TRUE(devices.empty());
}

TEST_F(FakeDriverTest, FullCycle) {
  SetState(pid_, "state=running\nrestore_tid=777\n");
  ASSERT_OK_AND_ASSIGN(CudaProcessState s, driver_->GetState(pid_));
  EXPECT_EQ(s, CudaProcessState::kRunning);
  ASSERT_OK_AND_ASSIGN(int tid, driver_->GetRestoreThreadId(pid_));
  EXPECT_EQ(tid, 777);
  ASSERT_OK(driver_->Lock(pid_, 1234));
  EXPECT_EQ(ReadFakeState(state_, pid_)["lock_timeout"], "1234");
  ASSERT_OK_AND_ASSIGN(s, driver_->GetState(pid_));
  EXPECT_EQ(s, CudaProcessState::kLocked);
  ASSERT_OK(driver_->Checkpoint(pid_));
  ASSERT_OK_AND_ASSIGN(s, driver_->GetState(pid_));
  EXPECT_EQ(s, CudaProcessState::kCheckpointed);
  ASSERT_OK_AND_ASSIGN(std::vector<GpuUuidPair> map,
                       ParseGpuMap(std::string(kUuidA) + "=" + kUuidB));
  ASSERT_OK(driver_->Restore(pid_, map));
  EXPECT_EQ(ReadFakeState(state_, pid_)["gpu_map"], std::string(kUuidA) + "=" + kUuidB);
  ASSERT_OK(driver_->Unlock(pid_));
  ASSERT_OK_AND_ASSIGN(s, driver_->GetState(pid_));
  EXPECT_EQ(s, CudaProcessState::kRunning);
  SetState(pid_, "state=failed\n");
  ASSERT_OK_AND_ASSIGN(s, driver_->GetState(pid_));
  EXPECT_EQ(s, CudaProcessState::kFailed);
  EXPECT_EQ(CudaProcessStateName(CudaProcessState::kCheckpointed), "checkpointed");
  EXPECT_EQ(CudaProcessStateName(CudaProcessState::kFailed), "failed");
}

TEST_F(FakeDriverTest, ErrorsNameThePidTheCallAndTheCudaError) {
  const std::string pid = "pid " + std::to_string(pid_);
  // No CUDA state in a live process.
  Result<CudaProcessState> st = driver_->GetState(pid_);
  ASSERT_CODE(st, StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st.status().message(), pid + ": cuCheckpointProcessGetState: "
                                                    "CUDA_ERROR_INVALID_VALUE: invalid argument"));
  // A process that is gone.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_CODE(driver_->GetRestoreThreadId(child), StatusCode::kNoSuchProcess);
  EXPECT_CODE(driver_->GetState(0), StatusCode::kInvalidArgument);
  EXPECT_CODE(driver_->Lock(-1, 0), StatusCode::kInvalidArgument);
  // Calls out of turn say which state the process is in and which is needed.
  SetState(pid_, "state=checkpointed\n");
  Status s = driver_->Lock(pid_, 0);
  EXPECT_CODE(s, StatusCode::kBusy);
  EXPECT_TRUE(Contains(s.message(), pid + ": cuCheckpointProcessLock: CUDA is checkpointed, "
                                          "needs running: CUDA_ERROR_ILLEGAL_STATE"));
  SetState(pid_, "state=running\n");
  s = driver_->Unlock(pid_);
  EXPECT_CODE(s, StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "CUDA is running, needs locked"));
  EXPECT_CODE(driver_->Checkpoint(pid_), StatusCode::kInvalidArgument);
  EXPECT_CODE(driver_->Restore(pid_, {}), StatusCode::kInvalidArgument);
  // A lock that times out leaves the process running.
  {
    ScopedEnv timeout("FAKE_CUDA_LOCK_TIMEOUT", "1");
    s = driver_->Lock(pid_, 500);
    EXPECT_CODE(s, StatusCode::kAborted);
    EXPECT_EQ(
        s.message().rfind(pid + ": CUDA not locked within 500 ms; the process is left running", 0),
        0u)
        << s.message();
    EXPECT_TRUE(Contains(s.message(), "CUDA_ERROR_TIMEOUT"));
  }
  ASSERT_OK_AND_ASSIGN(CudaProcessState state, driver_->GetState(pid_));
  EXPECT_EQ(state, CudaProcessState::kRunning);
  {
    ScopedEnv unsupported("FAKE_CUDA_NOT_SUPPORTED", "1");
    s = driver_->Lock(pid_, 0);
    EXPECT_CODE(s, StatusCode::kUnavailable);
    EXPECT_TRUE(Contains(s.message(), "CUDA_ERROR_NOT_SUPPORTED: operation not supported"));
  }
  SetState(pid_, "state=checkpointed\n");
  {
    ScopedEnv oom("FAKE_CUDA_FAIL_RESTORE", "2");
    EXPECT_CODE(driver_->Restore(pid_, {}), StatusCode::kNoSpace);
  }
  {
    ScopedEnv unknown("FAKE_CUDA_FAIL_RESTORE", "12345");
    s = driver_->Restore(pid_, {});
    EXPECT_CODE(s, StatusCode::kIOError);
    EXPECT_TRUE(Contains(s.message(), "CUDA error 12345"));
  }
}

TEST_F(FakeDriverTest, ConstMethodsMayRunConcurrently) {
  SetState(pid_, "state=locked\n");
  std::vector<std::thread> threads;
  std::vector<int> good(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Result<CudaProcessState> s = driver_->GetState(pid_);
        if (s.ok() && s.value() == CudaProcessState::kLocked) ++good[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(good, std::vector<int>(4, 200));
}

// ---- the cuda-checkpoint command ------------------------------------------------

struct CommandResult {
  int rc = -1;
  std::string out;  // stdout, or stdout and stderr together when combined
  std::string err;
};

// Runs `argv` (argv[0] a path, or a name looked up in PATH) with the test's
// environment less every GPUCKPT_* and FAKE_CUDA_* variable, plus `env`.
// `combined` sends stdout and stderr into one pipe, as CRIU's plugin does.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env, bool combined = false) {
  TempDir io("gpuckpt-cuda-cmd");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view v = *e;
    if (v.rfind("GPUCKPT_", 0) == 0 || v.rfind("FAKE_CUDA_", 0) == 0) continue;
    if (env.count(std::string(v.substr(0, v.find('=')))) > 0) continue;
    env_strings.emplace_back(v);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  const std::string out_path = io.Sub("out"), err_path = io.Sub("err");
  const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  CommandResult r;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, 1);
    dup2(combined ? out_fd : err_fd, 2);
    // execvp() looks up PATH in `environ`, so that is what is replaced
    // (execvpe() would search the test's own PATH).
    environ = envp.data();
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  if (pid < 0) return r;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

std::ostream& operator<<(std::ostream& os, const CommandResult& r) {
  return os << "rc=" << r.rc << " stdout='" << r.out << "' stderr='" << r.err << "'";
}

// The directory of the command, to put on PATH as gpuckptfs does for CRIU.
std::string CommandDir() {
  std::string path = GPUCKPT_CUDA_CHECKPOINT_PATH;
  return path.substr(0, path.rfind('/'));
}

// What CRIU's launch_cuda_checkpoint() keeps of the output: `size` - 1 bytes.
std::string CriuBuffer(const std::string& output, size_t size) {
  return output.substr(0, size - 1);
}

// A process the fake driver's checkpoint signals: on SIGUSR1 it maps fresh
// memory, as the driver maps host memory for the GPU's contents, and says
// where in STATE_DIR/<pid>.mapped.
class MappingChild {
 public:
  static constexpr size_t kPages = 5;

  explicit MappingChild(const std::string& state_dir) {
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    // Blocked from birth, so the signal waits for sigwait() however early it
    // comes.
    pthread_sigmask(SIG_BLOCK, &usr1, &old);
    const size_t len = kPages * static_cast<size_t>(getpagesize());
    pid_ = fork();
    if (pid_ == 0) {
      // Only system calls and snprintf here: nothing that allocates.
      int sig = 0;
      if (sigwait(&usr1, &sig) != 0) _exit(1);
      void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) _exit(1);
      memset(p, 0x5a, len);
      char path[4096], tmp[4200], line[64];
      snprintf(path, sizeof(path), "%s/%d.mapped", state_dir.c_str(), getpid());
      snprintf(tmp, sizeof(tmp), "%s.tmp", path);
      int n = snprintf(line, sizeof(line), "%lx %lx\n", reinterpret_cast<unsigned long>(p),
                       reinterpret_cast<unsigned long>(p) + len);
      int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || write(fd, line, n) != n || close(fd) != 0 || rename(tmp, path) != 0) _exit(1);
      for (;;) pause();
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  ~MappingChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

class CudaCheckpointCommandTest : public ::testing::Test {
 protected:
  void SetState(int pid, const std::string& content) {
    WriteFile(state_.Sub(std::to_string(pid)), content);
  }
  std::map<std::string, std::string> State(int pid) { return ReadFakeState(state_, pid); }
  std::string Calls(int pid) { return ReadFile(state_.Sub(std::to_string(pid) + ".calls")); }
  std::map<std::string, std::string> FakeEnv(std::map<std::string, std::string> extra = {}) {
    extra.emplace("GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_PATH);
    extra.emplace("FAKE_CUDA_STATE_DIR", state_.path());
    return extra;
  }
  CommandResult Run(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), GPUCKPT_CUDA_CHECKPOINT_PATH);
    return RunCommand(args, FakeEnv(std::move(env)));
  }

  TempDir state_{"gpuckpt-fake-cuda"};
  const int pid_ = getpid();
  const std::string pid_text_ = std::to_string(getpid());
};

TEST_F(CudaCheckpointCommandTest, HelpNamesActionAndTheEnvironment) {
  for (const char* flag : {"-h", "--help"}) {
    CommandResult r = RunCommand({GPUCKPT_CUDA_CHECKPOINT_PATH, flag},
                                 {{"GPUCKPT_LIBCUDA", "/nonexistent"}}, /*combined=*/true);
    EXPECT_EQ(r.rc, 0) << r;
    // CRIU reads 2048 bytes and looks for "--action" in them.
    EXPECT_TRUE(Contains(CriuBuffer(r.out, 2048), "--action")) << r;
    for (const char* word : {"--pid", "--timeout", "--device-map", "--toggle", "--get-state",
                             "--get-restore-tid", "GPUCKPT_LOCK_TIMEOUT_MS", "GPUCKPT_GPU_MAP",
                             "GPUCKPT_DEVICE_RANGES_DIR", "Exit status"}) {
      EXPECT_TRUE(Contains(r.out, word));
    }
  }
}

TEST_F(CudaCheckpointCommandTest, UsageErrorsExit2WithAMessage) {
  const std::string map_ab = std::string(kUuidA) + "=" + kUuidB;
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string expect;
  };
  const Case cases[] = {
      {{}, {}, "give one of --action"},
      {{"--pid", "5"}, {}, "give one of --action"},
      {{"--get-state", "--toggle", "--pid", "5"}, {}, "give one of"},
      {{"--get-state"}, {}, "--pid is required"},
      {{"--get-state", "--pid"}, {}, "--pid"},
      {{"--get-state", "--pid", "abc"}, {}, "invalid --pid 'abc'"},
      {{"--get-state", "--pid", "0"}, {}, "invalid --pid '0'"},
      {{"--get-state", "--pid", "-1"}, {}, "--pid"},
      {{"--get-state", "--pid", "12x"}, {}, "invalid --pid '12x'"},
      {{"--get-state", "--pid", "+5"}, {}, "invalid --pid '+5'"},
      {{"--get-state", "--pid", "2147483648"}, {}, "invalid --pid '2147483648'"},
      {{"--get-state", "--pid", "99999999999999999999999"}, {}, "invalid --pid"},
      {{"--action", "freeze", "--pid", "5"}, {}, "unknown --action 'freeze'"},
      {{"--action", "lock", "--pid", "5", "--timeout", "soon"}, {}, "invalid --timeout 'soon'"},
      {{"--action", "lock", "--pid", "5", "--timeout", "-1"}, {}, "--timeout"},
      {{"--action", "lock", "--pid", "5", "--timeout", "4294967296"}, {}, "invalid --timeout"},
      {{"--action", "unlock", "--pid", "5", "--timeout", "100"}, {}, "--timeout applies to"},
      {{"--action", "restore", "--pid", "5", "--device-map", "junk"}, {}, "--device-map: "},
      {{"--action", "restore", "--pid", "5", "--device-map", map_ab + "," + map_ab}, {}, "twice"},
      {{"--action", "lock", "--pid", "5", "--device-map", map_ab}, {}, "--device-map applies to"},
      {{"--get-state", "--pid", "5", "--frobnicate"}, {}, "--frobnicate"},
      {{"--action", "lock", "--pid", "5"},
       {{"GPUCKPT_LOCK_TIMEOUT_MS", "10s"}},
       "invalid GPUCKPT_LOCK_TIMEOUT_MS='10s'"},
      {{"--action", "restore", "--pid", "5"}, {{"GPUCKPT_GPU_MAP", "x=y"}}, "GPUCKPT_GPU_MAP: "},
  };
  for (const Case& tc : cases) {
    std::vector<std::string> args = tc.args;
    args.insert(args.begin(), GPUCKPT_CUDA_CHECKPOINT_PATH);
    // Usage is checked before the driver is loaded: none is needed.
    std::map<std::string, std::string> env = tc.env;
    env["GPUCKPT_LIBCUDA"] = "/nonexistent";
    CommandResult r = RunCommand(args, env);
    EXPECT_EQ(r.rc, 2) << r;
    EXPECT_EQ(r.out, "") << r;
    EXPECT_EQ(r.err.rfind("cuda-checkpoint: ", 0), 0u) << r;
    EXPECT_TRUE(Contains(r.err, tc.expect)) << r;
  }
}

TEST_F(CudaCheckpointCommandTest, EnvironmentNotUsedByAnActionIsNotChecked) {
  SetState(pid_, "state=running\n");
  CommandResult r = Run({"--action", "lock", "--pid", pid_text_}, {{"GPUCKPT_GPU_MAP", "junk"}});
  EXPECT_EQ(r.rc, 0) << r;
  r = Run({"--action", "unlock", "--pid", pid_text_}, {{"GPUCKPT_LOCK_TIMEOUT_MS", "junk"}});
  EXPECT_EQ(r.rc, 0) << r;
}

TEST_F(CudaCheckpointCommandTest, NoDriverExits1) {
  CommandResult r = RunCommand({GPUCKPT_CUDA_CHECKPOINT_PATH, "--get-state", "--pid", pid_text_},
                               {{"GPUCKPT_LIBCUDA", "/nonexistent/libcuda.so.1"}});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_EQ(r.err.rfind("cuda-checkpoint: no NVIDIA driver: /nonexistent/libcuda.so.1", 0), 0u)
      << r;
  r = RunCommand({GPUCKPT_CUDA_CHECKPOINT_PATH, "--action", "lock", "--pid", pid_text_},
                 {{"GPUCKPT_LIBCUDA", GPUCKPT_FAKE_LIBCUDA_NO_CKPT_PATH}});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_TRUE(Contains(r.err, "too old"));
}

TEST_F(CudaCheckpointCommandTest, ActionsOneByOne) {
  SetState(pid_, "state=running\n");
  CommandResult r = Run({"--get-state", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(r.out, "running\n");
  EXPECT_EQ(r.err, "");

  r = Run({"--action", "lock", "--pid", pid_text_, "--timeout", "3000"});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(r.out + r.err, "");
  EXPECT_EQ(State(pid_)["state"], "locked");
  EXPECT_EQ(State(pid_)["lock_timeout"], "3000");
  EXPECT_EQ(Run({"--get-state", "--pid", pid_text_}).out, "locked\n");

  r = Run({"--action", "checkpoint", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(Run({"--get-state", "--pid", pid_text_}).out, "checkpointed\n");

  const std::string map = std::string(kUuidA) + "=" + kUuidC + "," + kUuidB + "=" + kUuidA;
  r = Run({"--action", "restore", "--pid", pid_text_, "--device-map",
           "GPU-00010203-0405-0607-0809-0A0B0C0D0E0F=" + std::string(kUuidC) + "," + kUuidB + "=" +
               kUuidA});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["state"], "locked");
  EXPECT_EQ(State(pid_)["gpu_map"], map);

  r = Run({"--action", "unlock", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(Run({"--get-state", "--pid", pid_text_}).out, "running\n");
  EXPECT_EQ(Calls(pid_), "lock 3000\ncheckpoint\nrestore\nunlock\n");
}

TEST_F(CudaCheckpointCommandTest, RestoreWithoutMapAndWithTheEnvironmentMap) {
  const std::string env_map = std::string(kUuidB) + "=" + kUuidA;
  const std::string flag_map = std::string(kUuidA) + "=" + kUuidB;
  SetState(pid_, "state=checkpointed\ngpu_map=stale\n");
  CommandResult r = Run({"--action", "restore", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["gpu_map"], "");
  SetState(pid_, "state=checkpointed\n");
  r = Run({"--action", "restore", "--pid", pid_text_}, {{"GPUCKPT_GPU_MAP", env_map}});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["gpu_map"], env_map);
  // --device-map wins over the environment.
  SetState(pid_, "state=checkpointed\n");
  r = Run({"--action", "restore", "--pid", pid_text_, "--device-map", flag_map},
          {{"GPUCKPT_GPU_MAP", env_map}});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["gpu_map"], flag_map);
}

TEST_F(CudaCheckpointCommandTest, LockTimeoutFromTheEnvironmentWins) {
  SetState(pid_, "state=running\n");
  CommandResult r = Run({"--action", "lock", "--pid", pid_text_, "--timeout", "10000"},
                        {{"GPUCKPT_LOCK_TIMEOUT_MS", "2500"}});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["lock_timeout"], "2500");
  SetState(pid_, "state=running\n");
  r = Run({"--action", "lock", "--pid", pid_text_}, {{"GPUCKPT_LOCK_TIMEOUT_MS", "700"}});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["lock_timeout"], "700");
  SetState(pid_, "state=running\n");
  r = Run({"--action", "lock", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["lock_timeout"], "0");
  // An empty variable is no variable.
  SetState(pid_, "state=running\n");
  r = Run({"--action", "lock", "--pid", pid_text_, "--timeout", "10000"},
          {{"GPUCKPT_LOCK_TIMEOUT_MS", ""}});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["lock_timeout"], "10000");
}

TEST_F(CudaCheckpointCommandTest, LockTimeoutLeavesTheProcessRunning) {
  SetState(pid_, "state=running\n");
  CommandResult r = RunCommand(
      {GPUCKPT_CUDA_CHECKPOINT_PATH, "--action", "lock", "--pid", pid_text_, "--timeout", "10000"},
      FakeEnv({{"FAKE_CUDA_LOCK_TIMEOUT", "1"}}), /*combined=*/true);
  EXPECT_EQ(r.rc, 1) << r;
  // All CRIU keeps of it: 127 bytes.
  const std::string kept = CriuBuffer(r.out, 128);
  EXPECT_TRUE(Contains(kept, "pid " + pid_text_)) << r;
  EXPECT_TRUE(Contains(kept, "not locked within 10000 ms")) << r;
  EXPECT_TRUE(Contains(kept, "left running")) << r;
  EXPECT_EQ(State(pid_)["state"], "running");
}

TEST_F(CudaCheckpointCommandTest, WrongStateAndNoCudaExit1) {
  SetState(pid_, "state=running\n");
  CommandResult r = Run({"--action", "unlock", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_TRUE(Contains(r.err, "CUDA is running, needs locked"));
  EXPECT_TRUE(Contains(CriuBuffer(r.err, 128), "CUDA_ERROR_ILLEGAL_STATE"));
  r = Run({"--get-state", "--pid", "1"});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Contains(r.err, "pid 1: cuCheckpointProcessGetState: CUDA_ERROR_INVALID_VALUE"));
}

TEST_F(CudaCheckpointCommandTest, ToggleBothWays) {
  SetState(pid_, "state=running\n");
  CommandResult r = Run({"--toggle", "--pid", pid_text_, "--timeout", "900"});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["state"], "checkpointed");
  const std::string map = std::string(kUuidA) + "=" + kUuidB;
  r = Run({"--toggle", "--pid", pid_text_, "--device-map", map});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["state"], "running");
  EXPECT_EQ(State(pid_)["gpu_map"], map);
  EXPECT_EQ(Calls(pid_), "lock 900\ncheckpoint\nrestore\nunlock\n");
}

TEST_F(CudaCheckpointCommandTest, ToggleRefusesALockedProcess) {
  SetState(pid_, "state=locked\n");
  CommandResult r = Run({"--toggle", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_TRUE(Contains(r.err, "pid " + pid_text_ + ": CUDA is locked"));
  EXPECT_TRUE(Contains(r.err, "--action"));
  EXPECT_EQ(State(pid_)["state"], "locked");
  SetState(pid_, "state=failed\n");
  r = Run({"--toggle", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_TRUE(Contains(r.err, "failed state"));
}

TEST_F(CudaCheckpointCommandTest, ToggleUnlocksAgainWhenCheckpointFails) {
  SetState(pid_, "state=running\n");
  CommandResult r = Run({"--toggle", "--pid", pid_text_}, {{"FAKE_CUDA_FAIL_CHECKPOINT", "2"}});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_TRUE(Contains(r.err, "cuCheckpointProcessCheckpoint: CUDA_ERROR_OUT_OF_MEMORY"));
  EXPECT_TRUE(Contains(r.err, "unlocked again"));
  EXPECT_EQ(State(pid_)["state"], "running");
}

TEST_F(CudaCheckpointCommandTest, GetRestoreTid) {
  SetState(pid_, "state=running\nrestore_tid=4321\n");
  CommandResult r = Run({"--get-restore-tid", "--pid", pid_text_});
  EXPECT_EQ(r.rc, 0) << r;
  EXPECT_EQ(r.out, "4321\n");
}

TEST_F(CudaCheckpointCommandTest, CheckpointRecordsTheDeviceRanges) {
  TempDir ranges_dir("gpuckpt-ranges");
  MappingChild child(state_.path());
  ASSERT_GT(child.pid(), 0);
  const std::string pid = std::to_string(child.pid());
  SetState(child.pid(), "state=locked\nsignal_on_checkpoint=1\n");
  // Another process's file in the same directory is left alone.
  WriteFile(ranges_dir.Sub(DeviceRangesFileName(1)), "other");
  CommandResult r = Run({"--action", "checkpoint", "--pid", pid},
                        {{"GPUCKPT_DEVICE_RANGES_DIR", ranges_dir.path()}});
  ASSERT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(child.pid())["state"], "checkpointed");

  unsigned long start = 0, end = 0;
  ASSERT_EQ(sscanf(ReadFile(state_.Sub(pid + ".mapped")).c_str(), "%lx %lx", &start, &end), 2);
  EXPECT_EQ(end - start, MappingChild::kPages * static_cast<size_t>(getpagesize()));
  ASSERT_OK_AND_ASSIGN(DeviceRanges ranges,
                       ReadDeviceRangesFile(ranges_dir.Sub("cuda-ranges-" + pid + ".json")));
  EXPECT_EQ(ranges.pid, child.pid());
  bool found = false;
  for (const Mapping& m : ranges.ranges) {
    if (m.start <= start && m.end >= end) {
      found = true;
      EXPECT_EQ(m.perms, "rw-p");
      EXPECT_EQ(m.path, "");
    }
  }
  EXPECT_TRUE(found) << "the child's new mapping " << std::hex << start << "-" << end
                     << " is not in the ranges file";
  EXPECT_EQ(ReadFile(ranges_dir.Sub(DeviceRangesFileName(1))), "other");
}

TEST_F(CudaCheckpointCommandTest, RangesThatCannotBeWrittenFailTheCheckpoint) {
  SetState(pid_, "state=locked\n");
  CommandResult r = Run({"--action", "checkpoint", "--pid", pid_text_},
                        {{"GPUCKPT_DEVICE_RANGES_DIR", state_.Sub("missing")}});
  EXPECT_EQ(r.rc, 1) << r;
  EXPECT_TRUE(Contains(r.err, "pid " + pid_text_ + ": checkpointed, but device ranges not"));
  // CRIU's plugin restores and unlocks it after a failed checkpoint.
  EXPECT_EQ(State(pid_)["state"], "checkpointed");
}

// The argv that CRIU 4.1's cuda_plugin.c builds, the command found on PATH
// and the output read as it reads it.
TEST_F(CudaCheckpointCommandTest, CriuPluginCallShapes) {
  auto criu = [&](std::vector<std::string> argv, std::map<std::string, std::string> env = {}) {
    env["PATH"] = CommandDir() + ":/usr/bin:/bin";
    return RunCommand(argv, FakeEnv(std::move(env)), /*combined=*/true);
  };
  // cuda_plugin_init: "-h" must mention --action.
  CommandResult r = criu({"cuda-checkpoint", "-h"});
  ASSERT_EQ(r.rc, 0) << r;
  EXPECT_TRUE(Contains(CriuBuffer(r.out, 2048), "--action"));

  // A process without CUDA: get-restore-tid fails, so the plugin skips it.
  r = criu({"cuda-checkpoint", "--get-restore-tid", "--pid", pid_text_});
  EXPECT_NE(r.rc, 0) << r;

  SetState(pid_, "state=running\n");
  // cuda_plugin_pause_devices: restore tid, state of it, lock with timeout.
  r = criu({"cuda-checkpoint", "--get-restore-tid", "--pid", pid_text_});
  ASSERT_EQ(r.rc, 0) << r;
  const int restore_tid = atoi(CriuBuffer(r.out, 128).c_str());
  EXPECT_EQ(restore_tid, pid_);
  r = criu({"cuda-checkpoint", "--get-state", "--pid", std::to_string(restore_tid)});
  ASSERT_EQ(r.rc, 0) << r;
  EXPECT_EQ(strncmp(CriuBuffer(r.out, 128).c_str(), "running", 7), 0) << r;
  r = criu({"cuda-checkpoint", "--action", "lock", "--pid", pid_text_, "--timeout", "10000"},
           {{"GPUCKPT_LOCK_TIMEOUT_MS", "4000"}});
  ASSERT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["lock_timeout"], "4000");
  r = criu({"cuda-checkpoint", "--get-state", "--pid", pid_text_});
  EXPECT_EQ(strncmp(r.out.c_str(), "locked", 6), 0) << r;
  // cuda_plugin_checkpoint_devices: checkpoint, no timeout.
  r = criu({"cuda-checkpoint", "--action", "checkpoint", "--pid", pid_text_});
  ASSERT_EQ(r.rc, 0) << r;
  r = criu({"cuda-checkpoint", "--get-state", "--pid", pid_text_});
  EXPECT_EQ(strncmp(r.out.c_str(), "checkpointed", 12), 0) << r;
  // resume_device (restore, or dump with -R): restore, then unlock.
  r = criu({"cuda-checkpoint", "--action", "restore", "--pid", pid_text_},
           {{"GPUCKPT_GPU_MAP", std::string(kUuidA) + "=" + kUuidB}});
  ASSERT_EQ(r.rc, 0) << r;
  EXPECT_EQ(State(pid_)["gpu_map"], std::string(kUuidA) + "=" + kUuidB);
  r = criu({"cuda-checkpoint", "--action", "unlock", "--pid", pid_text_});
  ASSERT_EQ(r.rc, 0) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(State(pid_)["state"], "running");
}

// The lock and unlock cuda-checkpoint did are recorded for gpuckptfs, which
// reports the time between them as the job's frozen time.
TEST_F(CudaCheckpointCommandTest, LockAndUnlockAreRecordedInTheScratchDir) {
  SetState(pid_, "state=running\n");
  TempDir scratch;
  const std::map<std::string, std::string> env = {{"GPUCKPT_DEVICE_RANGES_DIR", scratch.path()}};
  const int64_t before = MonotonicNowNs();
  CommandResult r = Run({"--action", "lock", "--pid", pid_text_}, env);
  ASSERT_EQ(r.rc, 0) << r;
  GpuBackend::LockSpan span = ReadLockSpan(scratch.path());
  ASSERT_TRUE(span.first_lock_ns.has_value());
  EXPECT_GE(*span.first_lock_ns, before);
  EXPECT_FALSE(span.last_unlock_ns.has_value());
  r = Run({"--action", "unlock", "--pid", pid_text_}, env);
  ASSERT_EQ(r.rc, 0) << r;
  span = ReadLockSpan(scratch.path());
  ASSERT_TRUE(span.last_unlock_ns.has_value());
  EXPECT_GE(*span.last_unlock_ns, *span.first_lock_ns);
  EXPECT_LE(*span.last_unlock_ns, MonotonicNowNs());
  EXPECT_FALSE(span.lock_timed_out);
  // A lock that timed out is no lock, but is recorded as such: the failed
  // checkpoint is then one to try again.
  SetState(pid_, "state=running\nlock_timeouts=1\n");
  const int64_t first = *span.first_lock_ns;
  r = Run({"--action", "lock", "--pid", pid_text_, "--timeout", "500"}, env);
  EXPECT_NE(r.rc, 0) << r;
  span = ReadLockSpan(scratch.path());
  EXPECT_EQ(span.first_lock_ns, first);
  EXPECT_TRUE(span.lock_timed_out);
}

// The scratch dir of an unprivileged dump is the user's: what is planted
// there is read without following links or blocking, and only well-formed
// numbers count.
TEST(LockEventsTest, PlantedFilesAreIgnoredOrTakenAsNumbersOnly) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.path() + "/" + name) << text;
  };
  write("gpu-lock-10", "500\n");
  write("gpu-lock-11", "300\n");
  write("gpu-unlock-10", "900\n");
  write("gpu-unlock-11", "not a number\n");
  write("gpu-lock-12", "-5\n");
  write("gpu-lock-x", "1\n");
  write("gpu-lock-timeout-x", "1\n");
  write("gpu-unlock-13", std::string(1000, '9'));
  ASSERT_EQ(mkfifo((dir.path() + "/gpu-unlock-14").c_str(), 0600), 0);
  ASSERT_EQ(symlink("/proc/self/stat", (dir.path() + "/gpu-lock-15").c_str()), 0);
  const GpuBackend::LockSpan span = ReadLockSpan(dir.path());
  EXPECT_EQ(span.first_lock_ns, 300);
  EXPECT_EQ(span.last_unlock_ns, 900);
  EXPECT_FALSE(span.lock_timed_out);
  EXPECT_FALSE(ReadLockSpan(dir.path() + "/missing").first_lock_ns.has_value());
}

}  // namespace
}  // namespace gpuckpt
