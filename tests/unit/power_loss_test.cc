// What a store keeps through a power loss: writes not fdatasync()ed are
// gone and names whose directory was not fsync()ed may be gone, which a
// killed process (the crash tests) never shows, since the page cache keeps
// everything. The store runs on a PowerLossEnv, which records what was made
// durable and rewrites the store's files to only that. A committed snapshot
// must read back exactly afterwards, an uncommitted one must be absent, and
// a power loss after any sync of a store's creation, a commit, a removal or
// gc must leave a store that opens, passes fsck and reads back what was
// committed before.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/snapshot/store_impl.h"
#include "core/store/format.h"
#include "gpuckpt/store.h"
#include "tests/unit/power_loss_env.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::Import;
using testing::PowerLossEnv;
using testing::TempDir;

class PowerLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Real paths: the recorder compares RocksDB's paths with the packs'.
    char* real = realpath(tmp_.path().c_str(), nullptr);
    ASSERT_NE(real, nullptr);
    root_ = real;
    free(real);
    store_dir_ = root_ + "/store";
  }

  std::unique_ptr<Store> OpenWith(PowerLossEnv& env) {
    StoreOptions options = testing::TestOptions();
    // The operations under test settle spooled snapshots themselves, so
    // that each run makes the same syncs in the same order.
    options.settle_in_background = false;
    auto s = LocalStore::Open(store_dir_, options, env.store_env());
    EXPECT_TRUE(testing::IsOk(s));
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // A source tree of `bytes` of random data (seed `seed`) in one file, plus
  // a small compressible one.
  std::string Tree(const std::string& name, uint64_t bytes, uint64_t seed) {
    const std::string dir = root_ + "/" + name;
    testing::MakeDirs(dir);
    testing::WriteRandomFile(dir + "/random.bin", bytes, seed);
    testing::WriteFile(dir + "/notes.txt", std::string(10000, static_cast<char>('a' + seed % 26)));
    return dir;
  }

  // The store as a power loss left it: it opens, fsck finds nothing wrong,
  // every snapshot of `committed` reads back exactly, and every other
  // snapshot is one of `maybe` and reads back exactly too.
  void ExpectConsistent(const std::map<std::string, std::string>& committed,
                        const std::map<std::string, std::string>& maybe, const std::string& when) {
    SCOPED_TRACE(when);
    auto opened = Store::Open(store_dir_, testing::TestOptions());
    ASSERT_OK(opened);
    Store& store = **opened;
    ASSERT_OK_AND_ASSIGN(FsckReport fsck, store.Fsck());
    EXPECT_TRUE(fsck.clean()) << fsck.problems.size() << " problems, the first: "
                              << (fsck.problems.empty() ? "" : fsck.problems[0]);
    for (const auto& [name, src] : committed) {
      EXPECT_TRUE(ExportMatches(store, name, src, root_)) << name;
    }
    ASSERT_OK_AND_ASSIGN(auto listed, store.List());
    for (const SnapshotInfo& info : listed) {
      if (committed.count(info.id) != 0) continue;
      auto src = maybe.find(info.id);
      if (src == maybe.end()) {
        ADD_FAILURE() << "snapshot " << info.id << " was never committed";
        continue;
      }
      EXPECT_TRUE(ExportMatches(store, info.id, src->second, root_)) << info.id;
    }
  }

  // Bytes in the store's pack files.
  uint64_t PackBytes() {
    uint64_t total = 0;
    for (const auto& e :
         std::filesystem::directory_iterator(store_dir_ + "/" + format::kPacksDirName)) {
      total += e.file_size();
    }
    return total;
  }

  // Copies the closed store to `dest`, but for its reserve, which the store
  // makes again (a copy would write all its zeros).
  void CopyStore(const std::string& from, const std::string& dest) {
    std::filesystem::remove_all(dest);
    std::filesystem::create_directories(dest);
    for (const auto& e : std::filesystem::directory_iterator(from)) {
      if (e.path().filename() == format::kReserveFileName) continue;
      std::filesystem::copy(e.path(), std::filesystem::path(dest) / e.path().filename(),
                            std::filesystem::copy_options::recursive);
    }
  }

  // Runs `op` on a copy of the closed store at `base`, first once to count
  // the syncs it makes (more than three: packs, table files, the manifest,
  // the WAL; recorded as the test property `property`), then once for each
  // n up to two past that count with nothing made durable after the n-th
  // sync, losing the power once the store is closed. `op` returns the
  // number of syncs made when its effect was committed; `check(n,
  // committed_at)` judges the store the power loss left.
  void AtEverySyncOf(const std::string& base, const char* property,
                     const std::function<uint64_t(Store&, PowerLossEnv&)>& op,
                     const std::function<void(uint64_t n, uint64_t committed_at)>& check) {
    uint64_t total = 0;
    {
      CopyStore(base, store_dir_);
      PowerLossEnv env;
      auto store = OpenWith(env);
      ASSERT_NE(store, nullptr);
      op(*store, env);
      total = env.syncs();
    }
    ASSERT_GT(total, 3u) << "a commit syncs packs, table files, the manifest and the WAL";
    RecordProperty(property, static_cast<int>(total));
    for (uint64_t n = 0; n <= total + 2; ++n) {
      CopyStore(base, store_dir_);
      PowerLossEnv env;
      env.StopDurabilityAfter(n);
      uint64_t committed_at = 0;
      {
        auto store = OpenWith(env);
        ASSERT_NE(store, nullptr);
        committed_at = op(*store, env);
      }
      if (HasFatalFailure()) return;
      ASSERT_OK(env.PowerLoss());
      check(n, committed_at);
      if (HasFatalFailure() || HasFailure()) return;
    }
  }

  TempDir tmp_;
  std::string root_;
  std::string store_dir_;
};

TEST_F(PowerLossTest, CommittedSnapshotSurvivesByteForByte) {
  const std::string a = Tree("a", 3u << 20, 1);
  PowerLossEnv env;
  {
    auto store = OpenWith(env);
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Import(*store, a, "a"));
    // The power goes the moment the commit returned: nothing the store
    // writes after (its close flushes) reaches the disk.
    env.StopDurabilityAfter(env.syncs());
  }
  ASSERT_OK(env.PowerLoss());
  ExpectConsistent({{"a", a}}, {}, "after the commit of a");
}

TEST_F(PowerLossTest, UncommittedSnapshotIsAbsent) {
  const std::string a = Tree("a", 2u << 20, 2);
  PowerLossEnv env;
  {
    auto store = OpenWith(env);
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Import(*store, a, "a"));
    SnapshotSpec spec;
    spec.name = "b";
    ASSERT_OK_AND_ASSIGN(auto writer, store->BeginSnapshot(spec));
    FileEntry entry;
    entry.path = "big.bin";
    entry.mode = 0644;
    ASSERT_OK(testing::AddBytes(writer.get(), entry, testing::RandomBytes(24u << 20, 3)));
    // More than a memtable of chunk records and several packs' writeback
    // were written; the power goes before Commit().
    env.StopDurabilityAfter(env.syncs());
  }
  const uint64_t written = PackBytes();
  ASSERT_OK(env.PowerLoss());
  EXPECT_LT(PackBytes() + (20u << 20), written) << "b's chunks were never synced";
  ExpectConsistent({{"a", a}}, {}, "with b written but not committed");
  auto store = Store::Open(store_dir_, testing::TestOptions());
  ASSERT_OK(store);
  EXPECT_CODE((*store)->Get("b"), StatusCode::kNotFound);
}

TEST_F(PowerLossTest, PowerLossAtEverySyncOfANewStore) {
  const std::string a = Tree("a", 1u << 20, 8);
  uint64_t total = 0;
  {
    PowerLossEnv env;
    auto store = OpenWith(env);
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Import(*store, a, "a"));
    total = env.syncs();
  }
  ASSERT_GT(total, 3u);
  for (uint64_t n = 0; n <= total + 2; ++n) {
    std::filesystem::remove_all(store_dir_);
    PowerLossEnv env;
    env.StopDurabilityAfter(n);
    uint64_t synced_at_commit = 0;
    {
      auto store = OpenWith(env);
      ASSERT_NE(store, nullptr);
      ASSERT_OK(Import(*store, a, "a"));
      synced_at_commit = env.syncs();
    }
    ASSERT_OK(env.PowerLoss());
    // Whatever is left of the store's creation opens as a store again.
    const std::string when = "power lost after sync " + std::to_string(n) + " of " +
                             std::to_string(synced_at_commit) + " of a new store";
    if (n >= synced_at_commit) {
      ExpectConsistent({{"a", a}}, {}, when);
    } else {
      ExpectConsistent({}, {{"a", a}}, when);
    }
    if (HasFatalFailure() || HasFailure()) break;
  }
}

TEST_F(PowerLossTest, PowerLossAtEverySyncOfACommit) {
  const std::string a = Tree("a", 2u << 20, 4);
  const std::string b = Tree("b", 3u << 20, 5);
  const std::string base = root_ + "/base";
  {
    auto s = Store::Open(base, testing::TestOptions());
    ASSERT_OK(s);
    ASSERT_OK(Import(**s, a, "a"));
  }
  AtEverySyncOf(
      base, "syncs_of_a_commit",
      [&](Store& store, PowerLossEnv& env) {
        EXPECT_OK(Import(store, b, "b"));
        return env.syncs();
      },
      [&](uint64_t n, uint64_t committed_at) {
        const std::string when = "power lost after sync " + std::to_string(n) + " of " +
                                 std::to_string(committed_at) + " of the commit of b";
        if (n >= committed_at) {
          ExpectConsistent({{"a", a}, {"b", b}}, {}, when);
        } else {
          ExpectConsistent({{"a", a}}, {{"b", b}}, when);
        }
      });
}

// A spooled commit (its files made durable raw in the spool), then its
// settling (chunked, the spool files removed): after a power loss at any
// sync the store opens, fsck is clean, b reads back exactly once it was
// committed (from its spool files or its chunks, whichever the power loss
// left), and the store settles what is left and removes what nothing needs.
TEST_F(PowerLossTest, PowerLossAtEverySyncOfASpooledCommitAndItsSettling) {
  const std::string a = Tree("a", 2u << 20, 4);
  const std::string b = Tree("b", 3u << 20, 8);
  const std::string base = root_ + "/base";
  {
    auto s = Store::Open(base, testing::TestOptions());
    ASSERT_OK(s);
    ASSERT_OK(Import(**s, a, "a"));
  }
  AtEverySyncOf(
      base, "syncs_of_a_spooled_commit_and_its_settling",
      [&](Store& store, PowerLossEnv& env) {
        EXPECT_OK(
            testing::WriteFlatTree(store, b, "b", SnapshotWriterOptions::Spool::kAlways).status());
        const uint64_t committed_at = env.syncs();
        EXPECT_OK(static_cast<StoreImpl&>(store).Settle("b"));
        return committed_at;
      },
      [&](uint64_t n, uint64_t committed_at) {
        const std::string when = "power lost after sync " + std::to_string(n) + " of the spooled " +
                                 "commit of b (committed at " + std::to_string(committed_at) +
                                 ") and its settling";
        if (n >= committed_at) {
          ExpectConsistent({{"a", a}, {"b", b}}, {}, when);
        } else {
          ExpectConsistent({{"a", a}}, {{"b", b}}, when);
        }
        if (HasFailure()) return;
        // Opened again, the store settles b and keeps no spool file.
        auto opened = Store::Open(store_dir_, testing::TestOptions());
        ASSERT_OK(opened);
        static_cast<StoreImpl&>(**opened).WaitSettled();
        std::vector<std::string> left;
        for (const auto& e : std::filesystem::directory_iterator(store_dir_ + "/spool"))
          left.push_back(e.path().filename());
        EXPECT_TRUE(left.empty()) << when << ": " << left.size() << " spool files left, the first "
                                  << (left.empty() ? "" : left[0]);
        ASSERT_OK_AND_ASSIGN(auto files, (*opened)->ListFiles("a"));
        if (n >= committed_at) {
          ASSERT_OK_AND_ASSIGN(auto b_files, (*opened)->ListFiles("b"));
          for (const FileEntry& e : b_files) EXPECT_FALSE(e.spooled) << when << ": " << e.path;
          EXPECT_TRUE(ExportMatches(**opened, "b", b, root_)) << when;
        }
      });
}

TEST_F(PowerLossTest, PowerLossAtEverySyncOfRemoveAndGc) {
  const std::string keep = Tree("keep", 2u << 20, 6);
  const std::string drop = Tree("drop", 6u << 20, 7);
  const std::string base = root_ + "/base";
  {
    auto s = Store::Open(base, testing::TestOptions());
    ASSERT_OK(s);
    ASSERT_OK(Import(**s, drop, "drop"));
    ASSERT_OK(Import(**s, keep, "keep"));
  }
  AtEverySyncOf(
      base, "syncs_of_remove_and_gc",
      [&](Store& store, PowerLossEnv& env) {
        EXPECT_OK(store.Remove("drop"));
        const uint64_t removed_at = env.syncs();
        auto gc = store.Gc();
        EXPECT_OK(gc);
        if (gc.ok()) {
          EXPECT_GE(gc->packs_rewritten + gc->packs_removed, 1u) << "gc must move or remove packs";
        }
        return removed_at;
      },
      [&](uint64_t n, uint64_t removed_at) {
        const std::string when = "power lost after sync " + std::to_string(n) + " of remove and gc";
        if (n >= removed_at) {
          ExpectConsistent({{"keep", keep}}, {}, when);
        } else {
          ExpectConsistent({{"keep", keep}}, {{"drop", drop}}, when);
        }
      });
}

}  // namespace
}  // namespace gpuckpt
