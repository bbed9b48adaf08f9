// CRIU image parsing and the streamer protocol on malformed input: every
// damaged image is kCorruption (never a crash or a huge allocation), and a
// peer that speaks the streamer protocol badly gets an error, not a hang.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "core/criu/image_streamer.h"
#include "core/criu/images.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::Rng;
using ::gpuckpt::testing::TempDir;

std::string U32(uint32_t v) { return testing::ImageU32(v); }
std::string Varint(uint64_t v) { return testing::ProtoVarint(v); }
std::string VarintField(uint32_t field, uint64_t v) { return testing::ProtoVarintField(field, v); }
std::string BytesField(uint32_t field, const std::string& b) {
  return testing::ProtoBytesField(field, b);
}
std::string Image(uint32_t magic, const std::vector<std::string>& records) {
  return testing::CriuImageBytes(magic, records);
}

std::string PstreeEntry(uint32_t pid, std::vector<uint32_t> threads) {
  std::string e =
      VarintField(1, pid) + VarintField(2, 1) + VarintField(3, pid) + VarintField(4, pid);
  for (uint32_t t : threads) e += VarintField(5, t);
  return e;
}

std::string CredsEntry(uint32_t uid) {
  std::string c;
  for (uint32_t f = 1; f <= 8; ++f) c += VarintField(f, uid + f);
  std::string packed_caps = Varint(0xffffffff) + Varint(0x1ff);
  c += BytesField(10, packed_caps) + VarintField(13, 0) + VarintField(14, 27) + VarintField(19, 5);
  return c;
}

std::string CoreImage(const std::string& creds) {
  const std::string thread_core =
      VarintField(1, 0) + VarintField(2, 0) + BytesField(10, creds) + BytesField(13, "workload");
  return Image(kCriuCoreMagic, {VarintField(1, 1) + BytesField(5, thread_core)});
}

// Parsing `bytes` either works or reports corruption; anything else fails.
void ExpectOkOrCorruption(const std::string& bytes) {
  auto tasks = ParsePstreeImage(bytes);
  if (!tasks.ok()) {
    EXPECT_EQ(tasks.status().code(), StatusCode::kCorruption) << tasks.status().ToString();
  }
  auto creds = ParseCoreCreds(bytes);
  if (!creds.ok()) {
    EXPECT_TRUE(creds.status().code() == StatusCode::kCorruption ||
                creds.status().code() == StatusCode::kNotFound)
        << creds.status().ToString();
  }
}

TEST(CriuImagesTest, ParsesWellFormedImages) {
  auto tasks =
      ParsePstreeImage(Image(kCriuPstreeMagic, {PstreeEntry(42, {42, 43}), PstreeEntry(44, {44})}));
  ASSERT_TRUE(tasks.ok()) << tasks.status().ToString();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].pid, 42u);
  EXPECT_EQ((*tasks)[0].ppid, 1u);
  EXPECT_EQ((*tasks)[0].threads, (std::vector<uint32_t>{42, 43}));
  EXPECT_EQ((*tasks)[1].pid, 44u);

  auto creds = ParseCoreCreds(CoreImage(CredsEntry(1000)));
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  EXPECT_EQ(creds->uid, 1001u);
  EXPECT_EQ(creds->fsgid, 1008u);
  EXPECT_EQ(creds->cap_prm, (std::vector<uint32_t>{0xffffffff, 0x1ff}));
  EXPECT_EQ(creds->groups, (std::vector<uint32_t>{27}));
  EXPECT_EQ(creds->cap_amb, (std::vector<uint32_t>{5}));

  EXPECT_TRUE(LooksLikeCriuImage(U32(kCriuImgCommonMagic)));
  EXPECT_TRUE(LooksLikeCriuImage(U32(kCriuInventoryMagic) + "xx"));
  EXPECT_FALSE(LooksLikeCriuImage("abc"));
  EXPECT_FALSE(LooksLikeCriuImage(U32(0)));
}

TEST(CriuImagesTest, MalformedImagesAreCorruption) {
  const std::string pstree = Image(kCriuPstreeMagic, {PstreeEntry(42, {42, 43})});
  const std::string core = CoreImage(CredsEntry(0));
  for (size_t len = 0; len < pstree.size(); ++len) {
    EXPECT_EQ(ParsePstreeImage(pstree.substr(0, len)).status().code(), StatusCode::kCorruption)
        << "prefix " << len;
  }
  for (size_t len = 0; len < core.size(); ++len) ExpectOkOrCorruption(core.substr(0, len));
  // A huge length prefix, wrong magics, a varint that never ends.
  auto huge =
      ParsePstreeImage(U32(kCriuImgCommonMagic) + U32(kCriuPstreeMagic) + U32(0xfffffff0) + "abc");
  EXPECT_EQ(huge.status().code(), StatusCode::kCorruption);
  EXPECT_NE(huge.status().message().find("offset 8"), std::string::npos) << huge.status().message();
  EXPECT_EQ(ParsePstreeImage(U32(kCriuImgServiceMagic) + pstree.substr(4)).status().code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParseCoreCreds(pstree).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParsePstreeImage(Image(kCriuPstreeMagic, {std::string(11, '\xff')})).status().code(),
            StatusCode::kCorruption);
  // An embedded length larger than its parent; a missing required field;
  // a uint32 out of range; a group wire type.
  EXPECT_EQ(ParseCoreCreds(Image(kCriuCoreMagic, {Varint(5 << 3 | 2) + Varint(1000) + "x"}))
                .status()
                .code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParsePstreeImage(Image(kCriuPstreeMagic, {VarintField(1, 5)})).status().code(),
            StatusCode::kCorruption);
  EXPECT_EQ(
      ParsePstreeImage(Image(kCriuPstreeMagic, {PstreeEntry(42, {}) + VarintField(5, 1ull << 40)}))
          .status()
          .code(),
      StatusCode::kCorruption);
  EXPECT_EQ(ParsePstreeImage(Image(kCriuPstreeMagic, {PstreeEntry(42, {}) + Varint(6 << 3 | 3)}))
                .status()
                .code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParsePstreeImage(Image(kCriuPstreeMagic, {})).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseCoreCreds(Image(kCriuCoreMagic, {VarintField(1, 1)})).status().code(),
            StatusCode::kNotFound);
}

TEST(CriuImagesTest, RandomDamageNeverCrashes) {
  Rng rng(7);
  const std::string images[] = {Image(kCriuPstreeMagic, {PstreeEntry(42, {42, 43, 44})}),
                                CoreImage(CredsEntry(1000))};
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = images[i % 2];
    const int flips = static_cast<int>(rng.Uniform(1, 4));
    for (int f = 0; f < flips; ++f) {
      bytes[rng.Uniform(8, bytes.size() - 1)] = static_cast<char>(rng.Next());
    }
    ExpectOkOrCorruption(bytes);
  }
}

// A client that speaks the capture protocol as told, for bad requests.
void SendRaw(const std::string& socket_path, const std::string& bytes) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  strcpy(addr.sun_path, socket_path.c_str());
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
}

Status ServeRaw(const std::string& bytes) {
  TempDir dir("criu-proto");
  auto server = ImageCaptureServer::Listen(dir.path());
  if (!server.ok()) return server.status();
  std::thread client([&] { SendRaw((*server)->socket_path(), bytes); });
  Status status =
      (*server)->Serve([](const std::string&, int) { return Status::Ok(); }, -1, getpid());
  client.join();
  return status;
}

TEST(CriuStreamerProtocolTest, BadRequestsAreErrors) {
  EXPECT_OK(ServeRaw(""));  // connected and closed: an empty dump
  EXPECT_EQ(ServeRaw(U32(0xffffffff)).code(), StatusCode::kCorruption);
  EXPECT_EQ(ServeRaw(U32(3) + "\x0a\x05x").code(), StatusCode::kCorruption);
  const std::string dotdot = BytesField(1, "../../etc/passwd");
  EXPECT_EQ(ServeRaw(U32(static_cast<uint32_t>(dotdot.size())) + dotdot).code(),
            StatusCode::kInvalidArgument);
  const std::string ok = BytesField(1, "core-1.img");
  // A request without the pipe that must follow it.
  EXPECT_EQ(ServeRaw(U32(static_cast<uint32_t>(ok.size())) + ok + "x").code(),
            StatusCode::kIOError);
  EXPECT_FALSE(IsValidImageFileName(std::string(256, 'a')));
  EXPECT_FALSE(IsValidImageFileName(std::string("a\0b", 3)));
  EXPECT_TRUE(IsValidImageFileName("pages-1.img"));
}

// Another process that connects to the streamer socket before CRIU (a
// user's, whose socket it is for a user's dump) is closed unread: the
// server goes on waiting for CRIU's pid, and only CRIU's files are taken.
TEST(CriuStreamerProtocolTest, ConnectionFromAnotherProcessIsRefused) {
  TempDir dir("criu-peer");
  auto server = ImageCaptureServer::Listen(dir.path());
  ASSERT_OK(server.status());
  const std::string request = BytesField(1, "pages-1.img");
  int connected[2];
  ASSERT_EQ(pipe(connected), 0);
  const pid_t intruder = fork();
  ASSERT_GE(intruder, 0);
  if (intruder == 0) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, (*server)->socket_path().c_str());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(2);
    const std::string bytes = U32(static_cast<uint32_t>(request.size())) + request;
    if (write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) _exit(3);
    if (write(connected[1], "c", 1) != 1) _exit(4);
    char byte;
    _exit(read(fd, &byte, 1) <= 0 ? 0 : 5);  // closed unread: EOF or reset, no reply
  }
  close(connected[1]);
  char byte;
  ASSERT_EQ(read(connected[0], &byte, 1), 1);  // its connection is queued first
  close(connected[0]);
  std::thread criu([&] { SendRaw((*server)->socket_path(), ""); });
  int files = 0;
  Status status = (*server)->Serve(
      [&](const std::string&, int) {
        ++files;
        return Status::Ok();
      },
      -1, getpid());
  criu.join();
  int intruder_status = 0;
  ASSERT_EQ(waitpid(intruder, &intruder_status, 0), intruder);
  EXPECT_OK(status);
  EXPECT_EQ(files, 0);
  ASSERT_TRUE(WIFEXITED(intruder_status));
  EXPECT_EQ(WEXITSTATUS(intruder_status), 0);
}

// stats-dump, CRIU's account of a dump (a service image), from which the
// frozen time of a process without a GPU is reported.
std::string StatsImage(const std::string& dump_entry) {
  const std::string stats_entry = BytesField(1, dump_entry);
  return U32(kCriuImgServiceMagic) + U32(kCriuStatsMagic) + U32(stats_entry.size()) + stats_entry;
}

TEST(CriuImagesTest, ParsesDumpStats) {
  const std::string dump = VarintField(1, 1200) + VarintField(2, 915000) + VarintField(3, 700) +
                           VarintField(4, 800000) + VarintField(5, 262144) + VarintField(6, 0) +
                           VarintField(7, 200000) + VarintField(9, 0) + VarintField(12, 3);
  ASSERT_OK_AND_ASSIGN(CriuDumpStats stats, ParseDumpStatsImage(StatsImage(dump)));
  EXPECT_EQ(stats.freezing_us, 1200u);
  EXPECT_EQ(stats.frozen_us, 915000u);
  EXPECT_EQ(stats.memdump_us, 700u);
  EXPECT_EQ(stats.memwrite_us, 800000u);
  EXPECT_EQ(stats.pages_scanned, 262144u);
  EXPECT_EQ(stats.pages_written, 200000u);
}

TEST(CriuImagesTest, MalformedDumpStatsAreCorruption) {
  const std::string good = VarintField(1, 1) + VarintField(2, 2);
  for (const std::string& bad : {
           std::string(), Image(kCriuStatsMagic, {BytesField(1, good)}),      // common head magic
           U32(kCriuImgServiceMagic) + U32(kCriuCoreMagic),                   // another image
           StatsImage(VarintField(1, 1)),                                     // no frozen time
           U32(kCriuImgServiceMagic) + U32(kCriuStatsMagic),                  // no entry
           U32(kCriuImgServiceMagic) + U32(kCriuStatsMagic) + U32(99) + "x",  // truncated
           StatsImage(VarintField(1, 1) + BytesField(2, "xy")),               // wrong wire type
       }) {
    EXPECT_CODE(ParseDumpStatsImage(bad), StatusCode::kCorruption);
  }
}

}  // namespace
}  // namespace gpuckpt
