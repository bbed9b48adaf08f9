// A store whose index (the RocksDB tables under db/) is damaged is never
// shown by a reader (StoreOptions::read_only: `gpuckpt ls`, `stats`,
// `export`, `fsck`) as an older, emptier or clean store: the open fails with
// kCorruption naming the damaged table, whether the damage keeps the table
// from opening (which the holder's own open refuses too) or lies in a data
// block no open reads. The command line then exits non-zero saying so.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/store/format.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

// A table of a closed store's index: its column family and its path.
struct Table {
  std::string family;
  std::string path;
  std::string name;  // "db/000012.sst", as messages name it
};

// The tables of the latest version of the closed store at `store_dir`,
// newest first, read with RocksDB's read-only mode (its info log goes to
// `log_dir`, not into the store).
std::vector<Table> TablesOf(const std::string& store_dir, const std::string& log_dir) {
  const std::string db_dir = store_dir + "/" + format::kDbDirName;
  rocksdb::DBOptions options;
  options.db_log_dir = log_dir;
  std::vector<std::string> names;
  EXPECT_TRUE(rocksdb::DB::ListColumnFamilies(options, db_dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, db_dir, families, &handles, &db);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return {};
  std::vector<rocksdb::LiveFileMetaData> live;
  db->GetLiveFilesMetaData(&live);
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  db->Close().PermitUncheckedError();
  delete db;
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a.file_number > b.file_number; });
  std::vector<Table> out;
  for (const auto& f : live) {
    out.push_back({f.column_family_name, f.db_path + f.name, format::kDbDirName + f.name});
  }
  return out;
}

// The newest table of `family`.
Table NewestOf(const std::vector<Table>& tables, const std::string& family) {
  for (const auto& t : tables) {
    if (t.family == family) return t;
  }
  ADD_FAILURE() << "no table of family " << family;
  return {};
}

// Inverts the byte at `offset` of `path` (counted from the end when
// negative).
void FlipByte(const std::string& path, off_t offset) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  if (offset < 0) offset += st.st_size;
  ASSERT_GE(offset, 0);
  ASSERT_LT(offset, st.st_size);
  unsigned char b = 0;
  ASSERT_EQ(pread(fd, &b, 1, offset), 1);
  b ^= 0xff;
  ASSERT_EQ(pwrite(fd, &b, 1, offset), 1);
  close(fd);
}

// A table's last block before its 53-byte footer is its metaindex: damage
// there keeps the table from opening. Its first bytes are a data block's,
// which only a read of that block (or a check of every block) notices.
constexpr off_t kMetaBlockByte = -60;
constexpr off_t kDataBlockByte = 10;

class DamagedIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeCheckpointTree(src_, 61, 1u << 20);
    auto holder = Store::Open(store_dir_, testing::TestOptions());
    ASSERT_TRUE(testing::IsOk(holder));
    // Two snapshots: every family has a table of each, so a reader that
    // fell back to a table's older version would still show something.
    ASSERT_OK(testing::Import(**holder, src_, "first"));
    ASSERT_OK(testing::Import(**holder, src_, "second"));
  }

  Result<std::unique_ptr<Store>> OpenReader(const std::string& dir) {
    StoreOptions o = testing::TestOptions();
    o.read_only = true;
    return Store::Open(dir, o);
  }

  // The reader's open fails with kCorruption, naming `table`.
  ::testing::AssertionResult RefusedNaming(const std::string& dir, const std::string& table) {
    auto reader = OpenReader(dir);
    if (reader.ok()) {
      auto list = (*reader)->List();
      return ::testing::AssertionFailure()
             << "the reader opened a store with " << table << " damaged and lists "
             << (list.ok() ? std::to_string(list->size()) + " snapshots"
                           : list.status().ToString());
    }
    if (reader.status().code() != StatusCode::kCorruption) {
      return ::testing::AssertionFailure() << "not kCorruption: " << reader.status().ToString();
    }
    if (reader.status().message().find(table) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "does not name " << table << ": " << reader.status().ToString();
    }
    return ::testing::AssertionSuccess();
  }

  std::vector<Table> Tables() { return TablesOf(store_dir_, tmp_.path()); }

  TempDir tmp_;
  const std::string src_ = tmp_.Sub("src");
  const std::string store_dir_ = tmp_.Sub("store");
};

TEST_F(DamagedIndexTest, ATableThatDoesNotOpenIsNotReadAsAnOlderIndex) {
  ASSERT_OK_AND_ASSIGN(auto healthy, OpenReader(store_dir_));
  ASSERT_OK_AND_ASSIGN(auto list, healthy->List());
  ASSERT_EQ(list.size(), 2u);
  healthy.reset();

  // RocksDB's secondary mode would take the table as missing and show the
  // snapshot records as they were before it: "first" alone.
  const Table snapshots = NewestOf(Tables(), format::kSnapshotsFamily);
  FlipByte(snapshots.path, kMetaBlockByte);
  EXPECT_TRUE(RefusedNaming(store_dir_, snapshots.name));
  // The holder's open refuses it as before.
  EXPECT_CODE(Store::Open(store_dir_, testing::TestOptions()), StatusCode::kCorruption);
}

TEST_F(DamagedIndexTest, ADamagedDataBlockIsFoundThoughNothingReadsIt) {
  // ls reads only the snapshot records; the extents' damage is found all the
  // same, by their family's name.
  const Table extents = NewestOf(Tables(), format::kExtentsFamily);
  FlipByte(extents.path, kDataBlockByte);
  EXPECT_TRUE(RefusedNaming(store_dir_, extents.name));
  auto reader = OpenReader(store_dir_);
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(reader.status().message().find("extent"), std::string::npos)
      << reader.status().ToString();
}

TEST_F(DamagedIndexTest, DamageInAnyTableIsFound) {
  const std::vector<Table> tables = Tables();
  ASSERT_GE(tables.size(), 6u);
  for (const Table& table : tables) {
    SCOPED_TRACE(table.name + " of " + table.family);
    const std::string copy = tmp_.Sub("copy-" + table.name.substr(3));
    std::filesystem::copy(store_dir_, copy, std::filesystem::copy_options::recursive);
    const std::string path = copy + "/" + table.name;
    const off_t size = static_cast<off_t>(std::filesystem::file_size(path));
    FlipByte(path, size / 4);
    FlipByte(path, size / 2);
    EXPECT_TRUE(RefusedNaming(copy, table.name));
  }
}

TEST_F(DamagedIndexTest, TheCommandLineSaysWhatIsDamagedAndNeverClean) {
  const std::vector<std::string> store = {"--store", store_dir_};
  auto cli = [&](std::vector<std::string> args, std::string* out, std::string* err) {
    args.insert(args.begin(), store.begin(), store.end());
    return testing::RunCli(args, out, err);
  };
  std::string out, err;
  ASSERT_EQ(cli({"ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("second"), std::string::npos) << out;
  ASSERT_EQ(cli({"fsck"}, &out, &err), 0) << out << err;

  // Three tables: one that does not open, two with damaged data blocks.
  const std::vector<Table> tables = Tables();
  FlipByte(NewestOf(tables, format::kSnapshotsFamily).path, kMetaBlockByte);
  FlipByte(NewestOf(tables, format::kExtentsFamily).path, kDataBlockByte);
  FlipByte(NewestOf(tables, format::kChunkMetaFamily).path, kDataBlockByte);

  for (const auto& args : std::vector<std::vector<std::string>>{
           {"ls"}, {"ls", "--json"}, {"stats"}, {"stats", "--json"}}) {
    SCOPED_TRACE(args[0] + (args.size() > 1 ? " " + args[1] : ""));
    EXPECT_EQ(cli(args, &out, &err), 1);
    EXPECT_EQ(out, "");
    EXPECT_NE(err.find("is damaged"), std::string::npos) << err;
    EXPECT_NE(err.find(".sst"), std::string::npos) << err;
  }
  EXPECT_EQ(cli({"fsck"}, &out, &err), 3);
  EXPECT_NE(out.find("is damaged"), std::string::npos) << out;
  EXPECT_EQ((out + err).find("clean"), std::string::npos) << out << err;
}

}  // namespace
}  // namespace gpuckpt
