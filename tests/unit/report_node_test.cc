// report.html at the top of the mount, through StoreView on a real store
// (no engine, no mount): there for everyone, and each reader's page
// covers what checkpoints/ shows them: their own checkpoints, root's all.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "fs/store_view.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

class ReportNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
  }

  // A checkpoint `id` of process `pid` of `uid`.
  void Add(const std::string& id, uint32_t uid, int pid, uint64_t seed) {
    nlohmann::json extra = {{"version", 2},
                            {"pid", pid},
                            {"command", "cmd of " + id},
                            {"owner", {{"uid", uid}, {"gid", uid}}}};
    ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot({id, "test", extra.dump(), "", uid}));
    FileEntry e;
    e.path = "pages-1.img";
    e.mode = 0600;
    e.uid = e.gid = uid;
    ASSERT_OK(testing::AddBytes(writer.get(), e, testing::RandomBytes(100000, seed)));
    ASSERT_OK(writer->Commit().status());
  }

  std::string Report(StoreView& view, const Caller& caller) {
    auto node = view.Child(NodeId{}, "report.html", caller);
    EXPECT_OK(node);
    if (!node.ok()) return "";
    auto page = view.GeneratedContent(*node, caller);
    EXPECT_OK(page);
    return page.ok() ? *page : "";
  }

  static Caller As(uint32_t uid) {
    Caller c;
    c.uid = c.gid = uid;
    return c;
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
};

TEST_F(ReportNodeTest, EachReaderSeesTheirOwnCheckpointsAndRootAll) {
  Add("mine-1", 4242, 100, 1);
  Add("mine-2", 4242, 100, 2);
  Add("roots-1", 0, 200, 3);
  StoreView view(store_.get(), nullptr);

  // (Listing the top needs the engine's processes: the integration test lists it.)
  ASSERT_OK_AND_ASSIGN(NodeId node, view.Child(NodeId{}, "report.html", As(4242)));
  ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(node, As(4242)));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0444u);

  const std::string root = Report(view, Caller{});
  EXPECT_NE(root.find(">mine-1<"), std::string::npos);
  EXPECT_NE(root.find(">roots-1<"), std::string::npos);
  EXPECT_NE(root.find("the checkpoints of every owner"), std::string::npos);
  EXPECT_NE(root.find("<h3>Owners</h3>"), std::string::npos);

  const std::string theirs = Report(view, As(4242));
  EXPECT_NE(theirs.find(">mine-1<"), std::string::npos);
  EXPECT_NE(theirs.find(">mine-2<"), std::string::npos);
  EXPECT_EQ(theirs.find("roots-1"), std::string::npos);
  EXPECT_EQ(theirs.find("<h3>Owners</h3>"), std::string::npos);
  EXPECT_NE(theirs.find("2 checkpoints of 1 process"), std::string::npos);

  const std::string nobodys = Report(view, As(4243));
  EXPECT_EQ(nobodys.find("mine-1"), std::string::npos);
  EXPECT_EQ(nobodys.find("roots-1"), std::string::npos);
  EXPECT_NE(nobodys.find("0 checkpoints of 0 processes"), std::string::npos);
}

}  // namespace
}  // namespace gpuckpt
