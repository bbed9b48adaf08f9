// Spooled snapshots (SnapshotWriterOptions::spool): files made durable raw
// in STORE/spool/ read the same before, during and after the store chunks
// them (settling); what a crash, a removal, an abandoned writer or a reopen
// leaves; fsck, quotas, export and bases. The power-loss case is in
// power_loss_test.cc.
#include "core/snapshot/spool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/catalog/records.h"
#include "core/snapshot/store_impl.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::RandomStream;
using testing::TempDir;
using testing::WriteFlatTree;
using Spooling = SnapshotWriterOptions::Spool;

class SpoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeDirs(src_);
    // A page image of random and zero pages (it compresses), and a random
    // file that does not.
    std::string pages = RandomStream(1).Bytes(0, 3u << 20);
    for (size_t p = 0; p < pages.size() / 4096; p += 2) std::memset(&pages[p * 4096], 0, 4096);
    testing::WriteFile(src_ + "/pages-1.img", pages, 0600);
    testing::WriteRandomFile(src_ + "/core-1.img", (1u << 20) + 4321, 2, 0640);
    testing::WriteFile(src_ + "/empty", "", 0644);
    OpenStore(/*settle_in_background=*/false);
  }

  void OpenStore(bool settle_in_background) {
    store_.reset();
    StoreOptions options = testing::TestOptions();
    options.settle_in_background = settle_in_background;
    auto s = Store::Open(store_dir_, options);
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }
  StoreImpl& impl() { return static_cast<StoreImpl&>(*store_); }

  std::vector<std::string> SpoolFiles() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(store_dir_ + "/spool"))
      names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  // Whether every regular file of `id` is spooled (`true`) or none is.
  ::testing::AssertionResult AllSpooled(const std::string& id, bool spooled) {
    auto files = store_->ListFiles(id);
    if (!files.ok()) return ::testing::AssertionFailure() << files.status().ToString();
    for (const FileEntry& e : *files) {
      if (e.type == FileType::kRegular && e.spooled != spooled)
        return ::testing::AssertionFailure() << e.path << " spooled: " << e.spooled;
    }
    return ::testing::AssertionSuccess();
  }
  // The sums of `id`'s file records' chunk_count, new_bytes and
  // stored_bytes.
  FileEntry FileTotals(const std::string& id) {
    FileEntry sum;
    auto files = store_->ListFiles(id);
    EXPECT_OK(files);
    if (!files.ok()) return sum;
    for (const FileEntry& e : *files) {
      sum.chunk_count += e.chunk_count;
      sum.new_bytes += e.new_bytes;
      sum.stored_bytes += e.stored_bytes;
    }
    return sum;
  }
  void ExpectFsckClean() {
    ASSERT_OK_AND_ASSIGN(FsckReport r, store_->Fsck());
    EXPECT_TRUE(r.clean()) << "first problem: " << (r.problems.empty() ? "" : r.problems[0]);
  }
  std::string ReadAll(FileReader& reader) {
    std::string out(reader.entry().size, '\0');
    auto n = reader.Pread(0, out.size(), out.data());
    EXPECT_OK(n);
    return n.ok() && *n == out.size() ? out : "<short read>";
  }

  TempDir tmp_;
  const std::string src_ = tmp_.Sub("src");
  const std::string store_dir_ = tmp_.Sub("store");
  std::unique_ptr<Store> store_;
};

TEST_F(SpoolTest, ReadsTheSameBeforeDuringAndAfterSettling) {
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, WriteFlatTree(*store_, src_, "s", Spooling::kAlways));
  // Durable raw: every byte new and stored as it came, in one spool file
  // per non-empty file, nothing chunked.
  const uint64_t total = (3u << 20) + (1u << 20) + 4321;
  EXPECT_EQ(info.logical_bytes, total);
  EXPECT_EQ(info.new_bytes, total);
  EXPECT_EQ(info.chunk_count, 0u);
  EXPECT_EQ(SpoolFiles().size(), 3u);
  EXPECT_TRUE(AllSpooled("s", true));
  EXPECT_TRUE(ExportMatches(*store_, "s", src_, tmp_.path()));
  ExpectFsckClean();
  ASSERT_OK_AND_ASSIGN(FsckReport spooled_fsck, store_->Fsck());
  EXPECT_EQ(spooled_fsck.spooled_files, 3u);

  // A reader opened before settling reads its spool file to the end.
  ASSERT_OK_AND_ASSIGN(auto before, store_->OpenFile("s", "pages-1.img"));
  const std::string pages = testing::ReadFile(src_ + "/pages-1.img");
  ASSERT_OK(impl().Settle("s"));
  EXPECT_TRUE(SpoolFiles().empty());
  EXPECT_TRUE(AllSpooled("s", false));
  EXPECT_EQ(ReadAll(*before), pages);
  before.reset();

  // Chunked now: compressed, counted in the file records, checked, and
  // read from the chunks. The manifest stays as it was published.
  const FileEntry totals = FileTotals("s");
  EXPECT_GT(totals.chunk_count, 0u);
  EXPECT_LT(totals.stored_bytes, total) << "the zero pages were not compressed";
  ASSERT_OK_AND_ASSIGN(SnapshotInfo settled, store_->Get("s"));
  EXPECT_EQ(settled.new_bytes, info.new_bytes);
  EXPECT_EQ(settled.stored_bytes, info.stored_bytes);
  EXPECT_EQ(settled.chunk_count, 0u);
  ASSERT_OK_AND_ASSIGN(auto after, store_->OpenFile("s", "pages-1.img"));
  EXPECT_EQ(ReadAll(*after), pages);
  EXPECT_TRUE(ExportMatches(*store_, "s", src_, tmp_.path()));
  ExpectFsckClean();
  // Settling again finds nothing to do.
  EXPECT_OK(impl().Settle("s"));
}

TEST_F(SpoolTest, ReadersWhileTheSettlerRunsSeeTheSameBytes) {
  const std::string pages = testing::ReadFile(src_ + "/pages-1.img");
  ASSERT_OK(WriteFlatTree(*store_, src_, "s", Spooling::kAlways).status());
  OpenStore(/*settle_in_background=*/true);  // the reopen queues it
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("s", "pages-1.img"));
    ASSERT_EQ(ReadAll(*reader), pages) << "read " << i;
  }
  impl().WaitSettled();
  EXPECT_TRUE(SpoolFiles().empty());
  EXPECT_TRUE(AllSpooled("s", false));
  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("s", "pages-1.img"));
  EXPECT_EQ(ReadAll(*reader), pages);
  ExpectFsckClean();
}

TEST_F(SpoolTest, FsckWhileTheSettlerRunsFindsNothingWrong) {
  // Fsck reads the tables in turn; the settler writes chunks, extents and
  // file records meanwhile. Fsck must see the store as of one moment, never
  // a settled file record whose chunks it read before they existed.
  for (int i = 0; i < 6; ++i) {
    ASSERT_OK(WriteFlatTree(*store_, src_, "s" + std::to_string(i), Spooling::kAlways).status());
  }
  OpenStore(/*settle_in_background=*/true);  // the reopen queues them
  int while_spooled = 0;
  for (int pass = 0; !SpoolFiles().empty(); ++pass) {
    ASSERT_OK_AND_ASSIGN(FsckReport r, store_->Fsck());
    ASSERT_TRUE(r.clean()) << "pass " << pass << ": " << r.problems.size()
                           << " problems, the first: " << r.problems[0];
    if (r.spooled_files > 0) ++while_spooled;
  }
  impl().WaitSettled();
  ExpectFsckClean();
  RecordProperty("fscks_while_spooled", while_spooled);
}

TEST_F(SpoolTest, RemovedBeforeSettlingLeavesNoSpoolFile) {
  ASSERT_OK(WriteFlatTree(*store_, src_, "gone", Spooling::kAlways).status());
  ASSERT_OK(WriteFlatTree(*store_, src_, "kept", Spooling::kAlways).status());
  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("gone", "core-1.img"));
  ASSERT_OK(store_->Remove("gone"));
  // Settling a removed snapshot writes nothing back; the pinned reader
  // keeps its bytes through gc.
  ASSERT_OK(impl().Settle("gone"));
  EXPECT_CODE(store_->Get("gone"), StatusCode::kNotFound);
  ASSERT_OK(store_->Gc().status());
  EXPECT_EQ(ReadAll(*reader), testing::ReadFile(src_ + "/core-1.img"));
  reader.reset();
  ASSERT_OK(store_->Gc().status());
  // Only "kept"'s spool files are left.
  ASSERT_OK_AND_ASSIGN(SnapshotInfo kept, store_->Get("kept"));
  for (const std::string& name : SpoolFiles()) {
    EXPECT_EQ(name.substr(0, 16), Spool::FileName(kept.key, 0).substr(0, 16)) << name;
  }
  EXPECT_EQ(SpoolFiles().size(), 3u);
  ASSERT_OK(impl().Settle("kept"));
  EXPECT_TRUE(SpoolFiles().empty());
  ExpectFsckClean();
}

TEST_F(SpoolTest, AnAbandonedWriterLeavesNoSpoolFile) {
  {
    SnapshotSpec spec;
    spec.name = "abandoned";
    SnapshotWriterOptions options;
    options.spool = Spooling::kAlways;
    ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec, options));
    UniqueFd fd(open((src_ + "/core-1.img").c_str(), O_RDONLY | O_CLOEXEC));
    FileEntry e;
    e.path = "core-1.img";
    ASSERT_OK(writer->AddFile(e, fd.get()));
    EXPECT_EQ(SpoolFiles().size(), 1u);
  }
  EXPECT_TRUE(SpoolFiles().empty());
  EXPECT_CODE(store_->Get("abandoned"), StatusCode::kNotFound);
}

TEST_F(SpoolTest, AReopenSettlesWhatWasLeftAndRemovesWhatNothingNeeds) {
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, WriteFlatTree(*store_, src_, "s", Spooling::kAlways));
  store_.reset();
  // A crash left a spool file of a snapshot never published, and one of a
  // file already settled would look the same: neither is needed.
  testing::WriteFile(store_dir_ + "/spool/" + Spool::FileName(info.key + 100, 0), "orphan");
  testing::WriteFile(store_dir_ + "/spool/not-a-spool-file", "left alone");
  OpenStore(/*settle_in_background=*/true);
  impl().WaitSettled();
  EXPECT_EQ(SpoolFiles(), std::vector<std::string>{"not-a-spool-file"});
  EXPECT_TRUE(AllSpooled("s", false));
  EXPECT_TRUE(ExportMatches(*store_, "s", src_, tmp_.path()));
  ExpectFsckClean();
}

TEST_F(SpoolTest, OnASpooledBaseAWriterSettlesItFirstUnlessItAlwaysSpools) {
  ASSERT_OK(WriteFlatTree(*store_, src_, "first", Spooling::kUnlessBase).status());
  EXPECT_TRUE(AllSpooled("first", true)) << "no base: spooled";
  // kAlways on a spooled base: spooled too, naming its base, and settled
  // on it once the base is.
  ASSERT_OK_AND_ASSIGN(SnapshotInfo always,
                       WriteFlatTree(*store_, src_, "always", Spooling::kAlways, "first"));
  EXPECT_TRUE(AllSpooled("always", true));
  EXPECT_EQ(always.base, "first");
  EXPECT_TRUE(AllSpooled("first", true)) << "a spooling writer settles nothing";
  // kUnlessBase (and kNever) on a spooled base: the base is settled first,
  // on the writer's thread, and only what changed is stored, at once.
  ASSERT_OK_AND_ASSIGN(SnapshotInfo second,
                       WriteFlatTree(*store_, src_, "second", Spooling::kUnlessBase, "first"));
  EXPECT_TRUE(AllSpooled("first", false));
  EXPECT_TRUE(AllSpooled("second", false));
  EXPECT_EQ(second.base, "first");
  EXPECT_EQ(second.new_bytes, 0u);
  EXPECT_GT(second.base_chunks, 0u);
  ASSERT_OK(impl().Settle("always"));
  EXPECT_EQ(FileTotals("always").new_bytes, 0u) << "settled on its base";
  EXPECT_GT(FileTotals("first").new_bytes, 0u);
  EXPECT_TRUE(SpoolFiles().empty());
  for (const char* id : {"first", "always", "second"})
    EXPECT_TRUE(ExportMatches(*store_, id, src_, tmp_.path())) << id;
  ExpectFsckClean();
}

TEST_F(SpoolTest, AWriterTakesTheSettlingOfItsBaseOverFromTheSettler) {
  // Large enough that the settler is still at it when the writer begins.
  testing::WriteRandomFile(src_ + "/pages-2.img", 48u << 20, 3, 0600);
  ASSERT_OK(WriteFlatTree(*store_, src_, "first", Spooling::kAlways).status());
  OpenStore(/*settle_in_background=*/true);  // the reopen queues "first"
  ASSERT_OK_AND_ASSIGN(SnapshotInfo second,
                       WriteFlatTree(*store_, src_, "second", Spooling::kNever, "first"));
  EXPECT_TRUE(AllSpooled("first", false));
  EXPECT_TRUE(AllSpooled("second", false));
  EXPECT_EQ(second.new_bytes, 0u);
  impl().WaitSettled();
  EXPECT_TRUE(SpoolFiles().empty());
  for (const char* id : {"first", "second"})
    EXPECT_TRUE(ExportMatches(*store_, id, src_, tmp_.path())) << id;
  ExpectFsckClean();
}

TEST_F(SpoolTest, NothingIsSettledWhileAWriterSpools) {
  OpenStore(/*settle_in_background=*/true);
  {
    SnapshotSpec spec;
    spec.name = "spooling";
    SnapshotWriterOptions options;
    options.spool = Spooling::kAlways;
    ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec, options));
    // Committed and queued while the writer above spools: the settler
    // waits for it.
    ASSERT_OK(WriteFlatTree(*store_, src_, "first", Spooling::kAlways).status());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(AllSpooled("first", true));
    EXPECT_EQ(SpoolFiles().size(), 3u);
  }
  // The writer gone, the settler goes on.
  impl().WaitSettled();
  EXPECT_TRUE(AllSpooled("first", false));
  EXPECT_TRUE(SpoolFiles().empty());
}

TEST_F(SpoolTest, FsckFindsAMissingOrShortSpoolFile) {
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, WriteFlatTree(*store_, src_, "s", Spooling::kAlways));
  ASSERT_OK_AND_ASSIGN(auto files, store_->ListFiles("s"));
  uint32_t core = 0;
  for (const FileEntry& e : files) {
    if (e.path == "core-1.img") core = e.index;
  }
  const std::string spooled = store_dir_ + "/spool/" + Spool::FileName(info.key, core);
  ASSERT_EQ(truncate(spooled.c_str(), 1000), 0);
  ASSERT_OK_AND_ASSIGN(FsckReport r, store_->Fsck());
  ASSERT_FALSE(r.clean());
  EXPECT_EQ(r.damaged_files, 1u);
  EXPECT_NE(r.problems[0].find("core-1.img"), std::string::npos) << r.problems[0];
  // A reader says so rather than return short data; settling refuses it
  // and leaves the snapshot as it is.
  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("s", "core-1.img"));
  std::string buf(4096, '\0');
  EXPECT_CODE(reader->Pread(2000, buf.size(), buf.data()), StatusCode::kCorruption);
  EXPECT_CODE(impl().Settle("s"), StatusCode::kCorruption);
  EXPECT_TRUE(AllSpooled("s", true));
}

TEST_F(SpoolTest, QuotasCountSpooledBytes) {
  ASSERT_OK(WriteFlatTree(*store_, src_, "s", Spooling::kAlways).status());
  ASSERT_OK_AND_ASSIGN(const uint64_t spooled, store_->HeldBytes({"s"}));
  EXPECT_EQ(spooled, (3u << 20) + (1u << 20) + 4321u);
  ASSERT_OK(impl().Settle("s"));
  ASSERT_OK_AND_ASSIGN(const uint64_t settled, store_->HeldBytes({"s"}));
  EXPECT_GT(settled, 0u);
  EXPECT_LT(settled, spooled) << "the zero pages compress";
}

TEST_F(SpoolTest, PipesAreSplicedWhole) {
  const uint64_t size = (9u << 20) + 77;
  const RandomStream stream(5);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::thread feeder = testing::FeedPipe(fds[1], stream, size, 65536 + 3);
  SnapshotSpec spec;
  spec.name = "piped";
  SnapshotWriterOptions options;
  options.spool = Spooling::kAlways;
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec, options));
  FileEntry e;
  e.path = "pages-1.img";
  const Status added = writer->AddFile(e, fds[0]);
  feeder.join();
  close(fds[0]);
  ASSERT_OK(added);
  EXPECT_EQ(writer->bytes_read(), size);
  ASSERT_OK(writer->Commit().status());
  writer.reset();
  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("piped", "pages-1.img"));
  EXPECT_EQ(ReadAll(*reader), stream.Bytes(0, size));
  ASSERT_OK(impl().Settle("piped"));
  ASSERT_OK_AND_ASSIGN(auto settled, store_->OpenFile("piped", "pages-1.img"));
  EXPECT_EQ(ReadAll(*settled), stream.Bytes(0, size));
}

TEST(SpooledFileRecordTest, HasAVersionOfItsOwn) {
  FileEntry e;
  e.path = "images/pages-1.img";
  e.size = 123;
  e.spooled = true;
  const std::string record = EncodeFileRecord(e);
  EXPECT_EQ(static_cast<uint8_t>(record[0]), 2u) << "older builds must refuse it";
  ASSERT_OK_AND_ASSIGN(FileEntry back, DecodeFileRecord(record));
  EXPECT_TRUE(back.spooled);
  e.spooled = false;
  const std::string plain = EncodeFileRecord(e);
  EXPECT_EQ(static_cast<uint8_t>(plain[0]), 1u);
  // The flag and the version must agree.
  std::string forged = plain;
  forged[0] = 2;
  EXPECT_CODE(DecodeFileRecord(forged), StatusCode::kCorruption);
}

}  // namespace
}  // namespace gpuckpt
