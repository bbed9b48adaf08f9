// Imports that cost what their data costs: sparse files keep their holes
// (read, fsck, export, gc), a tree is measured before it is read, a
// container archive is refused as soon as it expands past its limits, and
// a caller can cancel an import in the middle of a file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/base/unique_fd.h"
#include "core/catalog/records.h"
#include "core/snapshot/container_archive.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::RandomStream;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr uint64_t kTerabyte = 1ull << 40;

// Bytes written into a sparse file: where, and what.
struct DataRange {
  uint64_t offset;
  std::string bytes;
};

// A file of `size` bytes, holes but for `ranges`.
void MakeSparseFile(const std::string& path, uint64_t size, const std::vector<DataRange>& ranges) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_GE(fd.get(), 0) << path;
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  for (const DataRange& r : ranges) {
    ASSERT_EQ(pwrite(fd.get(), r.bytes.data(), r.bytes.size(), static_cast<off_t>(r.offset)),
              static_cast<ssize_t>(r.bytes.size()));
  }
}

std::string Pread(FileReader& reader, uint64_t offset, size_t len) {
  std::string out(len, '\xee');
  auto n = reader.Pread(offset, len, out.data());
  EXPECT_OK(n);
  out.resize(n.ok() ? *n : 0);
  return out;
}

std::string PreadFile(const std::string& path, uint64_t offset, size_t len) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string out(len, '\xee');
  const ssize_t n = pread(fd.get(), out.data(), len, static_cast<off_t>(offset));
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

class SparseImportTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  void Reopen() {
    store_.reset();
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(store_dir_.path(), testing::TestOptions()));
  }
  // Imports the tree at `src` through AddDirectoryToSnapshot(), as the
  // daemon does.
  Result<SnapshotInfo> ImportTree(const std::string& src, const std::string& name) {
    UniqueFd dir(open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() < 0) return StatusFromErrno(errno, src);
    SnapshotSpec spec;
    spec.name = name;
    GPUCKPT_ASSIGN_OR_RETURN(auto writer, store_->BeginSnapshot(spec));
    GPUCKPT_RETURN_IF_ERROR(AddDirectoryToSnapshot(writer.get(), dir.get(), src, {}));
    return writer->Commit();
  }
  Result<FileEntry> Listed(const std::string& id, const std::string& path) {
    GPUCKPT_ASSIGN_OR_RETURN(auto files, store_->ListFiles(id));
    for (auto& f : files) {
      if (f.path == path) return f;
    }
    return Status::NotFound(path);
  }
  void ExpectFsckClean() {
    ASSERT_OK_AND_ASSIGN(FsckReport report, store_->Fsck());
    for (const auto& p : report.problems) ADD_FAILURE() << "fsck: " << p;
  }

  TempDir store_dir_{"gpuckpt-sparse-store"};
  TempDir scratch_{"gpuckpt-sparse-src"};
  std::unique_ptr<Store> store_;
};

// A terabyte, nearly all holes: data at the start, at unaligned offsets in
// the middle and up to the very end.
std::vector<DataRange> TerabyteRanges() {
  const RandomStream stream(7);
  return {{0, stream.Bytes(0, 300000)},
          {(5ull << 30) + 12345, stream.Bytes(1, 200000)},
          {(300ull << 30), stream.Bytes(2, 4096)},
          {kTerabyte - 100000, stream.Bytes(3, 100000)}};
}

TEST_F(SparseImportTest, TerabyteSparseFileCostsOnlyItsData) {
  const std::string src = scratch_.Sub("tree");
  testing::MakeDirs(src);
  const auto ranges = TerabyteRanges();
  uint64_t data = 0;
  for (const auto& r : ranges) data += r.bytes.size();
  MakeSparseFile(src + "/pages-1.img", kTerabyte, ranges);
  testing::WriteFile(src + "/small", "plain file");

  // Measured without reading: two files, 1 TB, about the data's bytes
  // (rounded to blocks, small holes counted as data).
  UniqueFd dir(open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_OK_AND_ASSIGN(DirectoryMeasure measure, MeasureDirectory(dir.get(), src, {}));
  EXPECT_EQ(measure.entries, 2u);
  EXPECT_EQ(measure.logical_bytes, kTerabyte + 10);
  EXPECT_GE(measure.data_bytes, data + 10);
  EXPECT_LT(measure.data_bytes, data + (1u << 20));

  const auto start = Clock::now();
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, ImportTree(src, "sparse"));
  const double seconds = SecondsSince(start);
  std::printf("1 TB sparse file (%llu data bytes) imported in %.3f s\n",
              static_cast<unsigned long long>(data), seconds);
  // Reading a terabyte of holes would take minutes on any machine.
  EXPECT_LT(seconds, 30.0) << "the holes were read";
  EXPECT_EQ(info.logical_bytes, kTerabyte + 10);
  EXPECT_LT(info.new_bytes, data + (1u << 20)) << "holes were stored";

  ASSERT_OK_AND_ASSIGN(FileEntry entry, Listed("sparse", "pages-1.img"));
  EXPECT_EQ(entry.size, kTerabyte);
  EXPECT_GE(entry.holes.size(), 3u);
  EXPECT_LE(entry.holes.size(), 4u);

  // Zeros in holes, the data where it was written, across every edge.
  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("sparse", "pages-1.img"));
  EXPECT_EQ(reader->entry().size, kTerabyte);
  for (const auto& r : ranges) {
    EXPECT_EQ(Pread(*reader, r.offset, r.bytes.size()), r.bytes) << "at " << r.offset;
    if (r.offset >= 4096) {
      EXPECT_EQ(Pread(*reader, r.offset - 4096, 4096 + 10),
                std::string(4096, '\0') + r.bytes.substr(0, 10));
    }
    const uint64_t end = r.offset + r.bytes.size();
    if (end < kTerabyte) {
      EXPECT_EQ(Pread(*reader, end - 10, 4096 + 10),
                r.bytes.substr(r.bytes.size() - 10) + std::string(4096, '\0'));
    }
  }
  EXPECT_EQ(Pread(*reader, 77ull << 30, 1u << 20), std::string(1u << 20, '\0'));
  EXPECT_EQ(Pread(*reader, kTerabyte - 5, 100), ranges.back().bytes.substr(100000 - 5));
  EXPECT_EQ(testing::ReadAll(*store_, "sparse", "small"), "plain file");
  reader.reset();
  ExpectFsckClean();

  // gc keeps every chunk the holes' neighbours need.
  ASSERT_OK(store_->Gc());
  ExpectFsckClean();

  // Export writes a sparse file again.
  const std::string out = scratch_.Sub("out");
  ASSERT_OK(store_->Export("sparse", out));
  struct stat st {};
  ASSERT_EQ(stat((out + "/pages-1.img").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kTerabyte);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 16u << 20) << "holes were written";
  for (const auto& r : ranges) {
    EXPECT_EQ(PreadFile(out + "/pages-1.img", r.offset, r.bytes.size()), r.bytes);
  }
  EXPECT_EQ(PreadFile(out + "/pages-1.img", 42ull << 30, 4096), std::string(4096, '\0'));
}

TEST_F(SparseImportTest, FileOfHolesOnlyKeepsItsSize) {
  const std::string src = scratch_.Sub("tree");
  testing::MakeDirs(src);
  MakeSparseFile(src + "/empty-but-large", 3ull << 30, {});
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, ImportTree(src, "holes"));
  EXPECT_EQ(info.new_bytes, 0u);
  ASSERT_OK_AND_ASSIGN(FileEntry entry, Listed("holes", "empty-but-large"));
  EXPECT_EQ(entry.size, 3ull << 30);
  EXPECT_EQ(entry.holes, (std::vector<FileHole>{{0, 3ull << 30}}));
  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("holes", "empty-but-large"));
  EXPECT_EQ(Pread(*reader, (3ull << 30) - 100, 200), std::string(100, '\0'));
  reader.reset();
  ExpectFsckClean();
}

// A record as builds before holes wrote it reads as it did; one with holes
// out of order, touching, outside its file or too many is damaged.
TEST(SparseRecordTest, RecordsWithoutHolesReadAsBefore) {
  const std::string old_record =
      std::string(1, '\x01') +
      R"({"type":"file","mode":420,"uid":1,"gid":2,"size":100,"mtime_ns":5,)"
      R"("chunks":1,"new_bytes":100,"stored_bytes":60,"path":"images/pages-1.img"})";
  ASSERT_OK_AND_ASSIGN(FileEntry e, DecodeFileRecord(old_record));
  EXPECT_EQ(e.size, 100u);
  EXPECT_TRUE(e.holes.empty());
  EXPECT_EQ(EncodeFileRecord(e).find("holes"), std::string::npos) << "older builds read it";

  e.holes = {{10, 20}, {50, 50}};
  ASSERT_OK_AND_ASSIGN(FileEntry back, DecodeFileRecord(EncodeFileRecord(e)));
  EXPECT_EQ(back.holes, e.holes);

  const auto with_holes = [&](const std::string& holes) {
    std::string r = old_record;
    r.insert(r.size() - 1, R"(,"holes":)" + holes);
    return DecodeFileRecord(r);
  };
  EXPECT_OK(with_holes("[[0,100]]"));
  EXPECT_CODE(with_holes("[[50,10],[10,10]]"), StatusCode::kCorruption);  // out of order
  EXPECT_CODE(with_holes("[[10,10],[20,10]]"), StatusCode::kCorruption);  // touching
  EXPECT_CODE(with_holes("[[90,11]]"), StatusCode::kCorruption);          // past the end
  EXPECT_CODE(with_holes("[[10,0]]"), StatusCode::kCorruption);           // empty
  EXPECT_CODE(with_holes("[[10,-1]]"), StatusCode::kCorruption);
  std::string many = "[";
  for (size_t i = 0; i <= kMaxFileHoles; ++i)
    many += (i ? ",[" : "[") + std::to_string(i * 2) + ",1]";
  FileEntry large;
  large.path = "f";
  large.size = 100000;
  std::string big = EncodeFileRecord(large);
  big.insert(big.size() - 1, R"(,"holes":)" + many + "]");
  EXPECT_CODE(DecodeFileRecord(big), StatusCode::kCorruption);
}

// A gap no hole accounts for is damage, for fsck and for readers; so is a
// recorded hole over bytes that extents hold.
TEST_F(SparseImportTest, GapThatIsNoHoleIsDamage) {
  const std::string src = scratch_.Sub("tree");
  testing::MakeDirs(src);
  const RandomStream stream(3);
  MakeSparseFile(src + "/f", 64u << 20,
                 {{0, stream.Bytes(0, 1u << 20)}, {32u << 20, stream.Bytes(1, 1u << 20)}});
  ASSERT_OK(ImportTree(src, "s"));
  ExpectFsckClean();
  store_.reset();

  // The holes forgotten: the extents stop at 1 MiB and go on at 32 MiB.
  ASSERT_OK(testing::EditFileRecords(store_dir_.path(), [](const std::string& record) {
    auto e = DecodeFileRecord(record);
    EXPECT_OK(e);
    if (!e.ok() || e->holes.empty()) return record;
    e->holes.clear();
    return EncodeFileRecord(*e);
  }));
  Reopen();
  {
    ASSERT_OK_AND_ASSIGN(FsckReport report, store_->Fsck());
    ASSERT_FALSE(report.problems.empty()) << "a gap went unnoticed";
    EXPECT_NE(report.problems[0].find("file 'f'"), std::string::npos) << report.problems[0];
    ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("s", "f"));
    char buf[16];
    EXPECT_CODE(reader->Pread(2u << 20, sizeof buf, buf), StatusCode::kCorruption);
    EXPECT_CODE(store_->Export("s", scratch_.Sub("out")), StatusCode::kCorruption);
  }
  store_.reset();

  // A hole recorded over the first data run.
  ASSERT_OK(testing::EditFileRecords(store_dir_.path(), [](const std::string& record) {
    auto e = DecodeFileRecord(record);
    if (!e.ok() || e->type != FileType::kRegular) return record;
    e->holes = {{4096, 8192}, {1u << 20, 31u << 20}, {33u << 20, 31u << 20}};
    return EncodeFileRecord(*e);
  }));
  Reopen();
  ASSERT_OK_AND_ASSIGN(FsckReport report, store_->Fsck());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("hole lies inside"), std::string::npos) << report.problems[0];
}

// --- container archives ------------------------------------------------

bool HaveTools() {
  return std::system("command -v tar >/dev/null && command -v zstd >/dev/null") == 0;
}

int Shell(const std::string& command) {
  const int r = std::system(command.c_str());
  return WIFEXITED(r) ? WEXITSTATUS(r) : 128;
}

class ContainerArchiveTest : public SparseImportTest {
 protected:
  void SetUp() override {
    if (!HaveTools()) GTEST_SKIP() << "needs GNU tar and zstd";
    SparseImportTest::SetUp();
  }
  // Imports the archive at `path` as snapshot `name`, with `options`.
  Result<SnapshotInfo> ImportArchive(const std::string& path, const std::string& name,
                                     const ContainerImportOptions& options) {
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return StatusFromErrno(errno, path);
    SnapshotSpec spec;
    spec.name = name;
    GPUCKPT_ASSIGN_OR_RETURN(auto writer, store_->BeginSnapshot(spec));
    GPUCKPT_RETURN_IF_ERROR(
        AddContainerArchiveToSnapshot(writer.get(), fd.get(), path, options).status());
    return writer->Commit();
  }
  // A checkpoint directory for an archive: checkpoint/pstree.img, to which
  // a test adds its members.
  std::string CheckpointDir() {
    const std::string dir = scratch_.Sub("ckpt");
    testing::MakeDirs(dir + "/checkpoint");
    testing::WriteFile(dir + "/checkpoint/pstree.img", "pstree");
    return dir;
  }
};

TEST_F(ContainerArchiveTest, SparseMembersKeepTheirHolesAndSize) {
  const std::string dir = CheckpointDir();
  const RandomStream stream(5);
  const std::string head = stream.Bytes(0, 100000), tail = stream.Bytes(1, 5000);
  MakeSparseFile(dir + "/checkpoint/pages-1.img", 1ull << 30,
                 {{0, head}, {(1ull << 30) - 5000, tail}});
  MakeSparseFile(dir + "/rootfs-holes", 10u << 20, {});
  const std::string archive = scratch_.Sub("ckpt.tar");
  ASSERT_EQ(Shell("tar --sparse -cf " + archive + " -C " + dir + " checkpoint rootfs-holes"), 0);
  struct stat st {};
  ASSERT_EQ(stat(archive.c_str(), &st), 0);
  ASSERT_LT(st.st_size, 1 << 20) << "tar did not write sparse members";

  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, ImportArchive(archive, "c", {}));
  EXPECT_LT(info.new_bytes, 1u << 20);
  ASSERT_OK_AND_ASSIGN(FileEntry pages, Listed("c", "images/pages-1.img"));
  EXPECT_EQ(pages.size, 1ull << 30);
  EXPECT_FALSE(pages.holes.empty());
  ASSERT_OK_AND_ASSIGN(FileEntry holes, Listed("c", "container/rootfs-holes"));
  EXPECT_EQ(holes.size, 10u << 20) << "an all-hole member is not an empty file";
  EXPECT_EQ(holes.holes, (std::vector<FileHole>{{0, 10u << 20}}));

  ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile("c", "images/pages-1.img"));
  EXPECT_EQ(Pread(*reader, 0, head.size()), head);
  EXPECT_EQ(Pread(*reader, (1ull << 30) - 5000, 5000), tail);
  EXPECT_EQ(Pread(*reader, 512u << 20, 4096), std::string(4096, '\0'));
  ASSERT_OK_AND_ASSIGN(auto zeros, store_->OpenFile("c", "container/rootfs-holes"));
  EXPECT_EQ(Pread(*zeros, (10u << 20) - 4096, 8192), std::string(4096, '\0'));
  reader.reset();
  zeros.reset();
  ExpectFsckClean();
}

// 4 GiB of zeros in a .tar.zst of about 140 KB, shared by the tests below.
class ZeroBombTest : public ContainerArchiveTest {
 protected:
  static void SetUpTestSuite() {
    if (!HaveTools()) return;
    dir_ = new TempDir("gpuckpt-zero-bomb");
    const std::string src = dir_->Sub("src");
    testing::MakeDirs(src + "/checkpoint");
    testing::WriteFile(src + "/checkpoint/pstree.img", "pstree");
    // A file of holes, read by tar (without --sparse) as 4 GiB of zeros:
    // nothing of it on disk.
    MakeSparseFile(src + "/checkpoint/pages-1.img", 4ull << 30, {});
    const std::string bomb = dir_->Sub("bomb.tar.zst");
    ASSERT_EQ(Shell("tar -cf - -C " + src + " checkpoint | zstd -q -3 -o " + bomb), 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Bomb() { return dir_->Sub("bomb.tar.zst"); }
  static TempDir* dir_;
};
TempDir* ZeroBombTest::dir_ = nullptr;

TEST_F(ZeroBombTest, RefusedByItsRatioAtOnce) {
  struct stat st {};
  ASSERT_EQ(stat(Bomb().c_str(), &st), 0);
  const auto start = Clock::now();
  auto imported = ImportArchive(Bomb(), "bomb", {});
  const double seconds = SecondsSince(start);
  std::printf("4 GiB of zeros in %lld bytes of .tar.zst refused in %.3f s\n",
              static_cast<long long>(st.st_size), seconds);
  EXPECT_CODE(imported, StatusCode::kInvalidArgument);
  if (!imported.ok()) {
    // Refused by what it had expanded so far, not after reading it all:
    // the message names the bytes of data it read.
    const std::string& message = imported.status().message();
    EXPECT_NE(message.find("expands more than 2000 times"), std::string::npos) << message;
    const size_t at = message.find(" bytes of data from");
    ASSERT_NE(at, std::string::npos) << message;
    const size_t from = message.rfind('(', at);
    ASSERT_NE(from, std::string::npos) << message;
    const uint64_t expanded = std::stoull(message.substr(from + 1, at - from - 1));
    EXPECT_LT(expanded, 1ull << 30) << message;
  }
  ASSERT_OK_AND_ASSIGN(auto list, store_->List());
  EXPECT_TRUE(list.empty());
}

TEST_F(ZeroBombTest, MemberBytesLimitRefusesEarly) {
  ContainerImportOptions options;
  options.max_expansion = 0;  // the ratio aside: the size alone
  options.max_member_bytes = 100u << 20;
  const auto start = Clock::now();
  auto imported = ImportArchive(Bomb(), "bomb", options);
  const double seconds = SecondsSince(start);
  std::printf("4 GiB archive refused at 100 MiB of members in %.3f s\n", seconds);
  EXPECT_CODE(imported, StatusCode::kNoSpace);
}

// --- cancellation --------------------------------------------------------

TEST_F(SparseImportTest, CancelStopsAStreamLongBeforeItsEnd) {
  SnapshotSpec spec;
  spec.name = "cancelled";
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec));
  std::atomic<bool> cancel{false};
  writer->SetCancel([&cancel] { return cancel.load(std::memory_order_relaxed); });
  // 64 GiB of incompressible bytes, made as they are read: no disk.
  const RandomStream stream(9);
  uint64_t given = 0;
  const uint64_t total = 64ull << 30;
  Clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancelled_at = Clock::now();
    cancel = true;
  });
  FileEntry e;
  e.path = "images/pages-1.img";
  Status added = writer->AddStream(e, [&](char* buf, size_t len) -> Result<size_t> {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(len, total - given));
    stream.Fill(given, buf, n);
    given += n;
    return n;
  });
  const auto returned = Clock::now();
  canceller.join();
  const double late = std::chrono::duration<double>(returned - cancelled_at).count();
  std::printf("cancelled after %llu MiB, returned %.3f s after the flag\n",
              static_cast<unsigned long long>(given >> 20), late);
  EXPECT_CODE(added, StatusCode::kCancelled);
  EXPECT_EQ(added.message(), "cancelled");
  // 64 GiB hashed and compressed would take a minute or more; a busy
  // sanitizer build still answers the flag within seconds.
  EXPECT_LT(late, 10.0);
  EXPECT_LT(given, total);
  // Later additions and the commit fail too; destroying it leaves nothing.
  FileEntry dir;
  dir.path = "d";
  dir.type = FileType::kDirectory;
  EXPECT_CODE(writer->AddEntry(dir), StatusCode::kCancelled);
  EXPECT_CODE(writer->Commit(), StatusCode::kCancelled);
  const auto destroy = Clock::now();
  writer.reset();
  EXPECT_LT(SecondsSince(destroy), 10.0);
  ASSERT_OK_AND_ASSIGN(auto list, store_->List());
  EXPECT_TRUE(list.empty());
}

TEST_F(SparseImportTest, CancelStopsADirectoryImportBetweenFiles) {
  const std::string src = scratch_.Sub("tree");
  testing::MakeDirs(src);
  for (int i = 0; i < 5; ++i) testing::WriteFile(src + "/f" + std::to_string(i), "x");
  UniqueFd dir(open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  SnapshotSpec spec;
  spec.name = "between";
  ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot(spec));
  int asked = 0;
  // Cancelled at the third time it is asked: while the first files are added.
  writer->SetCancel([&asked] { return ++asked > 2; });
  Status s = AddDirectoryToSnapshot(writer.get(), dir.get(), src, {});
  EXPECT_CODE(s, StatusCode::kCancelled);
  EXPECT_EQ(s.message(), "cancelled");
}

}  // namespace
}  // namespace gpuckpt
