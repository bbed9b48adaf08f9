// The checkpoint manifest: one encoding, read back field for field; the
// manifests older gpuckpts wrote still read; malformed fields read as
// absent and are named; newer versions and non-objects are refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/manifest/checkpoint_manifest.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

CheckpointManifest Full() {
  CheckpointManifest m;
  m.pid = 4242;
  m.command = "python3 train.py";
  m.owner = ManifestIds{1000, 1001};
  m.made_by = ManifestMaker{1000, 1001, {1001, 27}};
  m.tree = {4242, 4243};
  m.mode = CheckpointMode::kKill;
  m.shell_job = true;
  m.criu_version = "4.1.1";
  m.gpu_backend = GpuStacks::kCuda;
  m.driver_version = "580.159.04 (CUDA 13.0)";
  m.lock_timeout_ms = 10000;
  m.mount_namespace = ManifestMountNamespace{"/var/lib/root"};
  m.gpus = {{"NVIDIA H200", "GPU-7b1c", 150ull << 30}, {"", "GPU-a3f0", std::nullopt}};
  m.device_memory_bytes = 8ull << 30;
  m.parent = "4242-1";
  m.cuda_host_ranges = {{4243, 0x7f0000000000, 0x7f0000200000}};
  m.device_error = "no ranges";
  m.stages = ManifestStages{1.5, 0.25, "gpu lock to unlock", 0.2};
  m.staging_memory_bytes = 1ull << 30;
  m.imported_from = "/shared/job7";
  m.imported_by_restore = true;
  m.import_dropped = {"gpus[1]", "device.cuda_host_ranges[2]"};
  m.container = ManifestContainer{"web", std::nullopt, "localhost/web:1"};
  return m;
}

TEST(ManifestTest, EveryFieldReadsBackAsWritten) {
  const CheckpointManifest m = Full();
  ASSERT_OK_AND_ASSIGN(CheckpointManifest back, DecodeManifest(EncodeManifest(m)));
  EXPECT_TRUE(back.dropped.empty()) << back.dropped[0];
  EXPECT_EQ(back.version, kManifestVersion);
  EXPECT_EQ(back.pid, 4242);
  EXPECT_EQ(back.command, m.command);
  ASSERT_TRUE(back.owner);
  EXPECT_EQ(back.owner->uid, 1000u);
  EXPECT_EQ(back.owner->gid, 1001u);
  ASSERT_TRUE(back.made_by);
  EXPECT_EQ(back.made_by->groups, (std::vector<uint32_t>{1001, 27}));
  EXPECT_EQ(back.tree, m.tree);
  EXPECT_EQ(back.mode, CheckpointMode::kKill);
  EXPECT_EQ(back.shell_job, true);
  EXPECT_EQ(back.criu_version, "4.1.1");
  EXPECT_EQ(back.gpu_backend, GpuStacks::kCuda);
  EXPECT_EQ(back.driver_version, m.driver_version);
  EXPECT_EQ(back.lock_timeout_ms, 10000u);
  ASSERT_TRUE(back.mount_namespace);
  EXPECT_EQ(back.mount_namespace->root, "/var/lib/root");
  ASSERT_EQ(back.gpus.size(), 2u);
  EXPECT_EQ(back.gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(back.gpus[0].memory_bytes, 150ull << 30);
  EXPECT_EQ(back.gpus[1].uuid, "GPU-a3f0");
  EXPECT_FALSE(back.gpus[1].memory_bytes);
  EXPECT_EQ(back.device_memory_bytes, 8ull << 30);
  EXPECT_EQ(back.parent, "4242-1");
  ASSERT_EQ(back.cuda_host_ranges.size(), 1u);
  EXPECT_EQ(back.cuda_host_ranges[0].pid, 4243);
  EXPECT_EQ(back.cuda_host_ranges[0].end, 0x7f0000200000u);
  EXPECT_EQ(back.device_error, "no ranges");
  ASSERT_TRUE(back.stages);
  EXPECT_EQ(back.stages->dump_s, 1.5);
  EXPECT_EQ(back.stages->frozen_s, 0.25);
  EXPECT_EQ(back.stages->frozen_by, "gpu lock to unlock");
  EXPECT_EQ(back.stages->criu_frozen_s, 0.2);
  EXPECT_EQ(back.staging_memory_bytes, 1ull << 30);
  EXPECT_EQ(back.imported_from, "/shared/job7");
  EXPECT_TRUE(back.imported_by_restore);
  EXPECT_EQ(back.import_dropped, m.import_dropped);
  ASSERT_TRUE(back.container);
  EXPECT_EQ(back.container->name, "web");
  EXPECT_FALSE(back.container->id);
  EXPECT_EQ(back.container->image, "localhost/web:1");
  // One encoding: encoding what was read gives the same text.
  EXPECT_EQ(EncodeManifest(back), EncodeManifest(m));
}

TEST(ManifestTest, WritesItsVersionAndTheDocumentedKeys) {
  const auto j = nlohmann::json::parse(EncodeManifest(Full()));
  EXPECT_EQ(j["version"], kManifestVersion);
  EXPECT_EQ(j["mode"], "kill");
  EXPECT_EQ(j["gpu_backend"], "cuda");
  EXPECT_EQ(j["device"]["cuda_host_ranges"][0]["pid"], 4243);
  EXPECT_EQ(j["stages"]["frozen_by"], "gpu lock to unlock");
  EXPECT_TRUE(j["gpus"].is_array());
  EXPECT_EQ(j["import_dropped"][1], "device.cuda_host_ranges[2]");
  EXPECT_EQ(j["imported_by_restore"], true);
  // Left out where nothing was dropped, or no restore imported it.
  const auto empty = nlohmann::json::parse(EncodeManifest(CheckpointManifest{}));
  EXPECT_FALSE(empty.contains("import_dropped"));
  EXPECT_FALSE(empty.contains("imported_by_restore"));
  // An unknown root is recorded as null, not left out: the tree had a mount
  // namespace of its own either way.
  CheckpointManifest unknown_root;
  unknown_root.mount_namespace = ManifestMountNamespace{};
  const auto k = nlohmann::json::parse(EncodeManifest(unknown_root));
  EXPECT_TRUE(k["mount_namespace"]["root"].is_null());
  ASSERT_OK_AND_ASSIGN(CheckpointManifest back, DecodeManifest(k.dump()));
  ASSERT_TRUE(back.mount_namespace);
  EXPECT_FALSE(back.mount_namespace->root);
  EXPECT_TRUE(back.dropped.empty());
}

// The `extra` of a checkpoint made before the manifest had a version, as
// that gpuckpt wrote it.
TEST(ManifestTest, AManifestWithoutVersionReadsAsVersionOne) {
  const std::string old = R"({"pid":77,"command":"wl_memory","owner":{"uid":1000,"gid":1000},
    "made_by":{"uid":1000,"gid":1000,"groups":[1000]},"tree":[77],"mode":"leave-running",
    "shell_job":false,"criu_version":"4.1.1","gpu_backend":"none","driver_version":"",
    "gpus":[],"parent":"77-1","stages":{"dump_s":0.4,"frozen_s":0.3,
    "frozen_by":"criu freeze to resume","criu_frozen_s":0.3},"staging_memory_bytes":268435456})";
  ASSERT_OK_AND_ASSIGN(CheckpointManifest m, DecodeManifest(old));
  EXPECT_EQ(m.version, 1);
  EXPECT_TRUE(m.dropped.empty());
  EXPECT_EQ(m.pid, 77);
  EXPECT_EQ(m.OwnerOrRoot().uid, 1000u);
  EXPECT_EQ(m.mode, CheckpointMode::kLeaveRunning);
  EXPECT_EQ(m.gpu_backend, GpuStacks::kNone);
  EXPECT_EQ(m.stages->frozen_s, 0.3);
  EXPECT_TRUE(m.IsOwnDump());
}

TEST(ManifestTest, WithoutMadeByTheOwnerCountsAsTheMaker) {
  ASSERT_OK_AND_ASSIGN(CheckpointManifest m,
                       DecodeManifest(R"({"pid":5,"owner":{"uid":1000,"gid":100}})"));
  EXPECT_EQ(m.MakerOrOwner().uid, 1000u);
  EXPECT_EQ(m.MakerOrOwner().gid, 100u);
  // Half a record is none: the owner stands, and the record is named.
  ASSERT_OK_AND_ASSIGN(m,
                       DecodeManifest(R"({"owner":{"uid":1000,"gid":100},"made_by":{"uid":0}})"));
  EXPECT_EQ(m.MakerOrOwner().uid, 1000u);
  EXPECT_NE(std::find(m.dropped.begin(), m.dropped.end(), "made_by"), m.dropped.end());
  // No owner at all: root's.
  ASSERT_OK_AND_ASSIGN(m, DecodeManifest("{}"));
  EXPECT_EQ(m.OwnerOrRoot().uid, 0u);
  EXPECT_EQ(m.MakerOrOwner().uid, 0u);
}

TEST(ManifestTest, MalformedFieldsReadAsAbsentAndAreNamed) {
  const std::string text = R"({"pid":"77","owner":{"uid":-1,"gid":5},"mode":"pause",
    "gpu_backend":"opencl","shell_job":"yes","lock_timeout_ms":99999999999,
    "gpus":[{"name":"x"},{"uuid":"GPU-1","memory_bytes":-4},7],
    "device":{"cuda_host_ranges":[{"pid":3,"start":8192,"end":4096},{"pid":0,"start":0,"end":1},
      {"pid":99999999,"start":0,"end":1},{"pid":3,"start":0},"x",{"pid":3,"start":4096,"end":8192}]},
    "stages":{"dump_s":"1"},"mount_namespace":{"root":7},"tree":[1,"2"]})";
  ASSERT_OK_AND_ASSIGN(CheckpointManifest m, DecodeManifest(text));
  EXPECT_EQ(m.pid, 0);
  EXPECT_FALSE(m.owner);
  EXPECT_FALSE(m.mode);
  EXPECT_FALSE(m.gpu_backend);
  EXPECT_FALSE(m.shell_job);
  EXPECT_FALSE(m.lock_timeout_ms);
  ASSERT_EQ(m.gpus.size(), 1u);
  EXPECT_EQ(m.gpus[0].uuid, "GPU-1");
  EXPECT_FALSE(m.gpus[0].memory_bytes);
  ASSERT_EQ(m.cuda_host_ranges.size(), 1u);
  EXPECT_EQ(m.cuda_host_ranges[0].start, 4096u);
  ASSERT_TRUE(m.stages);
  EXPECT_EQ(m.stages->dump_s, 0);
  ASSERT_TRUE(m.mount_namespace);
  EXPECT_FALSE(m.mount_namespace->root);
  EXPECT_EQ(m.tree, std::vector<int>{1});
  for (const char* path :
       {"pid", "owner.uid", "owner", "mode", "gpu_backend", "shell_job", "lock_timeout_ms",
        "gpus[0]", "gpus[1].memory_bytes", "gpus[2]", "device.cuda_host_ranges[0]",
        "device.cuda_host_ranges[4]", "stages.dump_s", "mount_namespace.root", "tree[1]"})
    EXPECT_NE(std::find(m.dropped.begin(), m.dropped.end(), path), m.dropped.end()) << path;
}

TEST(ManifestTest, NewerVersionsAndNonObjectsAreRefused) {
  EXPECT_CODE(DecodeManifest(R"({"version":3,"pid":1})").status(), StatusCode::kUnavailable);
  EXPECT_CODE(DecodeManifest("[1,2]").status(), StatusCode::kCorruption);
  EXPECT_CODE(DecodeManifest("{\"pid\":").status(), StatusCode::kCorruption);
  // What the permission checks see of those: nobody's, not an own dump.
  for (const char* text : {R"({"version":3,"owner":{"uid":1000,"gid":1000}})", "[]"}) {
    const CheckpointManifest m = ManifestOrEmpty(text);
    EXPECT_EQ(m.OwnerOrRoot().uid, 0u) << text;
    EXPECT_EQ(m.MakerOrOwner().uid, 0u) << text;
    EXPECT_FALSE(m.IsOwnDump()) << text;
  }
  // No text at all: a snapshot written without a manifest (the store CLI's
  // imports), which names nobody either.
  ASSERT_OK_AND_ASSIGN(CheckpointManifest none, DecodeManifest(""));
  EXPECT_EQ(none.OwnerOrRoot().uid, 0u);
}

TEST(ManifestTest, GpuStackNamesRoundTrip) {
  for (GpuStacks s :
       {GpuStacks::kNone, GpuStacks::kCuda, GpuStacks::kRocm, GpuStacks::kCudaAndRocm})
    EXPECT_EQ(ParseGpuStacks(GpuStacksName(s)), s);
  EXPECT_FALSE(ParseGpuStacks("CUDA"));
  EXPECT_EQ(GpuStacks::kCuda | GpuStacks::kRocm, GpuStacks::kCudaAndRocm);
  EXPECT_TRUE(HasRocm(GpuStacks::kCudaAndRocm));
  EXPECT_FALSE(HasCuda(GpuStacks::kRocm));
}

}  // namespace
}  // namespace gpuckpt
