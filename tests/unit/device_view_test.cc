// checkpoints/<id>/device/ without a GPU: a snapshot as a CUDA checkpoint
// leaves it (CRIU's pagemap and pages images, and the ranges cuda-checkpoint
// recorded in the manifest) must show each range as a file holding exactly
// the bytes of those pages, zeros where CRIU dumped none; AMD plugin files
// show again under device/; a stored device/ (an imported copy) is shown as
// stored. The pagemap is built here the way CRIU writes it; on the GPU
// machine tests/gpu/ checks the same files against a real CUDA process.
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

NodeId CheckpointsDir() {
  NodeId id;
  id.kind = NodeKind::kCheckpointsDir;
  return id;
}

class DeviceViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
  }

  void Add(SnapshotWriter* writer, const std::string& path, const std::string& bytes) {
    const std::string file = tmp_.Sub("f");
    testing::WriteFile(file, bytes);
    const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    FileEntry e;
    e.path = path;
    e.mode = 0600;
    ASSERT_OK(writer->AddFile(e, fd));
    close(fd);
  }

  std::string ReadAll(StoreView& view, const NodeId& node) {
    auto reader = view.OpenImage(node);
    EXPECT_OK(reader);
    if (!reader.ok()) return "";
    std::string out((*reader)->entry().size, '\0');
    // Odd-sized reads cross segment boundaries.
    size_t done = 0;
    while (done < out.size()) {
      auto n = (*reader)->Pread(done, std::min<size_t>(7777, out.size() - done), out.data() + done);
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
      {"owner", {{"uid", 0}, {"gid", 0}}},
      {"device",
       {{"cuda_host_ranges", {{{"pid", 42}, {"start", base + page}, {"end", base + 6 * page}}}}}}};
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot({"42-1", "test", extra.dump(), "", std::nullopt}));
  Add(writer.get(), "images/pagemap-42.img", PagemapImage(9, entries));
  Add(writer.get(), "images/pages-9.img", pages);
  Add(writer.get(), "images/amdgpu-kfd-1.img", "kfd bytes");
  ASSERT_OK(writer->Commit().status());

  StoreView view(store_.get(), nullptr);
  const Caller root{};
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(CheckpointsDir(), "42-1", root));
  ASSERT_OK_AND_ASSIGN(NodeId device, view.Child(dir, "device", root));
  ASSERT_OK_AND_ASSIGN(auto children, view.Children(device, root));
  std::vector<std::string> names;
  for (const auto& [name, id] : children) names.push_back(name);
  const std::string bin = "cuda-42-7f0000001000.bin";
  ASSERT_EQ(page, 4096u) << "the expected file name assumes 4 KiB pages";
  EXPECT_EQ(names, (std::vector<std::string>{"amdgpu-kfd-1.img", bin, "cuda-ranges.json"}));

  ASSERT_OK_AND_ASSIGN(NodeId file, view.Child(device, bin, root));
  ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(file));
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 5 * page);
  EXPECT_EQ(st.st_blocks, 0) << "device files add nothing to the store";
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

  ASSERT_OK_AND_ASSIGN(NodeId kfd, view.Child(device, "amdgpu-kfd-1.img", root));
  EXPECT_EQ(ReadAll(view, kfd), "kfd bytes");
}

TEST_F(DeviceViewTest, StoredDeviceDirectoryIsShownAsStored) {
  nlohmann::json extra = {
      {"pid", 5},
      {"device", {{"cuda_host_ranges", {{{"pid", 5}, {"start", 4096}, {"end", 8192}}}}}}};
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot({"5-1", "test", extra.dump(), "", std::nullopt}));
  Add(writer.get(), "device/cuda-5-1000.bin", "copied bytes");
  ASSERT_OK(writer->Commit().status());
  StoreView view(store_.get(), nullptr);
  const Caller root{};
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(CheckpointsDir(), "5-1", root));
  ASSERT_OK_AND_ASSIGN(NodeId device, view.Child(dir, "device", root));
  ASSERT_OK_AND_ASSIGN(auto children, view.Children(device, root));
  ASSERT_EQ(children.size(), 1u);
  EXPECT_EQ(ReadAll(view, children[0].second), "copied bytes");
}

TEST_F(DeviceViewTest, DamagedPagemapLeavesDeviceOutButImagesReadable) {
  nlohmann::json extra = {
      {"pid", 6},
      {"device", {{"cuda_host_ranges", {{{"pid", 6}, {"start", 4096}, {"end", 8192}}}}}}};
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot({"6-1", "test", extra.dump(), "", std::nullopt}));
  Add(writer.get(), "images/pagemap-6.img", "not a pagemap");
  ASSERT_OK(writer->Commit().status());
  StoreView view(store_.get(), nullptr);
  const Caller root{};
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(CheckpointsDir(), "6-1", root));
  EXPECT_FALSE(view.Child(dir, "device", root).ok());
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
