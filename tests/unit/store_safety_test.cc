// The store under the conditions of the security review: a reader opened
// before its snapshot is removed keeps reading the same bytes, also across
// gc, and gc frees the space once the reader is gone; fsck names exactly the
// damaged chunk and the files that use it, once each; and a full disk (a
// size-limited tmpfs, so root only) fails imports with kNoSpace and the
// words "no space left on the store's disk", lets rm and gc work and give
// the space back while it is still full, and recovers by itself once space
// is back, without reopening the store.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/catalog/records.h"
#include "core/snapshot/store_impl.h"
#include "core/store/format.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::Import;
using testing::TempDir;

std::unique_ptr<Store> OpenStore(const std::string& dir) {
  auto store = Store::Open(dir, testing::TestOptions());
  EXPECT_TRUE(testing::IsOk(store));
  return store.ok() ? std::move(store).value() : nullptr;
}

using ::gpuckpt::testing::ReadAll;

TEST(StoreSafetyTest, AReaderKeepsItsBytesAcrossRemoveAndGcUntilItIsDestroyed) {
  TempDir tmp;
  const std::string src = tmp.Sub("src");
  testing::MakeDirs(src);
  testing::WriteRandomFile(src + "/a.bin", 3u << 20, 71);
  testing::WriteRandomFile(src + "/b.bin", 1u << 20, 72);
  const std::string other = tmp.Sub("other");
  testing::MakeDirs(other);
  testing::WriteRandomFile(other + "/c.bin", 1u << 20, 73);
  auto store = OpenStore(tmp.Sub("store"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo gone, Import(*store, src, "gone"));
  ASSERT_OK(Import(*store, other, "stays"));
  const std::string expected = testing::ReadFile(src + "/a.bin");

  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("gone", "a.bin"));
  ASSERT_OK_AND_ASSIGN(auto second, store->OpenFile("gone", "a.bin"));
  std::string head(4096, '\0');
  ASSERT_OK(reader->Pread(0, head.size(), head.data()));

  ASSERT_OK(store->Remove("gone"));
  EXPECT_CODE(store->Get("gone"), StatusCode::kNotFound) << "gone from the list at once";
  EXPECT_CODE(store->OpenFile("gone", "a.bin"), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(auto list, store->List());
  ASSERT_EQ(list.size(), 1u);

  ASSERT_OK_AND_ASSIGN(GcReport pinned, store->Gc());
  EXPECT_EQ(pinned.chunks_deleted, 0u) << "gc took chunks an open reader needs";
  EXPECT_EQ(pinned.orphan_records_deleted, 0u);
  // The chunk cache must not be what serves the bytes: they come from disk.
  EXPECT_EQ(ReadAll(*reader), expected);
  EXPECT_EQ(ReadAll(*second), expected);

  // One reader gone: the other still pins the snapshot.
  reader.reset();
  ASSERT_OK_AND_ASSIGN(GcReport still, store->Gc());
  EXPECT_EQ(still.chunks_deleted, 0u);
  EXPECT_EQ(ReadAll(*second), expected);

  ASSERT_OK_AND_ASSIGN(StoreStats before, store->Stats());
  second.reset();
  ASSERT_OK_AND_ASSIGN(GcReport freed, store->Gc());
  EXPECT_EQ(freed.chunks_deleted, gone.new_chunks);
  EXPECT_EQ(freed.orphan_records_deleted, 1u) << "the removed snapshot's index";
  EXPECT_GE(freed.bytes_deleted, 4u << 20) << "random chunks are stored raw";
  ASSERT_OK_AND_ASSIGN(StoreStats after, store->Stats());
  EXPECT_EQ(after.chunk_count, before.chunk_count - gone.new_chunks);
  EXPECT_LT(after.stored_bytes + (4u << 20), before.stored_bytes + 4096);
  ASSERT_OK_AND_ASSIGN(FsckReport fsck, store->Fsck());
  EXPECT_TRUE(fsck.clean()) << fsck.problems.front();
  EXPECT_TRUE(ExportMatches(*store, "stays", other, tmp.path()));
  // Nothing of it is left for a later gc.
  ASSERT_OK_AND_ASSIGN(GcReport again, store->Gc());
  EXPECT_EQ(again.chunks_deleted, 0u);
  EXPECT_EQ(again.orphan_records_deleted, 0u);
}

TEST(StoreSafetyTest, RemovingAnUnreadSnapshotDeletesItsIndexAtOnce) {
  TempDir tmp;
  const std::string src = tmp.Sub("src");
  testing::MakeCheckpointTree(src, 5, 1u << 20);
  auto store = OpenStore(tmp.Sub("store"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, src, "s"));
  { ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("s", "pages-1.img")); }
  ASSERT_OK(store->Remove("s"));
  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_EQ(gc.orphan_records_deleted, 0u) << "a closed reader must not keep a pin";
  EXPECT_GT(gc.chunks_deleted, 0u);
}

// The extent of `path` of snapshot `id` at file offset 0.
Result<Extent> FirstExtent(Store& store, const std::string& id, const std::string& path) {
  auto& impl = static_cast<StoreImpl&>(store);
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store.Get(id));
  GPUCKPT_ASSIGN_OR_RETURN(auto records, impl.catalog().ReadFiles(info.key));
  for (const auto& [index, entry] : records) {
    if (entry.path != path) continue;
    GPUCKPT_ASSIGN_OR_RETURN(std::optional<Extent> extent,
                             impl.catalog().FindExtent(info.key, index, 0, "reading"));
    if (!extent) return Status::IOError("no extent at 0");
    return std::move(*extent);
  }
  return Status::NotFound(path);
}

TEST(StoreSafetyTest, FsckNamesTheDamagedChunkOnceAndEachFileUsingItOnce) {
  TempDir tmp;
  const std::string src = tmp.Sub("src");
  testing::MakeDirs(src);
  // One chunk of zeros, named hundreds of times: the zero pages of
  // zeros.bin and the first MiB of mixed.bin. random.bin shares nothing.
  testing::WriteFile(src + "/zeros.bin", std::string(24u << 20, '\0'));
  testing::WriteFile(src + "/mixed.bin",
                     std::string(1u << 20, '\0') + testing::RandomBytes(1u << 20, 81));
  testing::WriteRandomFile(src + "/random.bin", 2u << 20, 82);
  const std::string store_dir = tmp.Sub("store");
  std::string zero_hash;
  {
    auto store = OpenStore(store_dir);
    ASSERT_NE(store, nullptr);
    ASSERT_OK(Import(*store, src, "s1"));
    ASSERT_OK(Import(*store, src, "s2"));  // every chunk named twice as often
    ASSERT_OK_AND_ASSIGN(Extent zero, FirstExtent(*store, "s1", "zeros.bin"));
    ASSERT_OK_AND_ASSIGN(Extent mixed, FirstExtent(*store, "s1", "mixed.bin"));
    ASSERT_EQ(zero.hash, mixed.hash) << "the test needs one shared zero chunk";
    zero_hash = zero.hash.Hex();
  }
  // One flipped bit in the chunk's record, in its pack.
  ASSERT_OK(testing::FlipChunkByte(store_dir, zero_hash, 0));

  auto store = OpenStore(store_dir);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(FsckReport report, store->Fsck());
  EXPECT_GT(report.extents_checked, 200u);
  EXPECT_EQ(report.damaged_chunks, 1u);
  EXPECT_EQ(report.damaged_files, 4u);
  ASSERT_EQ(report.problems.size(), 5u) << ::testing::PrintToString(report.problems);
  EXPECT_NE(report.problems[0].find("damaged chunk " + zero_hash), std::string::npos)
      << report.problems[0];
  EXPECT_NE(report.problems[0].find(std::string(format::kPacksDirName) + "/"), std::string::npos)
      << "says where the record lies: " << report.problems[0];
  std::vector<std::string> files(report.problems.begin() + 1, report.problems.end());
  std::sort(files.begin(), files.end());
  const std::vector<std::string> prefixes = {
      "snapshot 's1' file 'mixed.bin': ", "snapshot 's1' file 'zeros.bin': ",
      "snapshot 's2' file 'mixed.bin': ", "snapshot 's2' file 'zeros.bin': "};
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(files[i].rfind(prefixes[i], 0), 0u) << files[i];
    EXPECT_NE(files[i].find(" damaged (1 distinct)"), std::string::npos) << files[i];
  }
  // What fsck names is what fails to read, and nothing else does.
  ASSERT_OK_AND_ASSIGN(auto random, store->OpenFile("s2", "random.bin"));
  EXPECT_EQ(ReadAll(*random), testing::ReadFile(src + "/random.bin"));
  ASSERT_OK_AND_ASSIGN(auto zeros, store->OpenFile("s1", "zeros.bin"));
  std::string buf(4096, '\0');
  EXPECT_CODE(zeros->Pread(0, buf.size(), buf.data()), StatusCode::kCorruption);
}

// A tmpfs of a few dozen MiB: a disk that fills in a second. Root only.
class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
    fs_ = tmp_.Sub("fs");
    testing::MakeDirs(fs_);
    if (mount("tmpfs", fs_.c_str(), "tmpfs", 0, "size=48m,mode=0755") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
    }
    mounted_ = true;
    store_dir_ = fs_ + "/store";
  }
  void TearDown() override {
    store_.reset();
    if (mounted_) umount2(fs_.c_str(), MNT_DETACH);
  }

  uint64_t FreeBytes() const {
    struct statvfs vfs {};
    EXPECT_EQ(statvfs(fs_.c_str(), &vfs), 0);
    return uint64_t{vfs.f_bavail} * vfs.f_frsize;
  }
  uint64_t UsedBytes() const {
    struct statvfs vfs {};
    EXPECT_EQ(statvfs(fs_.c_str(), &vfs), 0);
    return uint64_t{vfs.f_blocks - vfs.f_bfree} * vfs.f_frsize;
  }
  // A tree of random files (on the real disk) of `mib` MiB.
  std::string Tree(const std::string& name, int mib, uint64_t seed) {
    const std::string dir = tmp_.Sub(name);
    testing::MakeDirs(dir);
    for (int i = 0; i < mib; i += 4) {
      testing::WriteRandomFile(dir + "/f" + std::to_string(i) + ".bin",
                               std::min(4, mib - i) * (1u << 20), seed * 1000 + i);
    }
    return dir;
  }
  static void ExpectNoSpace(const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
    EXPECT_EQ(ErrnoFromStatus(s), ENOSPC);
    EXPECT_NE(s.message().find("no space left on the store's disk"), std::string::npos)
        << s.ToString();
  }

  TempDir tmp_;
  std::string fs_, store_dir_;
  bool mounted_ = false;
  std::unique_ptr<Store> store_;
};

TEST_F(DiskFullTest, AnImportTooLargeFailsAndRmAndGcGiveTheSpaceBackOnTheFullDisk) {
  store_ = OpenStore(store_dir_);
  ASSERT_NE(store_, nullptr);
  const std::string a = Tree("a", 6, 1), b = Tree("b", 6, 2), big = Tree("big", 64, 3);
  ASSERT_OK(Import(*store_, a, "a"));
  ASSERT_OK(Import(*store_, b, "b"));
  const uint64_t used_with_ab = UsedBytes();

  auto failed = Import(*store_, big, "big");
  ASSERT_FALSE(failed.ok());
  ExpectNoSpace(failed.status());
  EXPECT_LT(FreeBytes(), 1u << 20) << "the disk is full";
  EXPECT_CODE(store_->Get("big"), StatusCode::kNotFound);

  // While it is full: rm works, and gc gives back what rm freed and what
  // the failed import left in the packs (its records lie in the same pack
  // as b's).
  ASSERT_OK(store_->Remove("a"));
  ASSERT_OK_AND_ASSIGN(GcReport gc, store_->Gc());
  EXPECT_GT(gc.chunks_deleted, 0u);
  EXPECT_GT(gc.bytes_punched + gc.bytes_rewritten, 0u);
  EXPECT_LE(UsedBytes(), used_with_ab - (4u << 20))
      << "a's 6 MiB and all of the failed import's must be given back";
  ASSERT_OK_AND_ASSIGN(FsckReport fsck, store_->Fsck());
  EXPECT_TRUE(fsck.clean()) << fsck.problems.front();
  EXPECT_TRUE(ExportMatches(*store_, "b", b, tmp_.path()));

  // The same store, not reopened, takes new snapshots again.
  const std::string c = Tree("c", 12, 4);
  ASSERT_OK(Import(*store_, c, "c"));
  EXPECT_TRUE(ExportMatches(*store_, "c", c, tmp_.path()));
}

TEST_F(DiskFullTest, TheStoreResumesByItselfOnceSpaceIsBack) {
  store_ = OpenStore(store_dir_);
  ASSERT_NE(store_, nullptr);
  const std::string a = Tree("a", 4, 5), b = Tree("b", 4, 6);
  ASSERT_OK(Import(*store_, a, "a"));
  // A snapshot whose data is in, when someone else fills the disk to the
  // last byte: its commit cannot flush RocksDB's memtables, and RocksDB
  // stops taking writes until it is resumed.
  SnapshotSpec spec;
  spec.name = "b";
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec));
  {
    const int fd = open((b + "/f0.bin").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    FileEntry e;
    e.path = "f0.bin";
    e.mode = 0644;
    ASSERT_OK(writer->AddFile(e, fd));
    close(fd);
  }
  const std::string filler = fs_ + "/filler";
  {
    const int fd = open(filler.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    std::string block(64u << 10, 'x');
    for (size_t len = block.size(); len > 0;) {
      if (write(fd, block.data(), len) < 0) len /= 2;
    }
    close(fd);
  }
  ASSERT_LT(FreeBytes(), 4096u);
  auto failed = writer->Commit();
  ASSERT_FALSE(failed.ok());
  ExpectNoSpace(failed.status());
  writer.reset();
  // While the disk is still full: no new snapshot (and no crash), but rm
  // and gc work (the reserve is given up for them).
  ExpectNoSpace(Import(*store_, b, "b").status());
  ASSERT_OK(store_->Remove("a"));
  ASSERT_OK(store_->Gc());
  // The other user's file goes: the next import works, same store object.
  ASSERT_EQ(unlink(filler.c_str()), 0);
  ASSERT_OK(Import(*store_, b, "b"));
  EXPECT_TRUE(ExportMatches(*store_, "b", b, tmp_.path()));
  ASSERT_OK_AND_ASSIGN(FsckReport fsck, store_->Fsck());
  EXPECT_TRUE(fsck.clean()) << fsck.problems.front();
  // The reserve is back: new data cannot take the room rm and gc need.
  struct stat st {};
  EXPECT_EQ(stat((store_dir_ + "/" + format::kReserveFileName).c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, format::kReserveMinBytes);
  // stats says how much of the store's disk use it is.
  ASSERT_OK_AND_ASSIGN(StoreStats stats, store_->Stats());
  EXPECT_EQ(stats.reserve_bytes, static_cast<uint64_t>(st.st_blocks) * 512);
  EXPECT_LE(stats.reserve_bytes, stats.disk_bytes);
  // And it all survives a reopen.
  store_.reset();
  store_ = OpenStore(store_dir_);
  ASSERT_NE(store_, nullptr);
  EXPECT_TRUE(ExportMatches(*store_, "b", b, tmp_.path()));
}

}  // namespace
}  // namespace gpuckpt
