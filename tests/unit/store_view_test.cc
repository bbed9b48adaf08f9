// fs/store_view: the checkpoint tree gpuckptfs shows, on a real store and
// without an engine: lookups, listings and attributes as the owner, root
// and someone else see them; a checkpoint made meanwhile found by a lookup
// at once and listed after Invalidate(); a removed checkpoint's nodes gone,
// an id reused being another incarnation, and a file opened before the
// removal still reading its bytes; and lookups, listings and reads on many
// threads while the checkpoint is removed and made again.
#include "fs/store_view.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;

constexpr uint32_t kOwner = 4242;
const std::string kPages = "images/pages-1.img";

class StoreViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
    owner_.uid = owner_.gid = kOwner;
    other_.uid = other_.gid = kOwner + 1;
  }

  // Checkpoint `id` of kOwner: images/ with a core and a pages image, the
  // latter `pages` (returned).
  std::string Add(const std::string& id, const std::string& pages) {
    nlohmann::json extra = {{"owner", {{"uid", kOwner}, {"gid", kOwner}}}};
    auto writer = store_->BeginSnapshot({id, "test", extra.dump(), "", std::nullopt});
    EXPECT_OK(writer);
    if (!writer.ok()) return pages;
    FileEntry dir;
    dir.path = "images";
    dir.type = FileType::kDirectory;
    dir.mode = 0750;
    dir.uid = dir.gid = kOwner;
    EXPECT_OK((*writer)->AddEntry(dir));
    AddFile(writer->get(), "images/core-1.img", "core of " + id);
    AddFile(writer->get(), kPages, pages);
    EXPECT_OK((*writer)->Commit().status());
    return pages;
  }

  void AddFile(SnapshotWriter* writer, const std::string& path, const std::string& bytes) {
    FileEntry e;
    e.path = path;
    e.mode = 0600;
    e.uid = e.gid = kOwner;
    e.mtime_ns = 1600000000000000000;
    EXPECT_OK(testing::AddBytes(writer, e, bytes));
  }

  // The node of `path` (a/b/c) below `from`, looked up name by name.
  Result<NodeId> Walk(StoreView& view, NodeId from, const std::string& path, const Caller& caller) {
    size_t start = 0;
    while (start <= path.size()) {
      const size_t slash = path.find('/', start);
      const std::string name =
          path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      GPUCKPT_ASSIGN_OR_RETURN(from, view.Child(from, name, caller));
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    return from;
  }

  static std::vector<std::string> Names(
      const std::vector<std::pair<std::string, NodeId>>& children) {
    std::vector<std::string> names;
    for (const auto& [name, id] : children) names.push_back(name);
    return names;
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
  const Caller root_{};
  Caller owner_;
  Caller other_;
};

TEST_F(StoreViewTest, ACheckpointAsItsOwnerRootAndOthersSeeIt) {
  const std::string pages = Add("c1", testing::RandomBytes(300000, 1));
  StoreView view(store_.get(), nullptr);
  ASSERT_OK_AND_ASSIGN(NodeId checkpoints, view.Child(NodeId{}, "checkpoints", root_));
  EXPECT_EQ(checkpoints.kind, NodeKind::kCheckpointsDir);
  for (const Caller& c : {root_, owner_}) {
    ASSERT_OK_AND_ASSIGN(auto listed, view.Children(checkpoints, c));
    EXPECT_EQ(Names(listed), std::vector<std::string>{"c1"});
    ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(checkpoints, "c1", c));
    EXPECT_EQ(dir.kind, NodeKind::kSnapshotDir);
    ASSERT_OK_AND_ASSIGN(SnapshotInfo info, store_->Get("c1"));
    EXPECT_EQ(dir.key, info.key);
    ASSERT_OK_AND_ASSIGN(auto in_dir, view.Children(dir, c));
    EXPECT_EQ(Names(in_dir), (std::vector<std::string>{"manifest.json", "images"}));
    ASSERT_OK_AND_ASSIGN(NodeId images, view.Child(dir, "images", c));
    ASSERT_OK_AND_ASSIGN(auto in_images, view.Children(images, c));
    const std::vector<std::string> image_names = Names(in_images);
    EXPECT_EQ(std::set<std::string>(image_names.begin(), image_names.end()),
              (std::set<std::string>{"core-1.img", "pages-1.img"}));
    ASSERT_OK_AND_ASSIGN(NodeId file, view.Child(images, "pages-1.img", c));
    EXPECT_EQ(file.kind, NodeKind::kSnapshotEntry);
    EXPECT_EQ(file.path, kPages);
    ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(file, c));
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), pages.size());
    EXPECT_EQ(st.st_uid, kOwner);
    ASSERT_OK_AND_ASSIGN(auto reader, view.OpenImage(file));
    EXPECT_EQ(testing::ReadAll(*reader), pages);
    EXPECT_CODE(view.Child(dir, "nope", c), StatusCode::kNotFound);
    EXPECT_CODE(view.Child(images, "nope.img", c), StatusCode::kNotFound);
  }
  // Someone else: absent from listings, lookups and attributes alike.
  ASSERT_OK_AND_ASSIGN(auto listed, view.Children(checkpoints, other_));
  EXPECT_TRUE(listed.empty());
  EXPECT_CODE(view.Child(checkpoints, "c1", other_), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(NodeId file, Walk(view, checkpoints, "c1/" + kPages, owner_));
  EXPECT_CODE(view.Attributes(file, other_), StatusCode::kNotFound);
  EXPECT_CODE(view.Child(checkpoints, "c2", root_), StatusCode::kNotFound);
}

TEST_F(StoreViewTest, ANewCheckpointIsFoundAtOnceAndListedAfterInvalidate) {
  Add("c1", "one");
  StoreView view(store_.get(), nullptr);
  ASSERT_OK_AND_ASSIGN(NodeId checkpoints, view.Child(NodeId{}, "checkpoints", root_));
  ASSERT_OK_AND_ASSIGN(auto before, view.Children(checkpoints, root_));
  EXPECT_EQ(Names(before), std::vector<std::string>{"c1"});
  Add("c2", "two");
  // A lookup asks the store, whatever the cached list says.
  ASSERT_OK_AND_ASSIGN(NodeId c2, view.Child(checkpoints, "c2", owner_));
  ASSERT_OK_AND_ASSIGN(NodeId file, Walk(view, c2, kPages, owner_));
  ASSERT_OK_AND_ASSIGN(auto reader, view.OpenImage(file));
  EXPECT_EQ(testing::ReadAll(*reader), "two");
  view.Invalidate();
  ASSERT_OK_AND_ASSIGN(auto after, view.Children(checkpoints, root_));
  EXPECT_EQ(Names(after), (std::vector<std::string>{"c1", "c2"}));
}

TEST_F(StoreViewTest, ARemovedCheckpointIsGoneAndItsIdReusedIsAnotherOne) {
  Add("c1", "first");
  StoreView view(store_.get(), nullptr);
  ASSERT_OK_AND_ASSIGN(NodeId checkpoints, view.Child(NodeId{}, "checkpoints", root_));
  ASSERT_OK_AND_ASSIGN(NodeId dir, view.Child(checkpoints, "c1", owner_));
  ASSERT_OK_AND_ASSIGN(NodeId file, Walk(view, dir, kPages, owner_));
  ASSERT_OK_AND_ASSIGN(auto open_before, view.OpenImage(file));

  // Only its owner (or root) removes it; someone else does not even see it.
  EXPECT_CODE(view.RemoveSnapshot(dir, other_), StatusCode::kNotFound);
  EXPECT_CODE(view.RemoveSnapshot(file, owner_), StatusCode::kInvalidArgument);
  ASSERT_OK(view.RemoveSnapshot(dir, owner_));
  EXPECT_CODE(view.RemoveSnapshot(dir, owner_), StatusCode::kNotFound);
  EXPECT_CODE(view.Attributes(file, owner_), StatusCode::kNotFound);
  EXPECT_CODE(view.Attributes(dir, root_), StatusCode::kNotFound);
  EXPECT_CODE(view.Children(dir, root_), StatusCode::kNotFound);
  EXPECT_CODE(view.OpenImage(file), StatusCode::kNotFound);
  EXPECT_CODE(view.Child(checkpoints, "c1", root_), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(auto listed, view.Children(checkpoints, root_));
  EXPECT_TRUE(listed.empty());
  // Opened before the removal: still the bytes it was opened on.
  EXPECT_EQ(testing::ReadAll(*open_before), "first");

  Add("c1", "second");
  ASSERT_OK_AND_ASSIGN(NodeId again, view.Child(checkpoints, "c1", owner_));
  EXPECT_NE(again.key, dir.key);
  // The old nodes stay gone; the new ones read the new bytes.
  EXPECT_CODE(view.Attributes(file, owner_), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(NodeId new_file, Walk(view, again, kPages, owner_));
  ASSERT_OK_AND_ASSIGN(auto reader, view.OpenImage(new_file));
  EXPECT_EQ(testing::ReadAll(*reader), "second");
}

TEST_F(StoreViewTest, ManyThreadsReadWhileTheCheckpointIsRemovedAndMadeAgain) {
  // Each incarnation's pages are its own bytes; any read must give exactly
  // one incarnation's.
  constexpr int kIncarnations = 8;
  std::vector<std::string> contents;
  for (int i = 0; i < kIncarnations; ++i) contents.push_back(testing::RandomBytes(70000, 100 + i));
  const std::set<std::string> valid(contents.begin(), contents.end());
  Add("c1", contents[0]);
  StoreView view(store_.get(), nullptr);
  ASSERT_OK_AND_ASSIGN(NodeId checkpoints, view.Child(NodeId{}, "checkpoints", root_));

  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, bad_bytes{0}, unexpected{0};
  std::vector<std::string> unexpected_errors;
  std::mutex errors_mu;
  auto note = [&](const Status& s) {
    // Gone meanwhile is what a removal looks like; anything else is not.
    if (s.ok() || s.code() == StatusCode::kNotFound) return;
    ++unexpected;
    std::lock_guard lock(errors_mu);
    unexpected_errors.push_back(s.ToString());
  };
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      while (!done) {
        note(view.Children(checkpoints, owner_).status());
        auto dir = view.Child(checkpoints, "c1", owner_);
        if (!dir.ok()) {
          note(dir.status());
          continue;
        }
        note(view.Children(*dir, owner_).status());
        auto file = Walk(view, *dir, kPages, owner_);
        if (!file.ok()) {
          note(file.status());
          continue;
        }
        note(view.Attributes(*file, owner_).status());
        auto reader = view.OpenImage(*file);
        if (!reader.ok()) {
          note(reader.status());
          continue;
        }
        if (valid.count(testing::ReadAll(**reader)) == 0) ++bad_bytes;
        ++reads;
      }
    });
  }
  for (int i = 1; i < kIncarnations; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto dir = view.Child(checkpoints, "c1", owner_);
    ASSERT_OK(dir);
    ASSERT_OK(view.RemoveSnapshot(*dir, owner_));
    Add("c1", contents[i]);
    view.Invalidate();
  }
  // Some reads of the last incarnation too.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  done = true;
  for (auto& t : readers) t.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(bad_bytes.load(), 0);
  EXPECT_EQ(unexpected.load(), 0) << (unexpected_errors.empty() ? "" : unexpected_errors[0]);
  ASSERT_OK_AND_ASSIGN(NodeId last, Walk(view, checkpoints, "c1/" + kPages, owner_));
  ASSERT_OK_AND_ASSIGN(auto reader, view.OpenImage(last));
  EXPECT_EQ(testing::ReadAll(*reader), contents.back());
}

}  // namespace
}  // namespace gpuckpt
