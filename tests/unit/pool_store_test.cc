// Stores sharing one RADOS pool (StoreOptions::pool), on a real one-node
// Ceph cluster that tools/micro-ceph starts for this binary: publication,
// listing and fetching across stores, dedup through the pool, pool-wide
// names, removal, the shared seed, background pushes and damaged objects.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>

#include "core/base/scope_exit.h"
#include "core/pool/pool_format.h"
#include "core/pool/rados_pool.h"
#include "core/pooled/pooled_store.h"
#include "gpuckpt/store.h"
#include "tests/unit/micro_ceph.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ReadAll;
using testing::TempDir;

constexpr uint32_t kAlice = 1000;

PoolOptions PoolOf(const std::string& pool = "gpuckpt") {
  PoolOptions p;
  p.pool = pool;
  p.ceph_conf = testing::MicroCephEnvironment::conf();
  p.op_timeout = std::chrono::seconds(20);
  return p;
}

std::unique_ptr<Store> OpenPooled(const std::string& dir, PoolOptions pool = PoolOf()) {
  StoreOptions options = testing::TestOptions();
  options.pool = std::move(pool);
  auto store = Store::Open(dir, options);
  EXPECT_TRUE(testing::IsOk(store));
  return store.ok() ? std::move(store).value() : nullptr;
}

Result<SnapshotInfo> ImportIn(Store& store, const std::string& src, const std::string& name,
                              std::optional<uint32_t> domain = kAlice,
                              const std::string& base = "") {
  SnapshotSpec spec;
  spec.name = name;
  spec.source = src;
  spec.dedup_domain = domain;
  spec.base = base;
  return store.ImportDirectory(src, spec);
}

// A connection of the test's own to the pool, to look into it or damage it.
Result<std::unique_ptr<RadosPool>> ConnectToPool(const std::string& pool = "gpuckpt") {
  PoolConnection connection;
  connection.pool = pool;
  connection.conf_file = testing::MicroCephEnvironment::conf();
  return RadosPool::Connect(connection);
}

std::optional<SnapshotInfo> Listed(Store& store, const std::string& id) {
  auto list = store.List();
  EXPECT_TRUE(testing::IsOk(list));
  if (!list.ok()) return std::nullopt;
  for (const auto& s : *list)
    if (s.id == id) return s;
  return std::nullopt;
}

// Each test uses names of its own: the pool is shared by the whole binary.
class PoolStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_MICRO_CEPH(); }

  // A tree of one random file `f` of `size` bytes: its path.
  std::string OneFileTree(uint64_t size, uint64_t seed) {
    const std::string src = tmp_.Sub("src");
    testing::MakeDirs(src);
    testing::WriteRandomFile(src + "/f", size, seed);
    return src;
  }

  TempDir tmp_{"gpuckpt-pool"};
};

TEST_F(PoolStoreTest, ASnapshotPublishedThroughOneStoreIsListedAndReadThroughAnother) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src + "/sub");
  testing::WriteRandomFile(src + "/a.bin", 3u << 20, 21);
  testing::WriteFile(src + "/sub/text", std::string(200000, 'x'));
  auto a = OpenPooled(tmp_.Sub("a"));
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo made, ImportIn(*a, src, "across-1"));
  EXPECT_NE(made.pool_incarnation, 0u);

  std::optional<SnapshotInfo> seen = Listed(*b, "across-1");
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(seen->pool_only);
  EXPECT_EQ(seen->pool_incarnation, made.pool_incarnation);
  EXPECT_EQ(seen->dedup_domain, std::optional<uint32_t>(kAlice));
  EXPECT_EQ(seen->logical_bytes, made.logical_bytes);

  EXPECT_EQ(ReadAll(*b, "across-1", "a.bin"), testing::RandomBytes(3u << 20, 21));
  EXPECT_EQ(ReadAll(*b, "across-1", "sub/text"), std::string(200000, 'x'));
  // Fetched once, and no more than what the snapshot stored.
  const PoolStats fetched = *b->pool_stats();
  EXPECT_EQ(fetched.pulls, 1u);
  EXPECT_GT(fetched.fetched_bytes, 0u);
  EXPECT_LE(fetched.fetched_bytes, made.stored_bytes);
  std::optional<SnapshotInfo> local = Listed(*b, "across-1");
  ASSERT_TRUE(local.has_value());
  EXPECT_FALSE(local->pool_only);
  EXPECT_EQ(local->pool_incarnation, made.pool_incarnation);
  auto report = b->Fsck();
  ASSERT_OK(report);
  EXPECT_TRUE(report->clean()) << ::testing::PrintToString(report->problems);
}

TEST_F(PoolStoreTest, ARepeatedSnapshotSendsAndFetchesOnlyWhatChanged) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  std::string data = testing::RandomBytes(8u << 20, 31);
  testing::WriteFile(src + "/mem.bin", data);
  auto a = OpenPooled(tmp_.Sub("a"));
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, ImportIn(*a, src, "repeat-1"));
  ASSERT_EQ(ReadAll(*b, "repeat-1", "mem.bin"), data);

  // 64 KiB changed in the middle, written through the other store, on the
  // snapshot it fetched.
  data.replace(4u << 20, 65536, testing::RandomBytes(65536, 32));
  testing::WriteFile(src + "/mem.bin", data);
  const PoolStats b_before = *b->pool_stats();
  ASSERT_OK_AND_ASSIGN(SnapshotInfo second, ImportIn(*b, src, "repeat-2", kAlice, "repeat-1"));
  const PoolStats b_after = *b->pool_stats();
  const uint64_t sent = b_after.uploaded_bytes - b_before.uploaded_bytes;
  EXPECT_GT(sent, 0u);
  EXPECT_LE(sent, second.stored_bytes);
  EXPECT_LT(sent, first.stored_bytes / 8) << "the pool had all but the changed chunks";
  EXPECT_GT(b_after.reused_chunks - b_before.reused_chunks, 0u);

  const PoolStats a_before = *a->pool_stats();
  EXPECT_EQ(ReadAll(*a, "repeat-2", "mem.bin"), data);
  const uint64_t fetched = a->pool_stats()->fetched_bytes - a_before.fetched_bytes;
  EXPECT_LE(fetched, sent) << "the first store had every chunk but the new ones";
}

TEST_F(PoolStoreTest, FetchesOfDifferentSnapshotsRunSideBySideAndOfOneHappenOnce) {
  const std::string one = tmp_.Sub("one"), two = tmp_.Sub("two");
  testing::MakeDirs(one);
  testing::MakeDirs(two);
  testing::WriteRandomFile(one + "/f", 2u << 20, 41);
  testing::WriteRandomFile(two + "/f", 2u << 20, 42);
  auto a = OpenPooled(tmp_.Sub("a"));
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  ASSERT_OK(ImportIn(*a, one, "side-1").status());
  ASSERT_OK(ImportIn(*a, two, "side-2").status());

  // b's fetch of side-1 is held once it is under way.
  std::promise<void> reached, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> fetches_of_one{0};
  static_cast<PooledStore&>(*b).SetPullHookForTesting([&](const std::string& id) {
    if (id != "side-1") return;
    if (fetches_of_one.fetch_add(1) == 0) reached.set_value();
    released.wait();
  });
  // Declared before the release below, so that a failed assertion lets
  // the held fetch go before the readers are waited for.
  std::future<std::string> first, again, other;
  bool let_go = false;
  ScopeExit let_go_at_the_end([&] {
    if (!let_go) release.set_value();
  });
  first = std::async(std::launch::async, [&] { return ReadAll(*b, "side-1", "f"); });
  ASSERT_EQ(reached.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  again = std::async(std::launch::async, [&] { return ReadAll(*b, "side-1", "f"); });
  other = std::async(std::launch::async, [&] { return ReadAll(*b, "side-2", "f"); });

  // Another snapshot's fetch is not held up by it.
  ASSERT_EQ(other.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "the fetch of side-2 waited for the held fetch of side-1";
  EXPECT_EQ(other.get(), testing::RandomBytes(2u << 20, 42));
  // A second reader of the same snapshot waits for the fetch under way.
  EXPECT_EQ(again.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  let_go = true;
  release.set_value();
  EXPECT_EQ(first.get(), testing::RandomBytes(2u << 20, 41));
  EXPECT_EQ(again.get(), testing::RandomBytes(2u << 20, 41));
  EXPECT_EQ(fetches_of_one.load(), 1) << "side-1 was fetched twice";
  EXPECT_EQ(b->pool_stats()->pulls, 2u);
}

TEST_F(PoolStoreTest, NamesArePoolWideAndAnAbandonedNameIsFreeAgain) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  testing::WriteFile(src + "/f", "contents");
  auto a = OpenPooled(tmp_.Sub("a"));
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  ASSERT_OK(ImportIn(*a, src, "names-1"));
  EXPECT_CODE(ImportIn(*b, src, "names-1"), StatusCode::kAlreadyExists);
  {
    SnapshotSpec spec;
    spec.name = "names-2";
    auto writer = a->BeginSnapshot(spec);
    ASSERT_OK(writer);
    // While a writes it, nobody else may.
    EXPECT_CODE(ImportIn(*b, src, "names-2"), StatusCode::kAlreadyExists);
  }  // abandoned: not committed
  EXPECT_OK(ImportIn(*b, src, "names-2"));
}

TEST_F(PoolStoreTest, ARemovalThroughOneStoreReachesTheOthers) {
  const std::string src = OneFileTree(100000, 41);
  auto a = OpenPooled(tmp_.Sub("a"));
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  ASSERT_OK(ImportIn(*a, src, "gone-1"));
  ASSERT_OK(ImportIn(*a, src, "gone-2"));
  ASSERT_EQ(ReadAll(*b, "gone-1", "f"), testing::RandomBytes(100000, 41));  // b has a copy
  ASSERT_OK(a->Remove("gone-1"));
  EXPECT_FALSE(Listed(*b, "gone-1").has_value());
  EXPECT_CODE(b->Get("gone-1"), StatusCode::kNotFound);
  // A pool-only snapshot removed through the other store.
  ASSERT_OK(b->Remove("gone-2"));
  EXPECT_FALSE(Listed(*a, "gone-2").has_value());
  EXPECT_CODE(a->Get("gone-2"), StatusCode::kNotFound);
  // The name is free again, pool-wide.
  EXPECT_OK(ImportIn(*b, src, "gone-1"));
}

TEST_F(PoolStoreTest, AStoreWithSnapshotsUnderAnotherSeedCannotJoin) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  testing::WriteFile(src + "/f", "x");
  {
    // The pool gets its seed from whichever store uses it first.
    auto first = OpenPooled(tmp_.Sub("first"));
    ASSERT_TRUE(first);
  }
  {
    auto alone = Store::Open(tmp_.Sub("alone"), testing::TestOptions());
    ASSERT_OK(alone);
    ASSERT_OK(ImportIn(**alone, src, "seed-alone"));
  }
  StoreOptions options = testing::TestOptions();
  options.pool = PoolOf();
  auto joined = Store::Open(tmp_.Sub("alone"), options);
  ASSERT_CODE(joined, StatusCode::kInvalidArgument);
  EXPECT_NE(joined.status().message().find("new, empty store"), std::string::npos)
      << joined.status().message();
}

TEST_F(PoolStoreTest, BackgroundPushesPublishAfterTheCommit) {
  const std::string src = OneFileTree(1u << 20, 51);
  PoolOptions background = PoolOf();
  background.background = true;
  auto a = OpenPooled(tmp_.Sub("a"), background);
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  ASSERT_OK(ImportIn(*a, src, "later-1"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (a->pool_stats()->pushes == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const PoolStats stats = *a->pool_stats();
  EXPECT_EQ(stats.pushes, 1u) << stats.last_error;
  EXPECT_EQ(stats.pending, 0u);
  auto mine = a->Get("later-1");
  ASSERT_OK(mine);
  EXPECT_NE(mine->pool_incarnation, 0u);
  EXPECT_EQ(ReadAll(*b, "later-1", "f"), testing::RandomBytes(1u << 20, 51));
}

TEST_F(PoolStoreTest, ADamagedChunkInThePoolFailsTheFetchAndPublishesNothing) {
  const std::string src = OneFileTree(256u << 10, 61);
  auto a = OpenPooled(tmp_.Sub("a"));
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  const PoolStats before = *a->pool_stats();
  ASSERT_OK(ImportIn(*a, src, "damaged-1"));
  ASSERT_GT(a->pool_stats()->uploaded_chunks, before.uploaded_chunks);

  // Every pack object this test wrote gets a flipped byte in its middle.
  ASSERT_OK_AND_ASSIGN(auto rados, ConnectToPool());
  ASSERT_OK_AND_ASSIGN(auto objects, rados->ListObjects("gpuckpt.pack."));
  bool damaged_one = false;
  for (const std::string& oid : objects) {
    ASSERT_OK_AND_ASSIGN(std::string data, rados->ReadWhole(oid, 64u << 20));
    // Only packs of this test's random data: too small to be another's.
    if (data.size() < (200u << 10) || data.size() > (300u << 10)) continue;
    data[data.size() / 2] ^= 0x40;
    ASSERT_OK(rados->WriteFull(oid, data));
    damaged_one = true;
  }
  ASSERT_TRUE(damaged_one);
  auto reader = b->OpenFile("damaged-1", "f");
  ASSERT_CODE(reader, StatusCode::kCorruption);
  EXPECT_NE(reader.status().message().find("damaged"), std::string::npos)
      << reader.status().message();
  std::optional<SnapshotInfo> listed = Listed(*b, "damaged-1");
  ASSERT_TRUE(listed.has_value());
  EXPECT_TRUE(listed->pool_only) << "nothing of it was published in the second store";
  EXPECT_EQ(b->pool_stats()->pull_failures, 1u);
}

TEST_F(PoolStoreTest, ACatalogEntryThatCannotBeReadHidesOnlyItself) {
  const std::string src = OneFileTree(70000, 81);
  auto a = OpenPooled(tmp_.Sub("a"));
  auto b = OpenPooled(tmp_.Sub("b"));
  ASSERT_TRUE(a && b);
  ASSERT_OK(ImportIn(*a, src, "unread-1"));
  ASSERT_OK(ImportIn(*a, src, "unread-2"));
  ASSERT_EQ(ReadAll(*b, "unread-1", "f"), testing::RandomBytes(70000, 81));  // b has a copy

  ASSERT_OK_AND_ASSIGN(auto rados, ConnectToPool());
  ASSERT_OK(rados->OmapSet(pool::CatalogObject(), {{"unread-1", "\x09not an entry"}}));

  // The copy is kept (the snapshot may well be there still), nothing else
  // is lost, and a store without a copy does not list it.
  EXPECT_TRUE(Listed(*b, "unread-1").has_value());
  EXPECT_TRUE(Listed(*b, "unread-2").has_value());
  auto c = OpenPooled(tmp_.Sub("c"));
  ASSERT_TRUE(c);
  EXPECT_FALSE(Listed(*c, "unread-1").has_value());
  EXPECT_TRUE(Listed(*c, "unread-2").has_value());
  EXPECT_CODE(c->OpenFile("unread-1", "f"), StatusCode::kCorruption);
}

// The collector's tests have a pool of their own: their gc must not sweep
// what the other tests of the binary leave behind, nor theirs it.
constexpr char kGcPool[] = "gpuckpt-gc";

PoolOptions GcPool(std::chrono::seconds grace) {
  PoolOptions p = PoolOf(kGcPool);
  p.gc_grace = grace;
  return p;
}

TEST_F(PoolStoreTest, GcMarksFirstSweepsAfterTheGraceAndKeepsWhatSnapshotsName) {
  const std::string keep = tmp_.Sub("keep");
  const std::string drop = tmp_.Sub("drop");
  testing::MakeDirs(keep);
  testing::MakeDirs(drop);
  testing::WriteRandomFile(keep + "/f", 1u << 20, 71);
  testing::WriteRandomFile(drop + "/f", 1u << 20, 72);
  auto a = OpenPooled(tmp_.Sub("a"), GcPool(std::chrono::seconds(2)));
  ASSERT_TRUE(a);
  ASSERT_OK(ImportIn(*a, keep, "gc-keep"));
  ASSERT_OK(ImportIn(*a, drop, "gc-drop"));
  ASSERT_OK(a->Remove("gc-drop"));

  ASSERT_OK_AND_ASSIGN(GcReport marked, a->Gc());
  EXPECT_TRUE(marked.pool_collected);
  EXPECT_GT(marked.pool_marked_chunks, 0u);
  EXPECT_FALSE(marked.pool_swept) << "a sweep before the grace has passed";
  EXPECT_GT(marked.pool_sweep_due_in_s, 0u);
  ASSERT_OK_AND_ASSIGN(GcReport early, a->Gc());
  EXPECT_FALSE(early.pool_swept);

  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  ASSERT_OK_AND_ASSIGN(GcReport swept, a->Gc());
  EXPECT_TRUE(swept.pool_swept);
  EXPECT_GE(swept.pool_swept_chunks, marked.pool_marked_chunks);
  EXPECT_GT(swept.pool_swept_objects, 0u) << "the dropped snapshot's pack objects go";

  // What a snapshot names is all there, for a store that has none of it.
  auto fresh = OpenPooled(tmp_.Sub("fresh"), GcPool(std::chrono::seconds(2)));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(ReadAll(*fresh, "gc-keep", "f"), testing::RandomBytes(1u << 20, 71));
  EXPECT_CODE(fresh->Get("gc-drop"), StatusCode::kNotFound);
}

TEST_F(PoolStoreTest, ChunksWritersReuseWhileACollectorRunsAreNeverLost) {
  // Two stores keep publishing snapshots of slowly changing data and
  // removing the older ones, so that chunks go out of use and come back,
  // while a third store collects as often as it can.
  constexpr auto kGrace = std::chrono::seconds(3);
  auto a = OpenPooled(tmp_.Sub("a"), GcPool(kGrace));
  auto b = OpenPooled(tmp_.Sub("b"), GcPool(kGrace));
  auto collector = OpenPooled(tmp_.Sub("collector"), GcPool(kGrace));
  ASSERT_TRUE(a && b && collector);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> collections{0}, sweeps{0};
  std::string collector_error;
  std::thread gc([&] {
    while (!stop) {
      auto r = collector->Gc();
      if (!r.ok()) {
        collector_error = r.status().ToString();
        return;
      }
      collections++;
      if (r->pool_swept) sweeps++;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  // Snapshot i of writer w holds 8 pieces of 64 KiB, piece k from seed
  // (k + i / 2) % 12: each piece is dropped and taken up again as i grows.
  auto contents = [](int w, int i) {
    std::string data;
    for (int k = 0; k < 8; ++k)
      data += testing::RandomBytes(65536, static_cast<uint64_t>(100 * w + (k + i / 2) % 12));
    return data;
  };
  auto writer = [&](Store* store, int w, std::string* error) {
    const std::string src = tmp_.Sub("src" + std::to_string(w));
    testing::MakeDirs(src);
    for (int i = 0; i < 24 && error->empty(); ++i) {
      testing::WriteFile(src + "/f", contents(w, i));
      auto made = ImportIn(*store, src, fmt::format("race-{}-{}", w, i));
      if (!made.ok()) *error = made.status().ToString();
      if (i >= 2) {
        Status removed = store->Remove(fmt::format("race-{}-{}", w, i - 2));
        if (!removed.ok()) *error = removed.ToString();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  };
  std::string a_error, b_error;
  std::thread wa(writer, a.get(), 1, &a_error);
  std::thread wb(writer, b.get(), 2, &b_error);
  wa.join();
  wb.join();
  stop = true;
  gc.join();
  EXPECT_EQ(a_error, "");
  EXPECT_EQ(b_error, "");
  EXPECT_EQ(collector_error, "");
  EXPECT_GT(collections.load(), 5u);
  EXPECT_GT(sweeps.load(), 0u) << "the race never reached a sweep";

  // Every snapshot still published reads back whole through a store that
  // has to fetch all of it.
  auto fresh = OpenPooled(tmp_.Sub("fresh"), GcPool(kGrace));
  ASSERT_TRUE(fresh);
  for (int w = 1; w <= 2; ++w) {
    for (int i = 22; i < 24; ++i) {
      const std::string id = fmt::format("race-{}-{}", w, i);
      EXPECT_EQ(ReadAll(*fresh, id, "f"), contents(w, i)) << id;
    }
  }
}

}  // namespace
}  // namespace gpuckpt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(
      new gpuckpt::testing::MicroCephEnvironment({"gpuckpt", "gpuckpt-gc"}));
  return RUN_ALL_TESTS();
}
