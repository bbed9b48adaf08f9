// A Store opened for reading only (StoreOptions::read_only) beside the
// Store that holds the directory, as `gpuckpt ls`, `stats`, `export` and
// `fsck` open it while gpuckptfs runs: it sees what was committed, writes
// nothing into the store, refuses to change it, and follows records that
// the holder's gc moves while it reads.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <map>
#include <string>

#include "core/store/format.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::Import;
using testing::TempDir;

// Every file under `dir` (one level of subdirectories, as a store has) with
// its size and modification time.
std::map<std::string, std::pair<off_t, int64_t>> FilesWithTimes(const std::string& dir) {
  std::map<std::string, std::pair<off_t, int64_t>> out;
  for (const std::string& name : testing::ListDir(dir)) {
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      for (const auto& [sub, v] : FilesWithTimes(path)) out[name + "/" + sub] = v;
      continue;
    }
    out[name] = {st.st_size, st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec};
  }
  return out;
}

class ReadOnlyStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> OpenHolder() {
    auto s = Store::Open(store_dir_, testing::TestOptions());
    EXPECT_TRUE(testing::IsOk(s));
    return s.ok() ? std::move(s).value() : nullptr;
  }
  Result<std::unique_ptr<Store>> OpenReader() {
    StoreOptions o = testing::TestOptions();
    o.read_only = true;
    return Store::Open(store_dir_, o);
  }

  TempDir tmp_;
  const std::string store_dir_ = tmp_.Sub("store");
};

TEST_F(ReadOnlyStoreTest, ReadsBesideTheHolderAndRefusesToChangeAnything) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 51, 2u << 20);
  auto holder = OpenHolder();
  ASSERT_NE(holder, nullptr);
  ASSERT_OK(Import(*holder, src, "first"));

  // A second writer is refused while the holder runs; a reader is not.
  EXPECT_CODE(Store::Open(store_dir_, testing::TestOptions()), StatusCode::kBusy);
  ASSERT_OK_AND_ASSIGN(auto reader, OpenReader());
  ASSERT_OK_AND_ASSIGN(auto list, reader->List());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, "first");
  EXPECT_TRUE(ExportMatches(*reader, "first", src, tmp_.path()));
  ASSERT_OK_AND_ASSIGN(auto stats, reader->Stats());
  EXPECT_EQ(stats.snapshot_count, 1u);
  ASSERT_OK_AND_ASSIGN(FsckReport fsck, reader->Fsck());
  EXPECT_TRUE(fsck.clean()) << (fsck.problems.empty() ? "" : fsck.problems[0]);
  EXPECT_GT(fsck.chunks_checked, 0u);

  EXPECT_CODE(reader->BeginSnapshot(SnapshotSpec{}), StatusCode::kPermissionDenied);
  EXPECT_CODE(reader->ImportDirectory(src, SnapshotSpec{}), StatusCode::kPermissionDenied);
  EXPECT_CODE(reader->Remove("first"), StatusCode::kPermissionDenied);
  EXPECT_CODE(reader->Gc(), StatusCode::kPermissionDenied);

  // The reader shows the store as it was when opened; a new reader sees
  // what the holder committed since.
  ASSERT_OK(Import(*holder, src, "second"));
  ASSERT_OK_AND_ASSIGN(list, reader->List());
  EXPECT_EQ(list.size(), 1u);
  reader.reset();
  ASSERT_OK_AND_ASSIGN(reader, OpenReader());
  ASSERT_OK_AND_ASSIGN(list, reader->List());
  EXPECT_EQ(list.size(), 2u);
  EXPECT_TRUE(ExportMatches(*reader, "second", src, tmp_.path()));
  // The holder goes on working.
  ASSERT_OK(holder->Remove("first"));
  ASSERT_OK(holder->Gc());
}

TEST_F(ReadOnlyStoreTest, WritesNothingIntoTheStoreDirectory) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 52, 1u << 20);
  {
    auto holder = OpenHolder();
    ASSERT_NE(holder, nullptr);
    ASSERT_OK(Import(*holder, src, "only"));
  }
  const auto before = FilesWithTimes(store_dir_);
  {
    ASSERT_OK_AND_ASSIGN(auto reader, OpenReader());
    EXPECT_TRUE(ExportMatches(*reader, "only", src, tmp_.path()));
    ASSERT_OK(reader->Fsck());
  }
  EXPECT_EQ(FilesWithTimes(store_dir_), before);
  // Nor does it make a store where there is none.
  StoreOptions o = testing::TestOptions();
  o.read_only = true;
  EXPECT_CODE(Store::Open(tmp_.Sub("none"), o), StatusCode::kNotFound);
  struct stat st {};
  EXPECT_NE(stat(tmp_.Sub("none").c_str(), &st), 0);
  testing::MakeDirs(tmp_.Sub("empty"));
  EXPECT_CODE(Store::Open(tmp_.Sub("empty"), o), StatusCode::kNotFound);
  EXPECT_TRUE(testing::ListDir(tmp_.Sub("empty")).empty());
}

TEST_F(ReadOnlyStoreTest, FollowsRecordsTheHoldersGcMovesAndSaysWhatItCollected) {
  const std::string big = tmp_.Sub("big"), small = tmp_.Sub("small");
  testing::MakeDirs(big);
  testing::MakeDirs(small);
  testing::WriteRandomFile(big + "/only-big.bin", 6u << 20, 53);
  testing::WriteRandomFile(small + "/only-small.bin", 2u << 20, 54);
  auto holder = OpenHolder();
  ASSERT_NE(holder, nullptr);
  ASSERT_OK(Import(*holder, big, "big"));
  ASSERT_OK(Import(*holder, small, "small"));
  ASSERT_OK_AND_ASSIGN(auto reader, OpenReader());
  ASSERT_OK_AND_ASSIGN(auto reading_big, reader->OpenFile("big", "only-big.bin"));

  // Both share one pack; without "big" gc copies the records of "small"
  // into a new pack and removes the old one under the reader's feet.
  ASSERT_OK(holder->Remove("big"));
  ASSERT_OK_AND_ASSIGN(GcReport gc, holder->Gc());
  ASSERT_EQ(gc.packs_rewritten, 1u) << "the case this test is about";

  // A file of "big" opened before: its chunks are gone, and the read says so.
  std::string buf(1u << 20, '\0');
  EXPECT_CODE(reading_big->Pread(0, buf.size(), buf.data()), StatusCode::kAborted);
  // "small" reads whole from where gc moved it.
  EXPECT_TRUE(ExportMatches(*reader, "small", small, tmp_.path()));
  // The reader, caught up, no longer lists "big".
  EXPECT_CODE(reader->Get("big"), StatusCode::kNotFound);
  // fsck counts nothing the holder's gc did as damage.
  ASSERT_OK_AND_ASSIGN(FsckReport fsck, reader->Fsck());
  EXPECT_TRUE(fsck.clean()) << (fsck.problems.empty() ? "" : fsck.problems[0]);
}

}  // namespace
}  // namespace gpuckpt
