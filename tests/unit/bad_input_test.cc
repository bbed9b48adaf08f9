// Bad input gives a clear error of the right code and loses nothing already
// stored: after every failure the earlier snapshot still exports
// byte-identical, no new snapshot is visible, and fsck is clean.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

// chown -R, without following symlinks.
void ChownTree(const std::string& path, uid_t uid, gid_t gid) {
  ASSERT_EQ(lchown(path.c_str(), uid, gid), 0) << path;
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  if (!S_ISDIR(st.st_mode)) return;
  DIR* d = opendir(path.c_str());
  ASSERT_NE(d, nullptr);
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  for (const auto& name : names) ChownTree(path + "/" + name, uid, gid);
}

using testing::ExportMatches;
using testing::Import;
using testing::TempDir;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeCheckpointTree(good_src_, 11, 3u << 20);
    Reopen();
    ASSERT_NE(store_, nullptr);
    ASSERT_OK(Import(*store_, good_src_, "good"));
  }
  void Reopen() {
    store_.reset();
    auto s = Store::Open(store_dir_, testing::TestOptions());
    ASSERT_OK(s);
    store_ = std::move(s).value();
  }
  // What every failed operation must leave: the good snapshot intact and
  // nothing else visible.
  void ExpectNothingLost() {
    ASSERT_NE(store_, nullptr);
    auto list = store_->List();
    ASSERT_OK(list);
    ASSERT_EQ(list->size(), 1u) << "a failed operation left a snapshot visible";
    EXPECT_EQ((*list)[0].id, "good");
    EXPECT_TRUE(ExportMatches(*store_, "good", good_src_, tmp_.path()));
    auto fsck = store_->Fsck();
    ASSERT_OK(fsck);
    EXPECT_TRUE(fsck->clean()) << fsck->problems[0];
  }

  TempDir tmp_;
  const std::string store_dir_ = tmp_.Sub("store");
  const std::string good_src_ = tmp_.Sub("good");
  std::unique_ptr<Store> store_;
};

TEST_F(BadInputTest, MissingSourceDirectoryIsNotFound) {
  auto r = Import(*store_, tmp_.Sub("does-not-exist"), "x");
  EXPECT_CODE(r, StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("does-not-exist"), std::string::npos)
      << r.status().ToString();
  ExpectNothingLost();
}

TEST_F(BadInputTest, SourceThatIsAFileIsInvalidArgument) {
  testing::WriteFile(tmp_.Sub("plain"), "not a directory");
  auto r = Import(*store_, tmp_.Sub("plain"), "x");
  EXPECT_CODE(r, StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("plain"), std::string::npos) << r.status().ToString();
  ExpectNothingLost();
}

TEST_F(BadInputTest, SpecialFileInTheSourceIsInvalidArgument) {
  const std::string src = tmp_.Sub("fifo-src");
  testing::MakeDirs(src);
  testing::WriteRandomFile(src + "/a.bin", 1u << 20, 1);
  ASSERT_EQ(mkfifo((src + "/z.fifo").c_str(), 0600), 0);
  auto r = Import(*store_, src, "x");
  EXPECT_CODE(r, StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("z.fifo"), std::string::npos) << r.status().ToString();
  ExpectNothingLost();
}

TEST_F(BadInputTest, UnreadableSourceFileIsPermissionDenied) {
  const std::string src = tmp_.Sub("locked-src");
  testing::MakeDirs(src);
  testing::WriteRandomFile(src + "/a-readable.bin", 1u << 20, 2);
  testing::WriteRandomFile(src + "/b-locked.bin", 1u << 20, 3, 0000);
  testing::WriteRandomFile(src + "/c-after.bin", 1u << 20, 4);

  if (geteuid() != 0) {
    // chmod 000 holds for us.
    auto r = Import(*store_, src, "x");
    EXPECT_CODE(r, StatusCode::kPermissionDenied);
    EXPECT_NE(r.status().message().find("b-locked.bin"), std::string::npos)
        << r.status().ToString();
    ExpectNothingLost();
    return;
  }
  // Root reads anything: run the import as nobody (uid 65534), through the
  // CLI in a child, on the store handed to that user for the occasion.
  store_.reset();
  constexpr uid_t kNobody = 65534;
  ASSERT_NO_FATAL_FAILURE(ChownTree(store_dir_, kNobody, kNobody));
  std::string stderr_text;
  {
    TempDir io("gpuckpt-io");
    const std::string err_path = io.Sub("err");
    const std::string cli = testing::CliPath();  // a copy that anybody may execute
    const char* argv[] = {
        cli.c_str(), "--store", store_dir_.c_str(), "import", src.c_str(), "--name", "x", nullptr};
    const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(err_fd, 0);
    const pid_t pid = fork();
    if (pid == 0) {
      // Async-signal-safe calls only until exec.
      dup2(err_fd, 2);
      const int null_fd = open("/dev/null", O_WRONLY);
      dup2(null_fd, 1);
      if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(100);
      execv(argv[0], const_cast<char**>(argv));
      _exit(127);
    }
    close(err_fd);
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    stderr_text = testing::ReadFile(err_path);
    ASSERT_TRUE(WIFEXITED(status)) << stderr_text;
    ASSERT_NE(WEXITSTATUS(status), 100) << "could not drop privileges";
    EXPECT_EQ(WEXITSTATUS(status), 1) << stderr_text;
  }
  // In words, as errno says it, not the status's name.
  EXPECT_NE(stderr_text.find("Permission denied"), std::string::npos) << stderr_text;
  EXPECT_EQ(stderr_text.find("PermissionDenied"), std::string::npos) << stderr_text;
  EXPECT_NE(stderr_text.find("b-locked.bin"), std::string::npos) << stderr_text;
  Reopen();
  ExpectNothingLost();
}

TEST_F(BadInputTest, FileGrowingDuringImportIsAborted) {
  const std::string src = tmp_.Sub("growing-src");
  testing::MakeDirs(src);
  testing::WriteRandomFile(src + "/a.bin", 4u << 20, 5);
  testing::WriteRandomFile(src + "/log.bin", 32u << 20, 6);
  testing::WriteRandomFile(src + "/z.bin", 4u << 20, 7);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> appends{0};
  const int fd = open((src + "/log.bin").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::thread appender([&] {
    while (!stop.load()) {
      if (write(fd, "more\n", 5) == 5) ++appends;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    close(fd);
  });
  while (appends.load() == 0) std::this_thread::yield();
  auto r = Import(*store_, src, "x");
  stop = true;
  appender.join();
  ASSERT_GT(appends.load(), 0u);
  EXPECT_CODE(r, StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("log.bin"), std::string::npos) << r.status().ToString();
  ExpectNothingLost();
  // Once the file holds still, the same tree imports.
  ASSERT_OK(Import(*store_, src, "x"));
  EXPECT_TRUE(ExportMatches(*store_, "x", src, tmp_.path()));
}

TEST_F(BadInputTest, UnknownSnapshotIsNotFound) {
  const std::string dest = tmp_.Sub("dest");
  EXPECT_CODE(store_->Export("nope", dest), StatusCode::kNotFound);
  EXPECT_NE(access(dest.c_str(), F_OK), 0) << "failed export created its destination";
  EXPECT_CODE(store_->Remove("nope"), StatusCode::kNotFound);
  EXPECT_CODE(store_->OpenFile("nope", "sub/small.txt"), StatusCode::kNotFound);
  EXPECT_CODE(store_->Get("nope"), StatusCode::kNotFound);
  EXPECT_CODE(store_->ListFiles("nope"), StatusCode::kNotFound);
  // Ids that could never exist are not found either (not an error of
  // another kind): a user typing a path is told plainly.
  EXPECT_CODE(store_->Get("../good"), StatusCode::kNotFound);
  EXPECT_CODE(store_->Remove(""), StatusCode::kNotFound);
  // A missing file in an existing snapshot.
  EXPECT_CODE(store_->OpenFile("good", "sub/missing.txt"), StatusCode::kNotFound);
  EXPECT_CODE(store_->OpenFile("good", "sub"), StatusCode::kInvalidArgument);
  ExpectNothingLost();
}

TEST_F(BadInputTest, InvalidSnapshotNameIsInvalidArgument) {
  for (const std::string& name :
       {std::string(".hidden"), std::string("-rf"), std::string("a/b"), std::string("a b"),
        std::string(".."), std::string("caf\xc3\xa9"), std::string(129, 'n'), std::string("x\n")}) {
    EXPECT_CODE(Import(*store_, good_src_, name), StatusCode::kInvalidArgument)
        << "'" << name << "'";
    SnapshotSpec spec;
    spec.name = name;
    EXPECT_CODE(store_->BeginSnapshot(spec), StatusCode::kInvalidArgument) << "'" << name << "'";
  }
  // The longest valid name, for contrast.
  ASSERT_OK(Import(*store_, good_src_, std::string(128, 'n')));
  ASSERT_OK(store_->Remove(std::string(128, 'n')));
  SnapshotSpec spec;
  spec.name = "extra";
  spec.extra_json = "[1, 2]";
  EXPECT_CODE(store_->BeginSnapshot(spec), StatusCode::kInvalidArgument)
      << "extra must be an object";
  ExpectNothingLost();
}

TEST_F(BadInputTest, DuplicateSnapshotNameIsAlreadyExists) {
  const std::string other = tmp_.Sub("other");
  testing::MakeCheckpointTree(other, 12, 1u << 20);
  auto r = Import(*store_, other, "good");
  EXPECT_CODE(r, StatusCode::kAlreadyExists);
  ExpectNothingLost();

  // Two writers racing for one name: the second is refused at once.
  SnapshotSpec spec;
  spec.name = "contested";
  ASSERT_OK_AND_ASSIGN(auto first, store_->BeginSnapshot(spec));
  EXPECT_CODE(store_->BeginSnapshot(spec), StatusCode::kAlreadyExists);
  first.reset();
  ExpectNothingLost();
}

TEST_F(BadInputTest, ExportToANonEmptyDirectoryIsAlreadyExistsAndLeavesItAlone) {
  const std::string parent = tmp_.Sub("exports");
  const std::string dest = parent + "/dest";
  testing::MakeDirs(dest);
  testing::WriteFile(dest + "/precious.txt", "do not touch");
  const auto before = testing::ListDir(parent);
  EXPECT_CODE(store_->Export("good", dest), StatusCode::kAlreadyExists);
  EXPECT_EQ(testing::ListDir(parent), before) << "the directory or its parent changed";
  EXPECT_EQ(testing::ReadFile(dest + "/precious.txt"), "do not touch");

  // A file in the way is refused the same way.
  testing::WriteFile(parent + "/file", "x");
  EXPECT_CODE(store_->Export("good", parent + "/file"), StatusCode::kAlreadyExists);
  EXPECT_EQ(testing::ReadFile(parent + "/file"), "x");

  // An existing empty directory is fine.
  testing::MakeDirs(parent + "/empty");
  ASSERT_OK(store_->Export("good", parent + "/empty"));
  EXPECT_TRUE(testing::TreesEqual(good_src_, parent + "/empty"));
  ExpectNothingLost();
}

TEST_F(BadInputTest, ImportOverlappingTheStoreIsInvalidArgument) {
  // The store itself, a directory holding it (tmp_ holds the store and the
  // good tree), and a symlink to the store.
  ASSERT_EQ(symlink(store_dir_.c_str(), tmp_.Sub("store-link").c_str()), 0);
  for (const std::string& src :
       {store_dir_, tmp_.path(), tmp_.Sub("store-link"), store_dir_ + "/db"}) {
    auto r = Import(*store_, src, "x");
    EXPECT_CODE(r, StatusCode::kInvalidArgument) << src;
  }
  ExpectNothingLost();
  // A sibling whose name merely starts with the store's is no overlap.
  const std::string sibling = store_dir_ + "2";
  testing::MakeDirs(sibling);
  testing::WriteFile(sibling + "/f", "sibling");
  ASSERT_OK(Import(*store_, sibling, "sibling"));
  EXPECT_TRUE(ExportMatches(*store_, "sibling", sibling, tmp_.path()));
  ASSERT_OK(store_->Remove("sibling"));
  ExpectNothingLost();
}

TEST_F(BadInputTest, ExportIntoTheStoreIsInvalidArgument) {
  EXPECT_CODE(store_->Export("good", store_dir_ + "/out"), StatusCode::kInvalidArgument);
  EXPECT_CODE(store_->Export("good", store_dir_ + "/db/out"), StatusCode::kInvalidArgument);
  EXPECT_NE(access((store_dir_ + "/out").c_str(), F_OK), 0);
  ExpectNothingLost();
}

TEST_F(BadInputTest, StoreDirectoryProblemsAreClear) {
  store_.reset();
  StoreOptions o = testing::TestOptions();
  // Somebody's unrelated directory is not turned into a store.
  const std::string unrelated = tmp_.Sub("unrelated");
  testing::MakeDirs(unrelated);
  testing::WriteFile(unrelated + "/notes.txt", "mine");
  EXPECT_CODE(Store::Open(unrelated, o), StatusCode::kInvalidArgument);
  EXPECT_EQ(testing::ListDir(unrelated), std::vector<std::string>{"notes.txt"});
  // A file is not a store.
  EXPECT_CODE(Store::Open(unrelated + "/notes.txt", o), StatusCode::kInvalidArgument);
  // Not created unless asked.
  o.create_if_missing = false;
  EXPECT_CODE(Store::Open(tmp_.Sub("absent"), o), StatusCode::kNotFound);
  EXPECT_NE(access(tmp_.Sub("absent").c_str(), F_OK), 0);
  EXPECT_CODE(Store::Open("", o), StatusCode::kInvalidArgument);
  Reopen();
  ExpectNothingLost();
}

}  // namespace
}  // namespace gpuckpt
