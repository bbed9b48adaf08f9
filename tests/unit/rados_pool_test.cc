// RadosPool against a real one-node Ceph cluster (tools/micro-ceph, with
// memstore), started once for the binary: every member, binary keys, locks
// and their leases, a pool over its quota, and an OSD that stops answering.
#include "core/pool/rados_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/micro_ceph.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using namespace std::chrono_literals;
using Entries = std::vector<std::pair<std::string, std::string>>;
using testing::RandomBytes;
using testing::RemoveTree;

constexpr char kPool[] = "gpuckpt";
// A pool of its own for the quota test, so that the others never see it full.
constexpr char kQuotaPool[] = "quota";

using testing::MicroCephEnvironment;
using testing::RunMicroCeph;

[[maybe_unused]] auto* const cluster_environment =
    ::testing::AddGlobalTestEnvironment(new MicroCephEnvironment({kPool, kQuotaPool}));

PoolConnection Connection(std::string pool = kPool,
                          std::chrono::milliseconds op_timeout = 30000ms) {
  PoolConnection connection;
  connection.pool = std::move(pool);
  connection.conf_file = MicroCephEnvironment::conf();
  connection.op_timeout = op_timeout;
  return connection;
}

class RadosPoolTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!MicroCephEnvironment::skip_reason().empty()) return;
    auto connected = RadosPool::Connect(Connection());
    ASSERT_TRUE(connected.ok()) << connected.status().ToString();
    pool_ = std::move(connected).value().release();
  }
  static void TearDownTestSuite() {
    delete pool_;
    pool_ = nullptr;
  }
  void SetUp() override {
    if (!MicroCephEnvironment::skip_reason().empty())
      GTEST_SKIP() << MicroCephEnvironment::skip_reason();
    ASSERT_NE(pool_, nullptr);
  }
  // A name of this test's own, so that tests never see each other's objects.
  static std::string Name(const std::string& suffix) {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
           suffix;
  }
  static RadosPool* pool_;
};
RadosPool* RadosPoolTest::pool_ = nullptr;

TEST_F(RadosPoolTest, WriteFullReadAndReadWhole) {
  const std::string oid = Name("object");
  const std::string data = RandomBytes(300000, 1);
  ASSERT_TRUE(pool_->WriteFull(oid, data).ok());
  EXPECT_EQ(pool_->pool_name(), kPool);

  auto all = pool_->Read(oid, 0, data.size());
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, data);
  auto middle = pool_->Read(oid, 1000, 500);
  ASSERT_TRUE(middle.ok());
  EXPECT_EQ(*middle, data.substr(1000, 500));
  auto tail = pool_->Read(oid, data.size() - 10, 1 << 20);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, data.substr(data.size() - 10));
  auto beyond = pool_->Read(oid, data.size() + 5, 100);
  ASSERT_TRUE(beyond.ok());
  EXPECT_EQ(*beyond, "");

  auto whole = pool_->ReadWhole(oid, data.size());
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(*whole, data);
  auto too_large = pool_->ReadWhole(oid, data.size() - 1);
  EXPECT_EQ(too_large.status().code(), StatusCode::kInvalidArgument);

  // WriteFull replaces, it does not overwrite in place.
  ASSERT_TRUE(pool_->WriteFull(oid, "short").ok());
  auto replaced = pool_->ReadWhole(oid, 1 << 20);
  ASSERT_TRUE(replaced.ok());
  EXPECT_EQ(*replaced, "short");
  ASSERT_TRUE(pool_->WriteFull(oid, "").ok());
  EXPECT_EQ(pool_->ReadWhole(oid, 0).value(), "");
}

TEST_F(RadosPoolTest, ReadsOfAnAbsentObjectAreNotFound) {
  const std::string oid = Name("absent");
  EXPECT_EQ(pool_->Read(oid, 0, 10).status().code(), StatusCode::kNotFound);
  auto whole = pool_->ReadWhole(oid, 10);
  EXPECT_EQ(whole.status().code(), StatusCode::kNotFound);
  EXPECT_NE(whole.status().message().find("pool gpuckpt"), std::string::npos)
      << whole.status().message();
  EXPECT_NE(whole.status().message().find(oid), std::string::npos) << whole.status().message();
}

TEST_F(RadosPoolTest, CreateExclusiveTwiceIsAlreadyExists) {
  const std::string oid = Name("object");
  ASSERT_TRUE(pool_->CreateExclusive(oid, "first").ok());
  const Status again = pool_->CreateExclusive(oid, "second");
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_EQ(pool_->ReadWhole(oid, 100).value(), "first");
}

TEST_F(RadosPoolTest, StatAndRemove) {
  const std::string oid = Name("object");
  auto absent = pool_->Stat(oid);
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_FALSE(absent->has_value());
  EXPECT_EQ(pool_->Remove(oid).code(), StatusCode::kNotFound);

  ASSERT_TRUE(pool_->WriteFull(oid, std::string(12345, 'x')).ok());
  auto stat = pool_->Stat(oid);
  ASSERT_TRUE(stat.ok());
  ASSERT_TRUE(stat->has_value());
  EXPECT_EQ((*stat)->size, 12345u);
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  EXPECT_LE(std::abs((*stat)->mtime_unix_s - now), 60);

  ASSERT_TRUE(pool_->Remove(oid).ok());
  EXPECT_FALSE(pool_->Stat(oid).value().has_value());
  EXPECT_EQ(pool_->Remove(oid).code(), StatusCode::kNotFound);
}

TEST_F(RadosPoolTest, ListObjectsByPrefix) {
  for (const char* name : {"list-a-1", "list-a-2", "list-b-1", "list-a"}) {
    ASSERT_TRUE(pool_->WriteFull(name, name).ok());
  }
  auto listed = pool_->ListObjects("list-a-");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  std::sort(listed->begin(), listed->end());
  EXPECT_EQ(*listed, (std::vector<std::string>{"list-a-1", "list-a-2"}));
  auto everything = pool_->ListObjects("");
  ASSERT_TRUE(everything.ok());
  EXPECT_GE(everything->size(), 4u);
  EXPECT_EQ(pool_->ListObjects("list-none-").value().size(), 0u);
}

TEST_F(RadosPoolTest, BatchOf100WritesAndReads) {
  std::vector<std::string> oids, datas;
  for (int i = 0; i < 100; ++i) {
    oids.push_back(Name(std::to_string(i)));
    datas.push_back(RandomBytes(1 + (i * 7919) % 65536, 100 + i));
  }
  {
    auto batch = pool_->NewBatch(8);
    for (int i = 0; i < 100; ++i) batch->WriteFull(oids[i], datas[i]);
    const Status written = batch->Wait();
    ASSERT_TRUE(written.ok()) << written.ToString();
  }
  std::vector<std::string> read(100, "stale");
  std::string middle, absent = "stale";
  auto batch = pool_->NewBatch(8);
  for (int i = 0; i < 100; ++i) batch->Read(oids[i], 0, 1 << 20, &read[i]);
  batch->Read(oids[5], 10, 20, &middle);
  batch->Read(Name("absent"), 0, 10, &absent);
  const Status status = batch->Wait();
  EXPECT_EQ(status.code(), StatusCode::kNotFound) << status.ToString();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(read[i], datas[i]) << "object " << i;
  EXPECT_EQ(middle, datas[5].substr(10, 20));
  EXPECT_EQ(absent, "");
  // The error was reported once; the batch goes on.
  std::string again;
  batch->Read(oids[0], 0, 100, &again);
  EXPECT_TRUE(batch->Wait().ok());
  EXPECT_EQ(again, datas[0].substr(0, 100));
}

TEST_F(RadosPoolTest, DestroyingABatchWaitsForItsOperations) {
  std::vector<std::string> oids;
  {
    auto batch = pool_->NewBatch(4);
    for (int i = 0; i < 20; ++i) {
      oids.push_back(Name(std::to_string(i)));
      batch->WriteFull(oids.back(), std::string(1000, static_cast<char>('a' + i)));
    }
  }
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(pool_->ReadWhole(oids[i], 1000).value(),
              std::string(1000, static_cast<char>('a' + i)));
  }
}

TEST_F(RadosPoolTest, OmapRoundTripWithBinaryKeysAndValues) {
  const std::string oid = Name("map");
  const std::string nul_key("k\0ey", 4), ff_key("\xff\x00\xff", 3);
  const std::string nul_value("\0\0v\0", 4), ff_value("\xff", 1);
  const Entries entries = {{nul_key, nul_value}, {ff_key, ff_value}, {"plain", ""}};
  ASSERT_TRUE(pool_->OmapSet(oid, entries).ok());

  auto got = pool_->OmapGet(oid, {ff_key, "absent", nul_key, "plain", std::string("k", 1)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::sort(got->begin(), got->end());
  Entries expected = entries;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(*got, expected);

  ASSERT_TRUE(pool_->OmapRemove(oid, {nul_key, "absent"}).ok());
  auto after = pool_->OmapGet(oid, {nul_key, ff_key});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, (Entries{{ff_key, ff_value}}));

  auto of_absent = pool_->OmapGet(Name("absent"), {"plain"});
  ASSERT_TRUE(of_absent.ok()) << of_absent.status().ToString();
  EXPECT_TRUE(of_absent->empty());
  EXPECT_EQ(pool_->OmapRemove(Name("absent"), {"plain"}).code(), StatusCode::kNotFound);
  EXPECT_FALSE(pool_->Stat(Name("absent")).value().has_value());
}

TEST_F(RadosPoolTest, OmapListPages) {
  const std::string oid = Name("map");
  Entries entries;
  for (int i = 0; i < 25; ++i) {
    char key[8];
    std::snprintf(key, sizeof key, "key%02d", i);
    entries.emplace_back(key, "value" + std::to_string(i));
  }
  ASSERT_TRUE(pool_->OmapSet(oid, entries).ok());
  Entries listed;
  std::vector<size_t> page_sizes;
  std::string after;
  for (;;) {
    auto page = pool_->OmapList(oid, after, 10);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    page_sizes.push_back(page->size());
    listed.insert(listed.end(), page->begin(), page->end());
    if (page->size() < 10) break;
    after = page->back().first;
  }
  EXPECT_EQ(page_sizes, (std::vector<size_t>{10, 10, 5}));
  EXPECT_EQ(listed, entries);
  EXPECT_TRUE(pool_->OmapList(Name("absent"), "", 10).value().empty());
  EXPECT_TRUE(pool_->OmapList(oid, "", 0).value().empty());
}

TEST_F(RadosPoolTest, OmapListAfterAKeyWithANulByte) {
  const std::string oid = Name("map");
  const std::vector<std::string> keys = {
      "p", std::string("p\0", 2), std::string("p\0a", 3), std::string("p\0b", 3), "pa", "q"};
  Entries entries;
  for (const std::string& key : keys) entries.emplace_back(key, "v");
  ASSERT_TRUE(pool_->OmapSet(oid, entries).ok());
  auto page = pool_->OmapList(oid, std::string("p\0a", 3), 2);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].first, std::string("p\0b", 3));
  EXPECT_EQ((*page)[1].first, "pa");
  auto rest = pool_->OmapList(oid, std::string("p\0", 2), 10);
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->size(), 4u);
  EXPECT_EQ(rest->front().first, std::string("p\0a", 3));
  EXPECT_EQ(rest->back().first, "q");
}

TEST_F(RadosPoolTest, OmapReplaceIfEqual) {
  const std::string oid = Name("map");
  const std::string key("\0slot\xff", 6);
  ASSERT_TRUE(pool_->OmapSet(oid, {{key, "old"}}).ok());

  const Status wrong = pool_->OmapReplaceIfEqual(oid, key, "other", "new");
  EXPECT_EQ(wrong.code(), StatusCode::kAborted) << wrong.ToString();
  EXPECT_EQ(pool_->OmapGet(oid, {key}).value(), (Entries{{key, "old"}}));

  const Status right = pool_->OmapReplaceIfEqual(oid, key, "old", "new");
  EXPECT_TRUE(right.ok()) << right.ToString();
  EXPECT_EQ(pool_->OmapGet(oid, {key}).value(), (Entries{{key, "new"}}));

  // A missing key is no match, not even for an expected empty value, and
  // the set that follows the compare is not applied.
  for (const std::string expected : {"x", ""}) {
    const Status missing = pool_->OmapReplaceIfEqual(oid, "missing", expected, "set");
    EXPECT_EQ(missing.code(), StatusCode::kAborted) << "expected '" << expected << "'";
  }
  EXPECT_TRUE(pool_->OmapGet(oid, {"missing"}).value().empty());

  // An empty value is a value like any other.
  ASSERT_TRUE(pool_->OmapSet(oid, {{"empty", ""}}).ok());
  EXPECT_TRUE(pool_->OmapReplaceIfEqual(oid, "empty", "", "full").ok());
  EXPECT_EQ(pool_->OmapGet(oid, {"empty"}).value(), (Entries{{"empty", "full"}}));

  const Status no_object = pool_->OmapReplaceIfEqual(Name("absent"), key, "old", "new");
  EXPECT_EQ(no_object.code(), StatusCode::kAborted) << no_object.ToString();
  EXPECT_FALSE(pool_->Stat(Name("absent")).value().has_value());
}

TEST_F(RadosPoolTest, OmapRemoveIfEqual) {
  const std::string oid = Name("map");
  ASSERT_TRUE(pool_->OmapSet(oid, {{"slot", "mine"}, {"other", "x"}}).ok());
  EXPECT_EQ(pool_->OmapRemoveIfEqual(oid, "slot", "theirs").code(), StatusCode::kAborted);
  EXPECT_EQ(pool_->OmapGet(oid, {"slot"}).value().size(), 1u);
  EXPECT_TRUE(pool_->OmapRemoveIfEqual(oid, "slot", "mine").ok());
  EXPECT_TRUE(pool_->OmapGet(oid, {"slot"}).value().empty());
  EXPECT_EQ(pool_->OmapRemoveIfEqual(oid, "slot", "mine").code(), StatusCode::kAborted);
  EXPECT_EQ(pool_->OmapRemoveIfEqual(oid, "slot", "").code(), StatusCode::kAborted);
  EXPECT_EQ(pool_->OmapGet(oid, {"other"}).value().size(), 1u);
}

TEST_F(RadosPoolTest, LockExclusiveIsBusyForOtherHolders) {
  const std::string oid = Name("lock");
  ASSERT_TRUE(pool_->LockExclusive(oid, "writer", "cookie-a", 60s).ok());
  EXPECT_TRUE(pool_->Stat(oid).value().has_value());  // created by the lock

  const Status other_cookie = pool_->LockExclusive(oid, "writer", "cookie-b", 60s);
  EXPECT_EQ(other_cookie.code(), StatusCode::kBusy) << other_cookie.ToString();
  // Another client with the same cookie is another holder too.
  auto other_client = RadosPool::Connect(Connection());
  ASSERT_TRUE(other_client.ok());
  EXPECT_EQ((*other_client)->LockExclusive(oid, "writer", "cookie-a", 60s).code(),
            StatusCode::kBusy);
  // Another lock name on the same object is another lock.
  EXPECT_TRUE(pool_->LockExclusive(oid, "reader", "cookie-b", 60s).ok());

  // The holder renews.
  const Status renewed = pool_->LockExclusive(oid, "writer", "cookie-a", 60s);
  EXPECT_TRUE(renewed.ok()) << renewed.ToString();

  EXPECT_EQ(pool_->Unlock(oid, "writer", "cookie-b").code(), StatusCode::kNotFound);
  EXPECT_EQ((*other_client)->Unlock(oid, "writer", "cookie-a").code(), StatusCode::kNotFound);
  EXPECT_TRUE(pool_->Unlock(oid, "writer", "cookie-a").ok());
  EXPECT_EQ(pool_->Unlock(oid, "writer", "cookie-a").code(), StatusCode::kNotFound);
  EXPECT_TRUE(pool_->LockExclusive(oid, "writer", "cookie-b", 60s).ok());
}

TEST_F(RadosPoolTest, ALeaseRunsOut) {
  const std::string oid = Name("lock");
  ASSERT_TRUE(pool_->LockExclusive(oid, "writer", "first", 2s).ok());
  EXPECT_EQ(pool_->LockExclusive(oid, "writer", "second", 2s).code(), StatusCode::kBusy);
  // A renewal starts a new lease.
  std::this_thread::sleep_for(1500ms);
  ASSERT_TRUE(pool_->LockExclusive(oid, "writer", "first", 2s).ok());
  std::this_thread::sleep_for(1000ms);
  EXPECT_EQ(pool_->LockExclusive(oid, "writer", "second", 2s).code(), StatusCode::kBusy);
  std::this_thread::sleep_for(1500ms);
  const Status taken = pool_->LockExclusive(oid, "writer", "second", 2s);
  EXPECT_TRUE(taken.ok()) << taken.ToString();
  EXPECT_EQ(pool_->Unlock(oid, "writer", "first").code(), StatusCode::kNotFound);
}

TEST_F(RadosPoolTest, ConnectErrors) {
  auto missing_pool = RadosPool::Connect(Connection("no-such-pool"));
  EXPECT_EQ(missing_pool.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing_pool.status().message().find("no-such-pool"), std::string::npos);

  PoolConnection no_conf = Connection();
  no_conf.conf_file = MicroCephEnvironment::dir() + "/absent.conf";
  auto without_conf = RadosPool::Connect(no_conf);
  EXPECT_FALSE(without_conf.ok());
  EXPECT_NE(without_conf.status().message().find("absent.conf"), std::string::npos)
      << without_conf.status().message();

  // A monitor that does not answer: a port nothing listens on.
  std::string conf = testing::ReadFile(MicroCephEnvironment::conf());
  const size_t host = conf.find("mon host = ");
  ASSERT_NE(host, std::string::npos);
  conf.replace(host, conf.find('\n', host) - host, "mon host = v2:127.0.0.1:1");
  PoolConnection unreachable = Connection(kPool, 2000ms);
  unreachable.conf_file = MicroCephEnvironment::dir() + "/unreachable.conf";
  testing::WriteFile(unreachable.conf_file, conf);
  const auto started = std::chrono::steady_clock::now();
  auto timed_out = RadosPool::Connect(unreachable);
  EXPECT_EQ(timed_out.status().code(), StatusCode::kTimedOut) << timed_out.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
}

// A pool over its quota refuses writes at once with kNoSpace (rather than
// holding them until op_timeout), lets objects be removed, and takes writes
// again once the quota is lifted.
TEST_F(RadosPoolTest, PoolOverQuota) {
  auto connected = RadosPool::Connect(Connection(kQuotaPool, 5000ms));
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  RadosPool& quota_pool = **connected;
  ASSERT_EQ(RunMicroCeph({"set-quota", MicroCephEnvironment::dir(), kQuotaPool, "100000"}), 0);
  ASSERT_TRUE(quota_pool.WriteFull("filler", std::string(200000, 'f')).ok());

  // The monitor marks the pool full once the pool's usage reaches it.
  // Each attempt is a new object: a write that does not grow the pool is
  // let through even then.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  Status refused;
  for (int i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
    refused = quota_pool.WriteFull("more-" + std::to_string(i), "x");
    if (!refused.ok()) break;
    std::this_thread::sleep_for(250ms);
  }
  ASSERT_EQ(refused.code(), StatusCode::kNoSpace) << refused.ToString();
  EXPECT_NE(refused.message().find("pool quota"), std::string::npos) << refused.message();
  const auto started = std::chrono::steady_clock::now();
  auto batch = quota_pool.NewBatch(2);
  batch->WriteFull("batched", "x");
  EXPECT_EQ(batch->Wait().code(), StatusCode::kNoSpace);
  EXPECT_EQ(quota_pool.OmapSet("map", {{"k", "v"}}).code(), StatusCode::kNoSpace);
  EXPECT_EQ(quota_pool.CreateExclusive("created", "x").code(), StatusCode::kNoSpace);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  EXPECT_EQ(quota_pool.ReadWhole("filler", 200000).value().size(), 200000u);
  EXPECT_TRUE(quota_pool.Remove("filler").ok());

  ASSERT_EQ(RunMicroCeph({"set-quota", MicroCephEnvironment::dir(), kQuotaPool, "0"}), 0);
  const auto lifted_deadline = std::chrono::steady_clock::now() + 60s;
  Status accepted = refused;
  for (int i = 0; !accepted.ok() && std::chrono::steady_clock::now() < lifted_deadline; ++i) {
    std::this_thread::sleep_for(250ms);
    accepted = quota_pool.WriteFull("after-" + std::to_string(i), "x");
  }
  EXPECT_TRUE(accepted.ok()) << accepted.ToString();
}

// Last, since it stops the OSD: an operation on a cluster that does not
// answer fails after op_timeout, and the same connection works once the
// OSD is back. memstore keeps the data across the clean stop.
TEST_F(RadosPoolTest, ZzUnansweredOperationsTimeOut) {
  auto connected = RadosPool::Connect(Connection(kPool, 3000ms));
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  RadosPool& pool = **connected;
  const std::string oid = Name("object");
  ASSERT_TRUE(pool.WriteFull(oid, "before").ok());

  ASSERT_EQ(RunMicroCeph({"stop-osd", MicroCephEnvironment::dir()}), 0);
  const auto started = std::chrono::steady_clock::now();
  const Status write = pool.WriteFull(oid, "during");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(write.code(), StatusCode::kTimedOut) << write.ToString();
  EXPECT_GE(took, 2500ms);
  EXPECT_LT(took, 10s);
  auto read = pool.Read(oid, 0, 100);
  EXPECT_EQ(read.status().code(), StatusCode::kTimedOut) << read.status().ToString();

  ASSERT_EQ(RunMicroCeph({"start-osd", MicroCephEnvironment::dir()}), 0);
  EXPECT_EQ(pool.ReadWhole(oid, 100).value(), "before");
  const Status after = pool.WriteFull(oid, "after");
  EXPECT_TRUE(after.ok()) << after.ToString();
  EXPECT_EQ(pool.ReadWhole(oid, 100).value(), "after");
}

}  // namespace
}  // namespace gpuckpt
