// Helpers shared by the gpuckpt unit tests: temporary directories,
// deterministic data, tree comparison, running the CLI, and reaching into a
// closed store's RocksDB to damage it on purpose.
//
// Everything here is for tests only; helpers that can fail return a
// ::testing::AssertionResult (or a Status) so a failure names what differed.
#ifndef GPUCKPT_TESTS_UNIT_TEST_UTIL_H_
#define GPUCKPT_TESTS_UNIT_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpuckpt/status.h"
#include "gpuckpt/store.h"

// Status / Result assertions that print the status on failure.
#define GPUCKPT_TEST_CONCAT_INNER_(a, b) a##b
#define GPUCKPT_TEST_CONCAT_(a, b) GPUCKPT_TEST_CONCAT_INNER_(a, b)
#define ASSERT_OK(expr) ASSERT_TRUE(::gpuckpt::testing::IsOk(expr))
#define EXPECT_OK(expr) EXPECT_TRUE(::gpuckpt::testing::IsOk(expr))
#define EXPECT_CODE(expr, code) EXPECT_TRUE(::gpuckpt::testing::HasCode((expr), (code)))
#define ASSERT_CODE(expr, code) ASSERT_TRUE(::gpuckpt::testing::HasCode((expr), (code)))
// `lhs = value of expr` (a Result<T>), or fails the test with its status.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(GPUCKPT_TEST_CONCAT_(test_result_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  ASSERT_TRUE(::gpuckpt::testing::IsOk(tmp));      \
  lhs = std::move(tmp).value()

namespace gpuckpt::testing {

// Whether this binary is built with AddressSanitizer (GCC defines
// __SANITIZE_ADDRESS__, clang answers __has_feature): tests whose many
// repetitions are several times slower there may repeat less.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

::testing::AssertionResult IsOk(const Status& s);
template <typename T>
::testing::AssertionResult IsOk(const Result<T>& r) {
  return IsOk(r.status());
}
::testing::AssertionResult HasCode(const Status& s, StatusCode code);
template <typename T>
::testing::AssertionResult HasCode(const Result<T>& r, StatusCode code) {
  if (r.ok())
    return ::testing::AssertionFailure() << "expected " << StatusCodeName(code) << ", got OK";
  return HasCode(r.status(), code);
}

// A fresh directory under $TMPDIR (or /var/tmp, which is disk, not tmpfs),
// removed with everything in it when the object goes. Mode 0755, so that a
// test may hand parts of it to another user.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "gpuckpt-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Removes a tree, making unreadable directories readable first.
void RemoveTree(const std::string& path);

// A deterministic byte stream of any length with random access: byte i
// depends only on (seed, i), so a test can regenerate any range of a file it
// never kept. About 2 GB/s per core.
class RandomStream {
 public:
  explicit RandomStream(uint64_t seed) : seed_(seed) {}
  void Fill(uint64_t offset, void* buf, size_t len) const;
  std::string Bytes(uint64_t offset, size_t len) const;

 private:
  uint64_t seed_;
};

// splitmix64: small, fast, good enough to pick offsets and seeds.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [lo, hi].
  uint64_t Uniform(uint64_t lo, uint64_t hi) { return lo + Next() % (hi - lo + 1); }

 private:
  uint64_t state_;
};

std::string RandomBytes(size_t len, uint64_t seed);
// Incompressible data, `size` bytes of RandomStream(seed).
void WriteRandomFile(const std::string& path, uint64_t size, uint64_t seed, mode_t mode = 0644);
void WriteFile(const std::string& path, const std::string& data, mode_t mode = 0644);
// Adds `entry` with `bytes` as its contents to `writer` (through a memfd:
// no file is left behind).
Status AddBytes(SnapshotWriter* writer, const FileEntry& entry, const std::string& bytes);
std::string ReadFile(const std::string& path);
// The whole of a stored file, read through `reader` in 128 KiB preads (a
// FUSE read's size, so that many lookups and chunk batches run); a failed
// read is a test failure (ADD_FAILURE) and returns what was read before it.
std::string ReadAll(FileReader& reader);
// The whole of file `path` of snapshot `id`; a failure to open it fails the
// test (and gives "").
std::string ReadAll(Store& store, const std::string& id, const std::string& path);
void MakeDirs(const std::string& path, mode_t mode = 0755);

// A file whose bytes match RandomStream(seed) from offset 0 for `size` bytes,
// read in blocks.
::testing::AssertionResult FileMatchesStream(const std::string& path, const RandomStream& stream,
                                             uint64_t size);

// Compares two trees: the same names, types, permission bits, symlink
// targets, file contents (streamed) and file mtimes. The roots themselves are
// not compared.
::testing::AssertionResult TreesEqual(const std::string& expected, const std::string& actual);

// A checkpoint-like tree of several files for seed `seed`: random and
// compressible files, a page image with zero pages, small files, an empty
// file, a subdirectory and a symlink. About `approx_bytes` in total.
void MakeCheckpointTree(const std::string& dir, uint64_t seed, uint64_t approx_bytes);

// Imports `src` as snapshot `name`, expecting success.
Result<SnapshotInfo> Import(Store& store, const std::string& src, const std::string& name);

// A thread that writes `size` bytes of `stream` into pipe end `fd` in
// writes of `write_size` bytes (the last shorter), then closes `fd`.
std::thread FeedPipe(int fd, const RandomStream& stream, uint64_t size, size_t write_size);

// Writes the regular files at the top of `src` (in name order, with their
// modes, owners and times) as snapshot `name` through a writer told to
// spool as `spool` says, `base` its base; returns what Commit() returns.
Result<SnapshotInfo> WriteFlatTree(Store& store, const std::string& src, const std::string& name,
                                   SnapshotWriterOptions::Spool spool,
                                   const std::string& base = "");

// Exports `id` into a fresh directory under `scratch` and compares it with
// `src`; the export is removed afterwards.
::testing::AssertionResult ExportMatches(Store& store, const std::string& id,
                                         const std::string& src, const std::string& scratch);

// Bytes of a CRIU image built by hand, as CRIU writes them: u32s in host
// byte order, protobuf fields, and the image framing (head magic, type
// magic, length-prefixed records).
std::string ImageU32(uint32_t v);
std::string ProtoVarint(uint64_t v);
std::string ProtoVarintField(uint32_t field, uint64_t v);
std::string ProtoBytesField(uint32_t field, const std::string& bytes);
std::string CriuImageBytes(uint32_t type_magic, const std::vector<std::string>& records);

// Options for tests: two workers (the CI machine's cores), the rest default.
StoreOptions TestOptions();

// Runs the gpuckpt CLI (the binary built with the tests) with `args`;
// returns its exit status (or 128+signal), with its output in *out / *err
// when those are not null.
int RunCli(const std::vector<std::string>& args, std::string* out = nullptr,
           std::string* err = nullptr);
std::string CliPath();

// The chunk records of a closed store, in key order: the RocksDB key, the
// hash the record carries (hex), codec byte and record size. Opens the
// store's RocksDB directly.
struct StoredChunk {
  std::string key;
  std::string hash_hex;
  uint8_t codec = 0;
  size_t record_size = 0;
};
Result<std::vector<StoredChunk>> ListStoredChunks(const std::string& store_dir);

// Flips one byte in the payload of chunk `hash_hex` of the closed store at
// `store_dir` (the store must not be open).
Status FlipChunkByte(const std::string& store_dir, const std::string& hash_hex,
                     size_t payload_offset);

// Deletes the data record (not the meta record) of chunk `hash_hex` of the
// closed store at `store_dir`: a chunk lost by damage.
Status DeleteChunkData(const std::string& store_dir, const std::string& hash_hex);

// Swaps the records stored under two chunk keys (from ListStoredChunks):
// each record intact, but under the wrong key.
Status SwapChunkRecords(const std::string& store_dir, const std::string& key_a,
                        const std::string& key_b);

// Replaces every file record of the closed store at `store_dir` with what
// `edit` makes of it (the record's value, version byte included).
Status EditFileRecords(const std::string& store_dir,
                       const std::function<std::string(const std::string& record)>& edit);

// Turns the closed store at `store_dir` into one as version 1 wrote it:
// every chunk record moved from its pack into the chunks family, the packs
// deleted, store_version "1".
Status MakeVersion1Store(const std::string& store_dir);

// The store_version record of the closed store at `store_dir`.
Result<std::string> StoredVersion(const std::string& store_dir);

// Paths (relative) of all entries under `dir`, sorted, e.g. to check that a
// failed export left nothing behind.
std::vector<std::string> ListDir(const std::string& dir);

}  // namespace gpuckpt::testing

#endif  // GPUCKPT_TESTS_UNIT_TEST_UTIL_H_
