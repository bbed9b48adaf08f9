// The seam a layer over a LocalStore uses (core/snapshot/local_store.h),
// without Ceph: a recording PublicationListener is asked for each new name
// and before each publication, told after it and of abandoned names; its
// error fails a commit and leaves nothing visible; its store does not
// spool; and snapshots brought in through LocalStore's own calls read like
// any other.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/base/mutex.h"
#include "core/catalog/snapshot_catalog.h"
#include "core/snapshot/local_store.h"
#include "core/store/store_env.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

// Records every call, in order; fails what it is told to.
class RecordingListener : public PublicationListener {
 public:
  Status ReserveName(const std::string& name) override {
    Note("reserve " + name);
    if (name == refuse_name) return Status::AlreadyExists("taken elsewhere: " + name);
    return Status::Ok();
  }
  void AbandonName(const std::string& name) override { Note("abandon " + name); }
  Status BeforePublish(SnapshotInfo* info) override {
    Note("before " + info->id);
    // The snapshot is durable here and not yet published.
    auto files = store->catalog().ReadFiles(info->key);
    if (!files.ok()) return files.status();
    files_seen_before_publish = files->size();
    published_before = store->Get(info->id).ok();
    if (fail_before_publish) return Status::Unavailable("the layer is away");
    info->pool_incarnation = 77;
    return Status::Ok();
  }
  void AfterPublish(const SnapshotInfo& info) override {
    Note("after " + info.id + " incarnation " + std::to_string(info.pool_incarnation));
  }

  std::vector<std::string> calls() {
    MutexLock lock(&mu_);
    return calls_;
  }

  LocalStore* store = nullptr;
  std::string refuse_name;
  bool fail_before_publish = false;
  size_t files_seen_before_publish = 0;
  bool published_before = true;

 private:
  void Note(const std::string& call) {
    MutexLock lock(&mu_);
    calls_.push_back(call);
  }
  Mutex mu_;
  std::vector<std::string> calls_ GUARDED_BY(mu_);
};

class PublicationListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeDirs(src_);
    testing::WriteRandomFile(src_ + "/pages-1.img", 3u << 20, 7);
    testing::WriteFile(src_ + "/core-1.img", "core", 0600);
    auto opened = LocalStore::Open(tmp_.Sub("store"), testing::TestOptions(), StoreEnv());
    ASSERT_OK(opened);
    store_ = std::move(opened).value();
    listener_.store = store_.get();
    store_->SetPublicationListener(&listener_);
  }
  void TearDown() override {
    if (store_) store_->SetPublicationListener(nullptr);
  }

  Result<SnapshotInfo> Import(const std::string& name) {
    SnapshotSpec spec;
    spec.name = name;
    return store_->ImportDirectory(src_, spec);
  }

  TempDir tmp_;
  std::string src_ = tmp_.Sub("src");
  RecordingListener listener_;
  std::unique_ptr<LocalStore> store_;
};

TEST_F(PublicationListenerTest, IsAskedForTheNameAndBeforePublicationAndToldAfter) {
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, Import("one"));
  EXPECT_EQ(listener_.calls(),
            (std::vector<std::string>{"reserve one", "before one", "after one incarnation 77"}));
  EXPECT_EQ(listener_.files_seen_before_publish, 2u) << "the records were not durable before";
  EXPECT_FALSE(listener_.published_before) << "published before the listener agreed";
  // What the listener set is what was published.
  EXPECT_EQ(info.pool_incarnation, 77u);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo stored, store_->Get("one"));
  EXPECT_EQ(stored.pool_incarnation, 77u);
}

TEST_F(PublicationListenerTest, ItsErrorFailsTheCommitLeavesNothingAndGivesTheNameUp) {
  listener_.fail_before_publish = true;
  EXPECT_CODE(Import("two").status(), StatusCode::kUnavailable);
  EXPECT_CODE(store_->Get("two"), StatusCode::kNotFound);
  EXPECT_EQ(listener_.calls(),
            (std::vector<std::string>{"reserve two", "before two", "abandon two"}));
  // The name is free again, here and for the listener.
  listener_.fail_before_publish = false;
  EXPECT_OK(Import("two").status());
}

TEST_F(PublicationListenerTest, ANameTakenElsewhereIsRefusedAndAnAutomaticOneMovesOn) {
  listener_.refuse_name = "three";
  EXPECT_CODE(Import("three").status(), StatusCode::kAlreadyExists);
  EXPECT_CODE(store_->Get("three"), StatusCode::kNotFound);
  // An automatic name is the next number; the listener refuses the first.
  ASSERT_OK_AND_ASSIGN(uint64_t next_key, store_->AllocateSnapshotKey());
  listener_.refuse_name = std::to_string(next_key + 1);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, Import(""));
  EXPECT_EQ(info.id, std::to_string(next_key + 2));
}

TEST_F(PublicationListenerTest, AStoreWithAListenerDoesNotSpool) {
  SnapshotSpec spec;
  spec.name = "four";
  SnapshotWriterOptions options;
  options.spool = SnapshotWriterOptions::Spool::kAlways;
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec, options));
  UniqueFd fd(open((src_ + "/pages-1.img").c_str(), O_RDONLY | O_CLOEXEC));
  FileEntry e;
  e.path = "pages-1.img";
  ASSERT_OK(writer->AddFile(e, fd.get()));
  ASSERT_OK(writer->Commit().status());
  ASSERT_OK_AND_ASSIGN(auto files, store_->ListFiles("four"));
  ASSERT_EQ(files.size(), 1u);
  EXPECT_FALSE(files[0].spooled);
  EXPECT_GT(files[0].chunk_count, 0u);
}

TEST_F(PublicationListenerTest, ASnapshotBroughtInThroughLocalStoreIsNotToldToTheListener) {
  // What a fetch does: a key and a name of this store, records written
  // through the catalog (none here), published without the listener.
  ASSERT_OK_AND_ASSIGN(uint64_t key, store_->AllocateSnapshotKey());
  ASSERT_OK(store_->ReserveLocalName("five"));
  // Reserved: no writer may take the name meanwhile.
  EXPECT_CODE(Import("five").status(), StatusCode::kAlreadyExists);
  SnapshotInfo brought;
  brought.id = "five";
  brought.key = key;
  brought.extra_json = "{}";
  ASSERT_OK(store_->Publish(brought));
  store_->ReleaseLocalName("five");
  EXPECT_TRUE(listener_.calls().empty());
  ASSERT_OK_AND_ASSIGN(auto files, store_->ListFiles("five"));
  EXPECT_TRUE(files.empty());
  // Its pool incarnation is recorded only while it is the same snapshot.
  ASSERT_OK(store_->RecordPoolIncarnation("five", key, 9));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo recorded, store_->Get("five"));
  EXPECT_EQ(recorded.pool_incarnation, 9u);
  EXPECT_CODE(store_->RecordPoolIncarnation("five", key + 1000, 10), StatusCode::kNotFound);
}

}  // namespace
}  // namespace gpuckpt
