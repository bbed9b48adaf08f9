// QuotaLedger over a real Store: a user is charged what their checkpoints
// hold (each distinct chunk once, however they got there), and every
// operation in flight reserves its worst case, so that neither a second
// copy of the same bytes nor operations side by side go beyond the quota.
#include "core/engine/quota.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/base/unique_fd.h"
#include "core/engine/checkpoint_catalog.h"
#include "core/manifest/checkpoint_manifest.h"
#include "core/snapshot/store_impl.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

constexpr uint32_t kAlice = 1000;
constexpr uint32_t kBob = 1001;

Caller Ordinary(uint32_t uid) { return Caller{.uid = uid, .gid = uid}; }

class QuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
    src_ = tmp_.Sub("src");
    testing::MakeDirs(src_);
    // Incompressible: every byte of a first import is new and stored.
    testing::WriteRandomFile(src_ + "/pages.img", 4u << 20, 7);
  }

  // Imports the source tree as `name`, a checkpoint owned by `owner` in
  // their dedup domain.
  SnapshotInfo ImportAs(const std::string& name, uint32_t owner) {
    CheckpointManifest manifest;
    manifest.owner = ManifestIds{owner, owner};
    manifest.made_by = ManifestMaker{owner, owner, {}};
    SnapshotSpec spec;
    spec.name = name;
    spec.extra_json = EncodeManifest(manifest);
    spec.dedup_domain = owner;
    auto info = store_->ImportDirectory(src_, spec);
    EXPECT_OK(info.status());
    return info.ok() ? *info : SnapshotInfo{};
  }

  // A catalog of the store as it is now, loaded as the engine loads its
  // own; kept for the test's length.
  CheckpointCatalog* Catalog() {
    catalogs_.push_back(std::make_unique<CheckpointCatalog>(store_.get()));
    EXPECT_OK(catalogs_.back()->Load());
    return catalogs_.back().get();
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
  std::vector<std::unique_ptr<CheckpointCatalog>> catalogs_;
  std::string src_;
};

TEST_F(QuotaTest, HeldBytesCountEachChunkOnceAndStayAfterTheFirstCopyGoes) {
  const SnapshotInfo first = ImportAs("a", kAlice);
  const SnapshotInfo second = ImportAs("b", kAlice);
  EXPECT_GT(first.stored_bytes, 4u << 20);
  EXPECT_EQ(second.stored_bytes, 0u);  // nothing new: the same chunks
  ASSERT_OK_AND_ASSIGN(uint64_t both, store_->HeldBytes({"a", "b"}));
  EXPECT_EQ(both, first.stored_bytes);
  // The second import holds every chunk once the first is gone, though it
  // added nothing.
  ASSERT_OK(store_->Remove("a"));
  ASSERT_OK_AND_ASSIGN(uint64_t left, store_->HeldBytes({"a", "b"}));
  EXPECT_EQ(left, first.stored_bytes);
  ASSERT_OK_AND_ASSIGN(uint64_t none, store_->HeldBytes({"missing"}));
  EXPECT_EQ(none, 0u);
}

TEST_F(QuotaTest, ASecondCopyOfTheSameBytesIsChargedOnceTheFirstIsRemoved) {
  const uint64_t size = ImportAs("a", kAlice).stored_bytes;
  ImportAs("b", kAlice);
  QuotaLedger ledger(store_.get(), Catalog(), size + size / 2);
  ASSERT_OK(store_->Remove("a"));
  ledger.NoteStoreChanged();
  // What b holds is charged: another copy's worth does not fit.
  auto refused = ledger.Reserve(Ordinary(kAlice), kAlice, size, "an import");
  EXPECT_EQ(refused.status().code(), StatusCode::kNoSpace) << refused.status().ToString();
  ASSERT_OK_AND_ASSIGN(uint64_t remaining, ledger.Remaining(kAlice));
  EXPECT_EQ(remaining, size / 2);
  // Another owner is charged nothing of it.
  EXPECT_OK(ledger.Reserve(Ordinary(kBob), kBob, size, "an import").status());
}

TEST_F(QuotaTest, OperationsInFlightReserveTheirWorstCase) {
  QuotaLedger ledger(store_.get(), Catalog(), 100u << 20);
  ASSERT_OK_AND_ASSIGN(auto first, ledger.Reserve(Ordinary(kAlice), kAlice, 60u << 20, "one"));
  // Side by side, a second one that could take the user beyond it is
  // refused, saying that an operation in flight holds part of it.
  auto second = ledger.Reserve(Ordinary(kAlice), kAlice, 60u << 20, "two");
  ASSERT_EQ(second.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(second.status().message().find("in flight"), std::string::npos)
      << second.status().message();
  first.reset();
  EXPECT_OK(ledger.Reserve(Ordinary(kAlice), kAlice, 60u << 20, "two").status());
}

TEST_F(QuotaTest, RootsRequestsAreChargedToTheOwnerButNeverRefused) {
  QuotaLedger ledger(store_.get(), Catalog(), 100u << 20);
  ASSERT_OK_AND_ASSIGN(auto roots, ledger.Reserve(Caller{}, kAlice, 150u << 20, "root's"));
  auto users = ledger.Reserve(Ordinary(kAlice), kAlice, 1, "the user's");
  EXPECT_EQ(users.status().code(), StatusCode::kNoSpace);
  ASSERT_OK_AND_ASSIGN(uint64_t remaining, ledger.Remaining(kAlice));
  EXPECT_EQ(remaining, 0u);
}

TEST_F(QuotaTest, AStoredCheckpointBeyondTheQuotaIsReported) {
  const uint64_t size = ImportAs("a", kAlice).stored_bytes;
  QuotaLedger ledger(store_.get(), Catalog(), size - 1);
  EXPECT_EQ(ledger.CheckHeld(Ordinary(kAlice), kAlice, "the import").code(), StatusCode::kNoSpace);
  EXPECT_OK(ledger.CheckHeld(Caller{}, kAlice, "root's import"));
  QuotaLedger unlimited(store_.get(), Catalog(), 0);
  EXPECT_OK(unlimited.CheckHeld(Ordinary(kAlice), kAlice, "the import"));
}

TEST_F(QuotaTest, ASpooledCheckpointIsChargedWhatItsChunksHoldOnceItSettles) {
  // Settled by this test, not behind it.
  StoreOptions options = testing::TestOptions();
  options.settle_in_background = false;
  store_.reset();
  ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("spooling"), options));
  const uint64_t size = 8u << 20;
  testing::WriteFile(src_ + "/zeros.img", std::string(size, '\0'));  // compresses to little
  CheckpointManifest manifest;
  manifest.owner = ManifestIds{kAlice, kAlice};
  manifest.made_by = ManifestMaker{kAlice, kAlice, {}};
  SnapshotSpec spec;
  spec.name = "s";
  spec.extra_json = EncodeManifest(manifest);
  spec.dedup_domain = kAlice;
  SnapshotWriterOptions spooled;
  spooled.spool = SnapshotWriterOptions::Spool::kAlways;
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec, spooled));
  UniqueFd fd(open((src_ + "/zeros.img").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(fd.get(), 0);
  FileEntry e;
  e.path = "zeros.img";
  e.mode = 0600;
  ASSERT_OK(writer->AddFile(e, fd.get()));
  ASSERT_OK(writer->Commit().status());

  // Spooled, it holds its whole size: a quota of half of it is spent.
  QuotaLedger ledger(store_.get(), Catalog(), size / 2);
  ASSERT_OK_AND_ASSIGN(uint64_t remaining, ledger.Remaining(kAlice));
  EXPECT_EQ(remaining, 0u);
  // Settled, with no other change of the store noted, it holds what its
  // chunks take, and the quota has room again.
  const uint64_t settled_before = store_->settled_snapshots();
  ASSERT_OK(static_cast<StoreImpl&>(*store_).Settle("s"));
  EXPECT_EQ(store_->settled_snapshots(), settled_before + 1);
  ASSERT_OK_AND_ASSIGN(const uint64_t held, store_->HeldBytes({"s"}));
  ASSERT_LT(held, size / 4);
  ASSERT_OK_AND_ASSIGN(remaining, ledger.Remaining(kAlice));
  EXPECT_EQ(remaining, size / 2 - held);
}

}  // namespace
}  // namespace gpuckpt
