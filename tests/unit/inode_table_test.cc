// fs/inode_table: the inode numbers gpuckptfs gives the kernel: the root's
// fixed number, one number per node while the kernel holds references,
// numbers never reused, a checkpoint reused under its id getting new ones,
// a forget of references never given aborting, and many FUSE threads at once.
#include "fs/inode_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace gpuckpt {
namespace {

constexpr uint64_t kRootIno = 1;  // FUSE_ROOT_ID

NodeId Entry(const std::string& snapshot, uint64_t key, const std::string& path) {
  NodeId n;
  n.kind = NodeKind::kSnapshotEntry;
  n.snapshot = snapshot;
  n.key = key;
  n.path = path;
  return n;
}

TEST(InodeTableTest, TheRootIsOneForever) {
  InodeTable table;
  auto root = table.Get(kRootIno);
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(*root, NodeId{});
  EXPECT_EQ(table.Ref(NodeId{}), kRootIno);
  // Forgetting the root, by any count, changes nothing.
  table.Forget(kRootIno, 1000);
  EXPECT_TRUE(table.Get(kRootIno).has_value());
  EXPECT_EQ(table.Ref(NodeId{}), kRootIno);
}

TEST(InodeTableTest, ANodeKeepsItsNumberWhileReferenced) {
  InodeTable table;
  const NodeId a = Entry("c1", 1, "images/pages-1.img");
  const NodeId b = Entry("c1", 1, "images/core-1.img");
  const uint64_t ia = table.Ref(a);
  const uint64_t ib = table.Ref(b);
  EXPECT_GT(ia, kRootIno);
  EXPECT_GT(ib, kRootIno);
  EXPECT_NE(ia, ib);
  EXPECT_EQ(table.Ref(a), ia);  // a second lookup: same number, two references
  EXPECT_EQ(table.Get(ia), a);
  EXPECT_EQ(table.Get(ib), b);
  table.Forget(ia, 1);
  EXPECT_EQ(table.Get(ia), a);  // one reference left
  table.Forget(ia, 1);
  EXPECT_EQ(table.Get(ia), std::nullopt);
  EXPECT_EQ(table.Get(ib), b);  // others untouched
  EXPECT_EQ(table.Get(987654), std::nullopt);
}

TEST(InodeTableTest, NumbersAreNeverReused) {
  InodeTable table;
  const NodeId a = Entry("c1", 1, "x");
  std::set<uint64_t> given;
  for (int i = 0; i < 100; ++i) {
    const uint64_t ino = table.Ref(a);
    EXPECT_TRUE(given.insert(ino).second) << "inode " << ino << " given twice";
    table.Forget(ino, 1);
  }
}

TEST(InodeTableTest, AnIdReusedByAnotherCheckpointGetsOtherNumbers) {
  InodeTable table;
  // The same id and path, another incarnation (key): the kernel may still
  // hold the old one's number.
  const uint64_t old_ino = table.Ref(Entry("c1", 1, "images/pages-1.img"));
  const uint64_t new_ino = table.Ref(Entry("c1", 2, "images/pages-1.img"));
  EXPECT_NE(old_ino, new_ino);
  EXPECT_EQ(table.Get(old_ino)->key, 1u);
  EXPECT_EQ(table.Get(new_ino)->key, 2u);
}

TEST(InodeTableTest, ForgettingMoreThanWasGivenAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  InodeTable table;
  const uint64_t ino = table.Ref(Entry("c1", 1, "x"));
  EXPECT_DEATH(table.Forget(ino, 2), "does not hold");
  EXPECT_DEATH(table.Forget(ino + 1000, 1), "does not hold");
}

TEST(InodeTableTest, ManyThreadsLookingUpAndForgetting) {
  constexpr int kThreads = 8;
  constexpr int kNodes = 50;
  constexpr int kRefsEach = 20;
  InodeTable table;
  std::vector<NodeId> nodes;
  for (int i = 0; i < kNodes; ++i)
    nodes.push_back(Entry("c" + std::to_string(i % 5), 1, std::to_string(i)));

  // Every thread references every node kRefsEach times, in its own order.
  std::vector<std::vector<uint64_t>> inos(kThreads, std::vector<uint64_t>(kNodes));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRefsEach; ++r)
        for (int i = 0; i < kNodes; ++i) {
          const int n = (i * 7 + t) % kNodes;
          inos[t][n] = table.Ref(nodes[n]);
        }
    });
  }
  for (auto& t : threads) t.join();
  std::set<uint64_t> distinct;
  for (int n = 0; n < kNodes; ++n) {
    for (int t = 1; t < kThreads; ++t) EXPECT_EQ(inos[t][n], inos[0][n]) << "node " << n;
    EXPECT_EQ(table.Get(inos[0][n]), nodes[n]);
    distinct.insert(inos[0][n]);
  }
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kNodes));

  // Now all of them forget, in pieces, racing with lookups of other nodes.
  threads.clear();
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kNodes; ++i) {
        const int n = (i * 3 + t) % kNodes;
        table.Forget(inos[0][n], kRefsEach / 2);
        const uint64_t other = table.Ref(Entry("other", 1, std::to_string(t)));
        if (table.Get(other) != Entry("other", 1, std::to_string(t))) ++wrong;
        table.Forget(other, 1);
        table.Forget(inos[0][n], kRefsEach - kRefsEach / 2);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  for (int n = 0; n < kNodes; ++n) EXPECT_EQ(table.Get(inos[0][n]), std::nullopt) << "node " << n;
  EXPECT_TRUE(table.Get(kRootIno).has_value());
}

}  // namespace
}  // namespace gpuckpt
