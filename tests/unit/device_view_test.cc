// device/<id>/ without a GPU: a snapshot as a CUDA checkpoint leaves it
// (CRIU's pagemap and pages images, and the ranges cuda-checkpoint recorded
// in the manifest) must show each range as a file holding exactly the bytes
// of those pages, zeros where CRIU dumped none; AMD plugin files show again
// under device/<id>/; a stored device/ (an import of a copy by an older
// version) is shown as stored, there too. checkpoints/<id>/ never shows a
// device/: a copy of it holds each byte once. device/<id> follows its
// checkpoint: its owner's alone, gone with it. The pagemap is built here
// the way CRIU writes it; on the GPU machine tests/gpu/ checks the same
// files against a real CUDA process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/criu/images.h"
#include "fs/store_view.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;

using testing::ProtoVarintField;

std::string PagemapImage(uint32_t pages_id, const std::vector<CriuPagemapEntry>& entries) {
  std::vector<std::string> records = {ProtoVarintField(1, pages_id)};
  for (const auto& e : entries)
    records.push_back(ProtoVarintField(1, e.vaddr) + ProtoVarintField(2, e.nr_pages) +
                      ProtoVarintField(4, e.flags));
  return testing::CriuImageBytes(kCriuPagemapMagic, records);
}

NodeId Dir(NodeKind kind) {
  NodeId id;
  id.kind = kind;
  return id;
}
NodeId CheckpointsDir() { return Dir(NodeKind::kCheckpointsDir); }
NodeId DeviceDir() { return Dir(NodeKind::kDeviceDir); }

std::vector<std::string> Names(const std::vector<std::pair<std::string, NodeId>>& children) {
  std::vector<std::string> names;
  for (const auto& [name, id] : children) names.push_back(name);
  return names;
}

class DeviceViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
  }

  void Add(SnapshotWriter* writer, const std::string& path, const std::string& bytes) {
    FileEntry e;
    e.path = path;
    e.mode = 0600;
    ASSERT_OK(testing::AddBytes(writer, e, bytes));
  }

  // A snapshot `id` of process `pid` owned by `uid`, as a CUDA checkpoint
  // leaves it: one present page at 0x10000, recorded as device memory.
  // Returns the page's bytes.
  std::string AddCudaSnapshot(const std::string& id, int pid, uint32_t uid, uint64_t seed) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    nlohmann::json extra = {
        {"pid", pid},
        {"owner", {{"uid", uid}, {"gid", uid}}},
        {"gpu_backend", "cuda"},
        {"device",
         {{"cuda_host_ranges", {{{"pid", pid}, {"start", 0x10000}, {"end", 0x10000 + page}}}}}}};
    const std::string bytes = testing::RandomBytes(page, seed);
    auto writer = store_->BeginSnapshot({id, "test", extra.dump(), "", std::nullopt});
    EXPECT_OK(writer);
    if (!writer.ok()) return "";
    Add(writer->get(), "images/pagemap-" + std::to_string(pid) + ".img",
        PagemapImage(1, {{0x10000, 1, CriuPagemapEntry::kPresent}}));
    Add(writer->get(), "images/pages-1.img", bytes);
    EXPECT_OK((*writer)->Commit().status());
    return bytes;
  }

  std::string ReadAll(StoreView& view, const NodeId& node) {
    auto reader = view.OpenImage(node);
    EXPECT_OK(reader);
    if (!reader.ok()) return "";
    return ReadAll(**reader);
  }

  std::string ReadAll(FileReader& reader) {
    std::string out(reader.entry().size, '\0');
    // Odd-sized reads cross segment boundaries.
    size_t done = 0;
    while (done < out.size()) {
      auto n = reader.Pread(done, std::min<size_t>(7777, out.size() - done), out.data() + done);
      EXPECT_OK(n);
      if (!n.ok() || *n == 0) break;
      done += *n;
    }
    out.resize(done);
    return out;
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
};

TEST_F(DeviceViewTest, CudaRangesAreSlicesOfThePagesImage) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t base = 0x7f0000000000;
  // Pages in image order: entry A (2 pages at base), entry B (in parent,
  // no bytes here) at base+2p, entry C (3 pages at base+4p): a hole of one
  // page at base+3p. The device range covers base+p .. base+6p.
  const std::vector<CriuPagemapEntry> entries = {
      {base, 2, CriuPagemapEntry::kPresent},
      {base + 2 * page, 1, CriuPagemapEntry::kParent},
      {base + 4 * page, 3, CriuPagemapEntry::kPresent},
  };
  const std::string pages = testing::RandomBytes(5 * page, 7);
  nlohmann::json extra = {
      {"pid", 42},
      {"owner", {{"uid", 1000}, {"gid", 1001}}},
      {"device",
       {{"cuda_host_ranges", {{{"pid", 42}, {"start", base + page}, {"end", base + 6 * page}}}}}}};
  ASSERT_OK_AND_ASSIGN(auto writer,
                       store_->BeginSnapshot({"42-1", "test", extra.dump(), "", std::nullopt}));
  Add(writer.get(), "images/pagemap-42.img", PagemapImage(9, entries));
  Add(writer.get(), "images/pages-9.img", pages);
  Add(writer.get(), "images/amdgpu-kfd-1.img", "kfd bytes");
  ASSERT_OK(writer->Commit().status());

  StoreView view(store_.get(), nullptr);
  const Caller root{};
  // checkpoints/<id> holds what a restore needs, nothing twice.
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(CheckpointsDir(), "42-1", root));
  ASSERT_OK_AND_ASSIGN(auto top, view.Children(dir, root));
  EXPECT_EQ(Names(top), (std::vector<std::string>{"manifest.json", "images"}));
  EXPECT_CODE(view.Child(dir, "device", root).status(), StatusCode::kNotFound);

  ASSERT_OK_AND_ASSIGN(auto ids, view.Children(DeviceDir(), root));
  EXPECT_EQ(Names(ids), std::vector<std::string>{"42-1"});
  ASSERT_OK_AND_ASSIGN(NodeId device, view.Child(DeviceDir(), "42-1", root));
  EXPECT_EQ(device.kind, NodeKind::kDeviceSnapshotDir);
  EXPECT_EQ(device.key, dir.key);
  ASSERT_OK_AND_ASSIGN(struct stat dir_st, view.Attributes(device));
  EXPECT_TRUE(S_ISDIR(dir_st.st_mode));
  EXPECT_EQ(dir_st.st_mode & 07777, 0700u);
  EXPECT_EQ(dir_st.st_uid, 1000u);
  EXPECT_EQ(dir_st.st_gid, 1001u);
  ASSERT_OK_AND_ASSIGN(auto children, view.Children(device, root));
  const std::string bin = "cuda-42-7f0000001000.bin";
  ASSERT_EQ(page, 4096u) << "the expected file name assumes 4 KiB pages";
  EXPECT_EQ(Names(children),
            (std::vector<std::string>{"amdgpu-kfd-1.img", bin, "cuda-ranges.json"}));

  ASSERT_OK_AND_ASSIGN(NodeId file, view.Child(device, bin, root));
  EXPECT_EQ(file.kind, NodeKind::kDeviceEntry);
  ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(file));
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 5 * page);
  EXPECT_EQ(st.st_blocks, 0) << "device files add nothing to the store";
  EXPECT_EQ(st.st_mode, S_IFREG | 0600u);
  EXPECT_EQ(st.st_uid, 1000u);
  // base+p: A's second page; base+2p: in the parent, zeros; base+3p: not
  // dumped, zeros; base+4p, base+5p: C's first two pages.
  const std::string expected =
      pages.substr(page, page) + std::string(2 * page, '\0') + pages.substr(2 * page, 2 * page);
  EXPECT_TRUE(ReadAll(view, file) == expected);

  ASSERT_OK_AND_ASSIGN(NodeId index, view.Child(device, "cuda-ranges.json", root));
  auto json = nlohmann::json::parse(ReadAll(view, index), nullptr, false);
  ASSERT_TRUE(json.is_object());
  ASSERT_EQ(json["ranges"].size(), 1u);
  EXPECT_EQ(json["ranges"][0]["file"], bin);
  EXPECT_EQ(json["ranges"][0]["size"], 5 * page);

  // AMD's plugin file: the image's bytes, under both names.
  ASSERT_OK_AND_ASSIGN(NodeId kfd, view.Child(device, "amdgpu-kfd-1.img", root));
  EXPECT_EQ(ReadAll(view, kfd), "kfd bytes");
  ASSERT_OK_AND_ASSIGN(NodeId images, view.Child(dir, "images", root));
  ASSERT_OK_AND_ASSIGN(NodeId kfd_image, view.Child(images, "amdgpu-kfd-1.img", root));
  EXPECT_EQ(ReadAll(view, kfd_image), "kfd bytes");
}

TEST_F(DeviceViewTest, DeviceDirectoryIsAtTheTop) {
  StoreView view(store_.get(), nullptr);
  const NodeId root_dir = Dir(NodeKind::kRoot);
  ASSERT_OK_AND_ASSIGN(NodeId device, view.Child(root_dir, "device", Caller{}));
  EXPECT_EQ(device.kind, NodeKind::kDeviceDir);
  ASSERT_OK_AND_ASSIGN(auto ids, view.Children(device, Caller{}));
  EXPECT_TRUE(ids.empty());
  // Like checkpoints/: the kernel passes changes on, to be refused by us.
  ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(device));
  EXPECT_EQ(st.st_mode, S_IFDIR | 01777u);
  ASSERT_OK_AND_ASSIGN(NodeId readme, view.Child(root_dir, "README", Caller{}));
  ASSERT_OK_AND_ASSIGN(std::string text, view.GeneratedContent(readme, Caller{}));
  EXPECT_NE(text.find("device/<id>/"), std::string::npos) << text;
  EXPECT_EQ(text.find("checkpoints/<id>/device"), std::string::npos) << text;
}

TEST_F(DeviceViewTest, CheckpointWithoutDeviceStateHasNoDeviceDirectory) {
  nlohmann::json extra = {{"pid", 7}, {"owner", {{"uid", 0}, {"gid", 0}}}, {"gpu_backend", "none"}};
  ASSERT_OK_AND_ASSIGN(auto writer,
                       store_->BeginSnapshot({"7-1", "test", extra.dump(), "", std::nullopt}));
  Add(writer.get(), "images/pagemap-7.img", PagemapImage(1, {}));
  ASSERT_OK(writer->Commit().status());
  AddCudaSnapshot("8-1", 8, 0, 1);
  StoreView view(store_.get(), nullptr);
  ASSERT_OK_AND_ASSIGN(auto ids, view.Children(DeviceDir(), Caller{}));
  EXPECT_EQ(Names(ids), std::vector<std::string>{"8-1"});
  EXPECT_CODE(view.Child(DeviceDir(), "7-1", Caller{}).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.Child(DeviceDir(), "never-made", Caller{}).status(), StatusCode::kNotFound);
  ASSERT_OK(view.Child(CheckpointsDir(), "7-1", Caller{}).status());
}

TEST_F(DeviceViewTest, DeviceDirectoryIsItsOwnersAlone) {
  const std::string bytes = AddCudaSnapshot("u.mine", 9, 1000, 2);
  AddCudaSnapshot("u.theirs", 10, 2000, 3);
  StoreView view(store_.get(), nullptr);
  const Caller owner{.uid = 1000, .gid = 1000};
  const Caller other{.uid = 2000, .gid = 2000};
  const Caller root{};
  ASSERT_OK_AND_ASSIGN(auto mine, view.Children(DeviceDir(), owner));
  EXPECT_EQ(Names(mine), std::vector<std::string>{"u.mine"});
  ASSERT_OK_AND_ASSIGN(auto theirs, view.Children(DeviceDir(), other));
  EXPECT_EQ(Names(theirs), std::vector<std::string>{"u.theirs"});
  ASSERT_OK_AND_ASSIGN(auto all, view.Children(DeviceDir(), root));
  EXPECT_EQ(Names(all), (std::vector<std::string>{"u.mine", "u.theirs"}));

  // Absent to the other user, whichever way it is asked.
  EXPECT_CODE(view.Child(DeviceDir(), "u.mine", other).status(), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(DeviceDir(), "u.mine", owner));
  ASSERT_OK_AND_ASSIGN(auto files, view.Children(dir, owner));
  ASSERT_EQ(Names(files), (std::vector<std::string>{"cuda-9-10000.bin", "cuda-ranges.json"}));
  const NodeId file = files[0].second;
  EXPECT_CODE(view.Attributes(dir, other).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.Children(dir, other).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.Child(dir, "cuda-9-10000.bin", other).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.Attributes(file, other).status(), StatusCode::kNotFound);
  // Its owner and root see it.
  ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(file, owner));
  EXPECT_EQ(st.st_uid, 1000u);
  EXPECT_EQ(st.st_mode, S_IFREG | 0600u);
  ASSERT_OK(view.Attributes(file, root).status());
  EXPECT_EQ(ReadAll(view, file), bytes);
}

TEST_F(DeviceViewTest, RemovedCheckpointsDeviceNodesStayGone) {
  const std::string old_bytes = AddCudaSnapshot("again", 11, 0, 4);
  StoreView view(store_.get(), nullptr);
  const Caller root{};
  ASSERT_OK_AND_ASSIGN(NodeId old_dir, view.Child(DeviceDir(), "again", root));
  ASSERT_OK_AND_ASSIGN(NodeId old_file, view.Child(old_dir, "cuda-11-10000.bin", root));
  ASSERT_OK_AND_ASSIGN(auto open_reader, view.OpenImage(old_file));

  ASSERT_OK_AND_ASSIGN(NodeId checkpoint, view.Child(CheckpointsDir(), "again", root));
  ASSERT_OK(view.RemoveSnapshot(checkpoint, root));
  const std::string new_bytes = AddCudaSnapshot("again", 11, 0, 5);
  ASSERT_NE(old_bytes, new_bytes);
  view.Invalidate();

  // The old incarnation's nodes are gone, though the id is back.
  EXPECT_CODE(view.Attributes(old_dir).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.Attributes(old_file).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.Children(old_dir, root).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.Child(old_dir, "cuda-11-10000.bin", root).status(), StatusCode::kNotFound);
  EXPECT_CODE(view.OpenImage(old_file).status(), StatusCode::kNotFound);
  // What was open reads on in the old one.
  EXPECT_EQ(ReadAll(*open_reader), old_bytes);
  // The new one has new nodes, and its own bytes.
  ASSERT_OK_AND_ASSIGN(NodeId new_dir, view.Child(DeviceDir(), "again", root));
  EXPECT_NE(new_dir.key, old_dir.key);
  ASSERT_OK_AND_ASSIGN(NodeId new_file, view.Child(new_dir, "cuda-11-10000.bin", root));
  EXPECT_NE(new_file, old_file);
  EXPECT_EQ(ReadAll(view, new_file), new_bytes);
}

TEST_F(DeviceViewTest, StoredDeviceDirectoryShowsUnderDeviceOnly) {
  // An import of a copy by an older version: device/ stored with it.
  nlohmann::json extra = {{"pid", 5}, {"gpu_backend", "cuda"}};
  ASSERT_OK_AND_ASSIGN(auto writer,
                       store_->BeginSnapshot({"5-1", "test", extra.dump(), "", std::nullopt}));
  Add(writer.get(), "images/pstree.img", "tree");
  Add(writer.get(), "device/cuda-5-1000.bin", "copied bytes");
  Add(writer.get(), "device/sub/note", "nested");
  ASSERT_OK(writer->Commit().status());
  StoreView view(store_.get(), nullptr);
  const Caller root{};
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(CheckpointsDir(), "5-1", root));
  ASSERT_OK_AND_ASSIGN(auto top, view.Children(dir, root));
  EXPECT_EQ(Names(top), (std::vector<std::string>{"manifest.json", "images"}));
  EXPECT_CODE(view.Child(dir, "device", root).status(), StatusCode::kNotFound);

  ASSERT_OK_AND_ASSIGN(NodeId device, view.Child(DeviceDir(), "5-1", root));
  ASSERT_OK_AND_ASSIGN(auto children, view.Children(device, root));
  EXPECT_EQ(Names(children), (std::vector<std::string>{"cuda-5-1000.bin", "sub"}));
  EXPECT_EQ(ReadAll(view, children[0].second), "copied bytes");
  ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(children[0].second));
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), std::string("copied bytes").size());
  ASSERT_OK_AND_ASSIGN(NodeId note, view.Child(children[1].second, "note", root));
  EXPECT_EQ(ReadAll(view, note), "nested");
}

TEST_F(DeviceViewTest, DamagedPagemapLeavesDeviceEmptyButImagesReadable) {
  nlohmann::json extra = {
      {"pid", 6},
      {"device", {{"cuda_host_ranges", {{{"pid", 6}, {"start", 4096}, {"end", 8192}}}}}}};
  ASSERT_OK_AND_ASSIGN(auto writer,
                       store_->BeginSnapshot({"6-1", "test", extra.dump(), "", std::nullopt}));
  Add(writer.get(), "images/pagemap-6.img", "not a pagemap");
  ASSERT_OK(writer->Commit().status());
  StoreView view(store_.get(), nullptr);
  const Caller root{};
  // What device/ lists can be looked up: the directory is there, empty.
  ASSERT_OK_AND_ASSIGN(auto ids, view.Children(DeviceDir(), root));
  EXPECT_EQ(Names(ids), std::vector<std::string>{"6-1"});
  ASSERT_OK_AND_ASSIGN(NodeId device, view.Child(DeviceDir(), "6-1", root));
  ASSERT_OK_AND_ASSIGN(auto children, view.Children(device, root));
  EXPECT_TRUE(children.empty());
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(CheckpointsDir(), "6-1", root));
  ASSERT_OK_AND_ASSIGN(NodeId images, view.Child(dir, "images", root));
  ASSERT_OK_AND_ASSIGN(NodeId pagemap, view.Child(images, "pagemap-6.img", root));
  EXPECT_EQ(ReadAll(view, pagemap), "not a pagemap");
}

TEST(CriuPagemapTest, ParsesAndRejects) {
  const std::string good = PagemapImage(
      3, {{0x1000, 2, CriuPagemapEntry::kPresent}, {0x5000, 1, CriuPagemapEntry::kParent}});
  ASSERT_OK_AND_ASSIGN(CriuPagemap map, ParsePagemapImage(good));
  EXPECT_EQ(map.pages_id, 3u);
  ASSERT_EQ(map.entries.size(), 2u);
  EXPECT_EQ(map.entries[0].vaddr, 0x1000u);
  EXPECT_EQ(map.entries[0].nr_pages, 2u);
  EXPECT_TRUE(map.entries[0].present());
  EXPECT_FALSE(map.entries[1].present());
  // Old images: in_parent instead of flags.
  const std::string old = testing::CriuImageBytes(
      kCriuPagemapMagic,
      {ProtoVarintField(1, 1), ProtoVarintField(1, 0x2000) + ProtoVarintField(2, 4)});
  ASSERT_OK_AND_ASSIGN(CriuPagemap old_map, ParsePagemapImage(old));
  EXPECT_TRUE(old_map.entries[0].present());
  for (const std::string& bad :
       {std::string(), testing::CriuImageBytes(kCriuPstreeMagic, {}),
        testing::CriuImageBytes(kCriuPagemapMagic, {}), good.substr(0, good.size() - 1),
        testing::CriuImageBytes(kCriuPagemapMagic, {ProtoVarintField(2, 1)})}) {
    EXPECT_CODE(ParsePagemapImage(bad).status(), StatusCode::kCorruption);
  }
}

}  // namespace
}  // namespace gpuckpt
