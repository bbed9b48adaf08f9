#include "tests/unit/test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "core/base/unique_fd.h"
#include "core/store/chunk_codec.h"
#include "core/store/chunk_packs.h"
#include "core/store/format.h"

namespace gpuckpt::testing {
namespace {

constexpr size_t kBlock = 1u << 20;

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

std::vector<std::string> SortedNames(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

int FullWrite(int fd, const char* data, size_t len) {
  while (len > 0) {
    const ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
  return 0;
}

// Reads up to `len` bytes, short only at EOF.
ssize_t FullRead(int fd, char* data, size_t len) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = read(fd, data + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

::testing::AssertionResult CompareFiles(const std::string& a, const std::string& b) {
  const int fa = open(a.c_str(), O_RDONLY | O_CLOEXEC);
  const int fb = open(b.c_str(), O_RDONLY | O_CLOEXEC);
  struct Closer {
    int a, b;
    ~Closer() {
      if (a >= 0) close(a);
      if (b >= 0) close(b);
    }
  } closer{fa, fb};
  if (fa < 0 || fb < 0) {
    return ::testing::AssertionFailure()
           << "cannot open " << (fa < 0 ? a : b) << ": " << std::strerror(errno);
  }
  std::vector<char> ba(kBlock), bb(kBlock);
  uint64_t offset = 0;
  for (;;) {
    const ssize_t na = FullRead(fa, ba.data(), ba.size());
    const ssize_t nb = FullRead(fb, bb.data(), bb.size());
    if (na < 0 || nb < 0) return ::testing::AssertionFailure() << "read error comparing " << b;
    const size_t n = static_cast<size_t>(std::min(na, nb));
    if (std::memcmp(ba.data(), bb.data(), n) != 0) {
      size_t i = 0;
      while (ba[i] == bb[i]) ++i;
      return ::testing::AssertionFailure()
             << b << " differs from " << a << " at offset " << offset + i;
    }
    if (na != nb) {
      return ::testing::AssertionFailure() << b << " and " << a << " differ in length (first "
                                           << (na < nb ? a : b) << " ends at " << offset + n << ")";
    }
    if (na == 0) return ::testing::AssertionSuccess();
    offset += n;
  }
}

::testing::AssertionResult CompareTrees(const std::string& exp_root, const std::string& act_root,
                                        const std::string& rel) {
  const std::string exp_dir = rel.empty() ? exp_root : exp_root + "/" + rel;
  const std::string act_dir = rel.empty() ? act_root : act_root + "/" + rel;
  const auto exp_names = SortedNames(exp_dir);
  const auto act_names = SortedNames(act_dir);
  if (exp_names != act_names) {
    std::string e, a;
    for (const auto& n : exp_names) e += " " + n;
    for (const auto& n : act_names) a += " " + n;
    return ::testing::AssertionFailure()
           << "directory '" << rel << "': expected [" << e << " ], got [" << a << " ]";
  }
  for (const auto& name : exp_names) {
    const std::string path = Join(rel, name);
    const std::string ep = exp_root + "/" + path;
    const std::string ap = act_root + "/" + path;
    struct stat es {
    }, as{};
    if (lstat(ep.c_str(), &es) != 0 || lstat(ap.c_str(), &as) != 0) {
      return ::testing::AssertionFailure() << "cannot stat '" << path << "'";
    }
    if ((es.st_mode & S_IFMT) != (as.st_mode & S_IFMT)) {
      return ::testing::AssertionFailure()
             << "'" << path << "' has type " << std::oct << (as.st_mode & S_IFMT) << ", expected "
             << (es.st_mode & S_IFMT);
    }
    if (!S_ISLNK(es.st_mode) && (es.st_mode & 07777) != (as.st_mode & 07777)) {
      return ::testing::AssertionFailure()
             << "'" << path << "' has mode " << std::oct << (as.st_mode & 07777) << ", expected "
             << (es.st_mode & 07777);
    }
    if (S_ISLNK(es.st_mode)) {
      char et[4096], at[4096];
      const ssize_t en = readlink(ep.c_str(), et, sizeof(et));
      const ssize_t an = readlink(ap.c_str(), at, sizeof(at));
      if (en < 0 || an < 0 ||
          std::string(et, static_cast<size_t>(en)) != std::string(at, static_cast<size_t>(an))) {
        return ::testing::AssertionFailure() << "symlink '" << path << "' target differs";
      }
      continue;
    }
    const int64_t emt = int64_t{es.st_mtim.tv_sec} * 1000000000 + es.st_mtim.tv_nsec;
    const int64_t amt = int64_t{as.st_mtim.tv_sec} * 1000000000 + as.st_mtim.tv_nsec;
    if (emt != amt) {
      return ::testing::AssertionFailure()
             << "'" << path << "' has mtime " << amt << " ns, expected " << emt;
    }
    if (S_ISDIR(es.st_mode)) {
      auto r = CompareTrees(exp_root, act_root, path);
      if (!r) return r;
    } else if (S_ISREG(es.st_mode)) {
      if (es.st_size != as.st_size) {
        return ::testing::AssertionFailure()
               << "'" << path << "' is " << as.st_size << " bytes, expected " << es.st_size;
      }
      auto r = CompareFiles(ep, ap);
      if (!r) return r;
    }
  }
  return ::testing::AssertionSuccess();
}

void ListDirInto(const std::string& root, const std::string& rel, std::vector<std::string>* out) {
  for (const auto& name : SortedNames(rel.empty() ? root : root + "/" + rel)) {
    const std::string path = Join(rel, name);
    out->push_back(path);
    struct stat st {};
    if (lstat((root + "/" + path).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      ListDirInto(root, path, out);
    }
  }
}

std::vector<rocksdb::ColumnFamilyDescriptor> AllFamilies() {
  rocksdb::ColumnFamilyOptions chunks;
  chunks.enable_blob_files = true;  // as the store writes them
  chunks.min_blob_size = 2048;
  return {
      {format::kMetaFamily, rocksdb::ColumnFamilyOptions()},
      {format::kChunksFamily, chunks},
      {format::kChunkMetaFamily, rocksdb::ColumnFamilyOptions()},
      {format::kSnapshotsFamily, rocksdb::ColumnFamilyOptions()},
      {format::kFilesFamily, rocksdb::ColumnFamilyOptions()},
      {format::kExtentsFamily, rocksdb::ColumnFamilyOptions()},
  };
}

// A RocksDB opened directly, closed (and its handles freed) on destruction.
struct RawDb {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  ~RawDb() {
    if (!db) return;
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    db->Close().PermitUncheckedError();
  }
};

Status OpenRaw(const std::string& store_dir, RawDb* raw) {
  rocksdb::DBOptions o;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(o, store_dir + "/" + format::kDbDirName, AllFamilies(), &raw->handles, &db);
  if (!s.ok()) return Status::IOError("opening the RocksDB of " + store_dir + ": " + s.ToString());
  raw->db.reset(db);
  return Status::Ok();
}

std::string HexOf(std::string_view bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

// The parts of a chunk record (see core/store/chunk_codec.h):
// version codec raw_length:varint hash:32 payload.
struct RecordParts {
  uint8_t codec = 0xff;
  std::string hash_hex;
  size_t payload_offset = 0;  // where the payload starts in the record
  bool ok = false;
};

RecordParts ParseRecord(std::string_view record) {
  RecordParts p;
  if (record.size() < 3) return p;
  p.codec = static_cast<uint8_t>(record[1]);
  std::string_view rest = record.substr(2);
  uint64_t raw_len = 0;
  if (!GetVarint64(&rest, &raw_len) || rest.size() < format::kChunkHashSize) return p;
  p.hash_hex = HexOf(rest.substr(0, format::kChunkHashSize));
  p.payload_offset = record.size() - rest.size() + format::kChunkHashSize;
  p.ok = true;
  return p;
}

}  // namespace

::testing::AssertionResult IsOk(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s.ToString();
}

::testing::AssertionResult HasCode(const Status& s, StatusCode code) {
  if (s.code() == code) return ::testing::AssertionSuccess() << s.ToString();
  return ::testing::AssertionFailure()
         << "expected " << StatusCodeName(code) << ", got " << s.ToString();
}

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string templ =
      std::string(base != nullptr && *base != '\0' ? base : "/var/tmp") + "/" + prefix + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << ": " << std::strerror(errno);
    std::abort();
  }
  chmod(templ.c_str(), 0755);
  path_ = templ;
}

TempDir::~TempDir() { RemoveTree(path_); }

void RemoveTree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    chmod(path.c_str(), 0700);
    for (const auto& name : SortedNames(path)) RemoveTree(path + "/" + name);
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

void RandomStream::Fill(uint64_t offset, void* buf, size_t len) const {
  auto* out = static_cast<unsigned char*>(buf);
  const uint64_t key = seed_ * 0xd1b54a32d192ed03ull + 0x9e3779b97f4a7c15ull;
  // Unaligned head.
  while (len > 0 && offset % 8 != 0) {
    const uint64_t w = Mix(key + (offset / 8) * 0x9e3779b97f4a7c15ull);
    *out++ = static_cast<unsigned char>(w >> (8 * (offset % 8)));
    ++offset;
    --len;
  }
  uint64_t word = offset / 8;
  while (len >= 8) {
    const uint64_t w = Mix(key + word * 0x9e3779b97f4a7c15ull);
    std::memcpy(out, &w, 8);  // little-endian: byte j of w is at offset 8*word+j
    out += 8;
    len -= 8;
    ++word;
  }
  if (len > 0) {
    const uint64_t w = Mix(key + word * 0x9e3779b97f4a7c15ull);
    for (size_t j = 0; j < len; ++j) out[j] = static_cast<unsigned char>(w >> (8 * j));
  }
}

std::string RandomStream::Bytes(uint64_t offset, size_t len) const {
  std::string s(len, '\0');
  Fill(offset, s.data(), len);
  return s;
}

uint64_t Rng::Next() {
  state_ += 0x9e3779b97f4a7c15ull;
  return Mix(state_);
}

std::string RandomBytes(size_t len, uint64_t seed) { return RandomStream(seed).Bytes(0, len); }

void WriteRandomFile(const std::string& path, uint64_t size, uint64_t seed, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  RandomStream stream(seed);
  std::vector<char> buf(kBlock);
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    stream.Fill(off, buf.data(), n);
    if (FullWrite(fd, buf.data(), n) != 0) {
      close(fd);
      FAIL() << "writing " << path << ": " << std::strerror(errno);
    }
    off += n;
  }
  fchmod(fd, mode);
  close(fd);
}

void WriteFile(const std::string& path, const std::string& data, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  const int rc = FullWrite(fd, data.data(), data.size());
  fchmod(fd, mode);
  close(fd);
  ASSERT_EQ(rc, 0) << "writing " << path;
}

Status AddBytes(SnapshotWriter* writer, const FileEntry& entry, const std::string& bytes) {
  const int fd = memfd_create("gpuckpt-test-file", MFD_CLOEXEC);
  if (fd < 0) return StatusFromErrno(errno, "memfd_create");
  Status s;
  if (FullWrite(fd, bytes.data(), bytes.size()) != 0 || lseek(fd, 0, SEEK_SET) != 0)
    s = StatusFromErrno(errno, "filling a memfd");
  if (s.ok()) s = writer->AddFile(entry, fd);
  close(fd);
  return s;
}

std::string ReadAll(Store& store, const std::string& id, const std::string& path) {
  auto reader = store.OpenFile(id, path);
  if (!reader.ok()) {
    ADD_FAILURE() << reader.status().ToString();
    return {};
  }
  return ReadAll(**reader);
}

std::string ReadAll(FileReader& reader) {
  std::string out(reader.entry().size, '\0');
  size_t done = 0;
  while (done < out.size()) {
    auto n = reader.Pread(done, std::min<size_t>(128u << 10, out.size() - done), out.data() + done);
    if (!n.ok()) {
      ADD_FAILURE() << n.status().ToString() << " at offset " << done;
      break;
    }
    if (*n == 0) break;
    done += *n;
  }
  out.resize(done);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

void MakeDirs(const std::string& path, mode_t mode) {
  size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos)
    mkdir(path.substr(0, pos).c_str(), 0755);
  ASSERT_TRUE(mkdir(path.c_str(), mode) == 0 || errno == EEXIST)
      << path << ": " << std::strerror(errno);
  chmod(path.c_str(), mode);
}

::testing::AssertionResult FileMatchesStream(const std::string& path, const RandomStream& stream,
                                             uint64_t size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ::testing::AssertionFailure() << "cannot open " << path;
  std::vector<char> got(kBlock * 4), want(kBlock * 4);
  uint64_t off = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (;;) {
    const ssize_t n = FullRead(fd, got.data(), got.size());
    if (n < 0) {
      result = ::testing::AssertionFailure() << "read error on " << path;
      break;
    }
    const size_t expect = static_cast<size_t>(std::min<uint64_t>(got.size(), size - off));
    if (static_cast<size_t>(n) != expect) {
      result = ::testing::AssertionFailure() << path << " has " << off + static_cast<uint64_t>(n)
                                             << "+ bytes where " << size << " were expected";
      break;
    }
    if (n == 0) break;
    stream.Fill(off, want.data(), expect);
    if (std::memcmp(got.data(), want.data(), expect) != 0) {
      size_t i = 0;
      while (got[i] == want[i]) ++i;
      result = ::testing::AssertionFailure() << path << " differs at offset " << off + i;
      break;
    }
    off += expect;
  }
  close(fd);
  return result;
}

::testing::AssertionResult TreesEqual(const std::string& expected, const std::string& actual) {
  return CompareTrees(expected, actual, "");
}

void MakeCheckpointTree(const std::string& dir, uint64_t seed, uint64_t approx_bytes) {
  MakeDirs(dir);
  MakeDirs(dir + "/sub/deeper", 0750);
  const uint64_t unit = approx_bytes / 10;
  // A page image: 4 KiB pages, a quarter of them zero, the rest random.
  {
    const uint64_t pages = std::max<uint64_t>(1, (unit * 4) / 4096);
    std::string img(pages * 4096, '\0');
    RandomStream stream(seed * 31 + 1);
    Rng rng(seed * 31 + 2);
    for (uint64_t p = 0; p < pages; ++p) {
      if (rng.Next() % 4 != 0) stream.Fill(p * 4096, img.data() + p * 4096, 4096);
    }
    WriteFile(dir + "/pages-1.img", img, 0600);
  }
  WriteRandomFile(dir + "/core-1.img", unit * 2 + 12345, seed * 31 + 3, 0600);
  // Compressible text: words picked at random.
  {
    static const char* kWords[] = {"tensor ", "cuda ", "page ",  "checkpoint ", "dedup ",
                                   "0x7f3a ", "\n",    "layer.", "weight ",     "bias "};
    Rng rng(seed * 31 + 4);
    std::string text;
    text.reserve(unit * 2 + 64);
    while (text.size() < unit * 2) text += kWords[rng.Next() % 10];
    WriteFile(dir + "/sub/mm.img", text, 0640);
  }
  WriteRandomFile(dir + "/sub/deeper/dev-mem.bin", unit * 2 - 777, seed * 31 + 5, 0600);
  WriteFile(dir + "/sub/small.txt", "small file of seed " + std::to_string(seed) + "\n", 0644);
  WriteFile(dir + "/empty", "", 0444);
  ASSERT_EQ(symlink("sub/small.txt", (dir + "/link").c_str()), 0);
  chmod((dir + "/sub/deeper").c_str(), 0750);
  // Fixed times, so that the same seed gives the same tree, times included
  // (a test may regenerate a tree to compare an export with). Directories
  // last, deepest first: setting a child's time does not touch its parent.
  int64_t n = 0;
  for (const char* path : {"pages-1.img", "core-1.img", "sub/mm.img", "sub/deeper/dev-mem.bin",
                           "sub/small.txt", "empty", "sub/deeper", "sub"}) {
    const timespec t = {static_cast<time_t>(1600000000 + seed * 1000), ++n * 1000001};
    const timespec times[2] = {t, t};
    ASSERT_EQ(utimensat(AT_FDCWD, (dir + "/" + path).c_str(), times, AT_SYMLINK_NOFOLLOW), 0)
        << path;
  }
}

Result<SnapshotInfo> Import(Store& store, const std::string& src, const std::string& name) {
  SnapshotSpec spec;
  spec.name = name;
  return store.ImportDirectory(src, spec);
}

std::thread FeedPipe(int fd, const RandomStream& stream, uint64_t size, size_t write_size) {
  return std::thread([fd, &stream, size, write_size] {
    std::vector<char> buf(write_size);
    for (uint64_t off = 0; off < size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
      stream.Fill(off, buf.data(), n);
      if (write(fd, buf.data(), n) != static_cast<ssize_t>(n)) break;
      off += n;
    }
    close(fd);
  });
}

Result<SnapshotInfo> WriteFlatTree(Store& store, const std::string& src, const std::string& name,
                                   SnapshotWriterOptions::Spool spool, const std::string& base) {
  SnapshotSpec spec;
  spec.name = name;
  spec.base = base;
  SnapshotWriterOptions options;
  options.spool = spool;
  GPUCKPT_ASSIGN_OR_RETURN(auto writer, store.BeginSnapshot(spec, options));
  for (const std::string& file : SortedNames(src)) {
    const std::string path = src + "/" + file;
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    struct stat st {};
    if (fd.get() < 0 || fstat(fd.get(), &st) != 0) return StatusFromErrno(errno, path);
    if (!S_ISREG(st.st_mode)) continue;
    FileEntry e;
    e.path = file;
    e.mode = st.st_mode & 07777;
    e.uid = st.st_uid;
    e.gid = st.st_gid;
    e.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    GPUCKPT_RETURN_IF_ERROR(writer->AddFile(e, fd.get()));
  }
  return writer->Commit();
}

::testing::AssertionResult ExportMatches(Store& store, const std::string& id,
                                         const std::string& src, const std::string& scratch) {
  static std::atomic<int> counter{0};
  const std::string dest = scratch + "/export-" + id + "-" + std::to_string(counter++);
  Status s = store.Export(id, dest);
  if (!s.ok()) return ::testing::AssertionFailure() << "export of '" << id << "': " << s.ToString();
  auto r = TreesEqual(src, dest);
  RemoveTree(dest);
  if (!r) return r << " (snapshot '" << id << "')";
  return r;
}

StoreOptions TestOptions() {
  StoreOptions o;
  o.worker_threads = 2;
  return o;
}

std::string CliPath() {
  // The tests run a private copy: other work may rebuild the binary in the
  // build tree while a test runs (exec would then fail with ETXTBSY or run
  // a half-written file), and a copy under a 0755 temporary directory can be
  // executed by any user.
  static const TempDir* dir = new TempDir("gpuckpt-cli-copy");  // removed at exit below
  static const std::string copy = [] {
    std::string built;
    if (const char* env = std::getenv("GPUCKPT_CLI"); env != nullptr && *env != '\0') {
      built = env;
    } else {
#ifdef GPUCKPT_CLI_PATH
      built = GPUCKPT_CLI_PATH;
#else
      built = "gpuckpt";
#endif
    }
    const std::string path = dir->Sub("gpuckpt");
    WriteFile(path, ReadFile(built), 0755);
    std::atexit([] { delete dir; });
    return path;
  }();
  return copy;
}

int RunCli(const std::vector<std::string>& args, std::string* out, std::string* err) {
  TempDir io("gpuckpt-cli");
  const std::string out_path = io.Sub("out"), err_path = io.Sub("err");
  const std::string cli = CliPath();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(cli.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec: the parent has
    // threads.
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  if (pid < 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (out != nullptr) *out = ReadFile(out_path);
  if (err != nullptr) *err = ReadFile(err_path);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

namespace {

// The record a value of the chunks family stands for: read from its pack
// file (stores of version 2), or the value itself (version 1).
Result<std::string> RecordOfValue(const std::string& store_dir, std::string_view value) {
  if (!IsPackLocation(value)) return std::string(value);
  GPUCKPT_ASSIGN_OR_RETURN(PackLocation l, DecodePackLocation(value));
  GPUCKPT_ASSIGN_OR_RETURN(auto packs, ChunkPacks::Open(store_dir + "/" + format::kPacksDirName));
  std::string record;
  GPUCKPT_RETURN_IF_ERROR(packs->Read(l, &record));
  return record;
}

// Overwrites the record at `value`'s pack location with `record` (same size).
Status RewritePackedRecord(const std::string& store_dir, std::string_view value,
                           const std::string& record) {
  GPUCKPT_ASSIGN_OR_RETURN(PackLocation l, DecodePackLocation(value));
  if (record.size() != l.length) return Status::InvalidArgument("record changed its size");
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.pack", static_cast<unsigned long long>(l.pack));
  const std::string path = store_dir + "/" + format::kPacksDirName + "/" + name;
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return StatusFromErrno(errno, path);
  const ssize_t n = pwrite(fd, record.data(), record.size(), static_cast<off_t>(l.offset));
  const int err = errno;
  fsync(fd);
  close(fd);
  if (n != static_cast<ssize_t>(record.size())) return StatusFromErrno(err, path);
  return Status::Ok();
}

}  // namespace

Result<std::vector<StoredChunk>> ListStoredChunks(const std::string& store_dir) {
  RawDb raw;
  GPUCKPT_RETURN_IF_ERROR(OpenRaw(store_dir, &raw));
  std::vector<StoredChunk> out;
  std::unique_ptr<rocksdb::Iterator> it(
      raw.db->NewIterator(rocksdb::ReadOptions(), raw.handles[1]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    GPUCKPT_ASSIGN_OR_RETURN(std::string record,
                             RecordOfValue(store_dir, it->value().ToStringView()));
    const RecordParts parts = ParseRecord(record);
    StoredChunk c;
    c.key = it->key().ToString();
    c.hash_hex = parts.hash_hex;
    c.codec = parts.codec;
    c.record_size = record.size();
    out.push_back(std::move(c));
  }
  if (!it->status().ok()) return Status::IOError(it->status().ToString());
  return out;
}

namespace {

// Applies `change` to the record of chunk `hash_hex` (found by the hash the
// record carries) in the closed store at `store_dir`, and writes it back
// (or deletes it when `change` returns false).
Status ChangeChunkRecord(
    const std::string& store_dir, const std::string& hash_hex,
    const std::function<Status(std::string* record, const RecordParts&, bool* keep)>& change) {
  RawDb raw;
  GPUCKPT_RETURN_IF_ERROR(OpenRaw(store_dir, &raw));
  std::unique_ptr<rocksdb::Iterator> it(
      raw.db->NewIterator(rocksdb::ReadOptions(), raw.handles[1]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    GPUCKPT_ASSIGN_OR_RETURN(std::string record,
                             RecordOfValue(store_dir, it->value().ToStringView()));
    const RecordParts parts = ParseRecord(record);
    if (!parts.ok || parts.hash_hex != hash_hex) continue;
    const std::string value = it->value().ToString();
    const std::string key = it->key().ToString();
    it.reset();
    bool keep = true;
    GPUCKPT_RETURN_IF_ERROR(change(&record, parts, &keep));
    if (keep && IsPackLocation(value)) return RewritePackedRecord(store_dir, value, record);
    rocksdb::WriteOptions w;
    w.sync = true;
    rocksdb::Status s =
        keep ? raw.db->Put(w, raw.handles[1], key, record) : raw.db->Delete(w, raw.handles[1], key);
    return s.ok() ? Status::Ok() : Status::IOError(s.ToString());
  }
  if (!it->status().ok()) return Status::IOError(it->status().ToString());
  return Status::NotFound("no chunk " + hash_hex);
}

}  // namespace

Status FlipChunkByte(const std::string& store_dir, const std::string& hash_hex,
                     size_t payload_offset) {
  return ChangeChunkRecord(store_dir, hash_hex,
                           [&](std::string* record, const RecordParts& parts, bool*) {
                             const size_t at = parts.payload_offset + payload_offset;
                             if (at >= record->size())
                               return Status::InvalidArgument("offset past the payload");
                             (*record)[at] = static_cast<char>((*record)[at] ^ 0x01);
                             return Status::Ok();
                           });
}

Status DeleteChunkData(const std::string& store_dir, const std::string& hash_hex) {
  return ChangeChunkRecord(store_dir, hash_hex, [](std::string*, const RecordParts&, bool* keep) {
    *keep = false;
    return Status::Ok();
  });
}

Status SwapChunkRecords(const std::string& store_dir, const std::string& key_a,
                        const std::string& key_b) {
  RawDb raw;
  GPUCKPT_RETURN_IF_ERROR(OpenRaw(store_dir, &raw));
  std::string a, b;
  rocksdb::Status s = raw.db->Get(rocksdb::ReadOptions(), raw.handles[1], key_a, &a);
  if (s.ok()) s = raw.db->Get(rocksdb::ReadOptions(), raw.handles[1], key_b, &b);
  rocksdb::WriteBatch batch;
  if (s.ok()) s = batch.Put(raw.handles[1], key_a, b);
  if (s.ok()) s = batch.Put(raw.handles[1], key_b, a);
  rocksdb::WriteOptions w;
  w.sync = true;
  if (s.ok()) s = raw.db->Write(w, &batch);
  return s.ok() ? Status::Ok() : Status::IOError(s.ToString());
}

Status EditFileRecords(const std::string& store_dir,
                       const std::function<std::string(const std::string& record)>& edit) {
  RawDb raw;
  GPUCKPT_RETURN_IF_ERROR(OpenRaw(store_dir, &raw));
  rocksdb::ColumnFamilyHandle* files = raw.handles[4];
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(raw.db->NewIterator(rocksdb::ReadOptions(), files));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!batch.Put(files, it->key(), edit(it->value().ToString())).ok())
      return Status::IOError("batch");
  }
  if (!it->status().ok()) return Status::IOError(it->status().ToString());
  it.reset();
  rocksdb::WriteOptions w;
  w.sync = true;
  rocksdb::Status s = raw.db->Write(w, &batch);
  return s.ok() ? Status::Ok() : Status::IOError(s.ToString());
}

Status MakeVersion1Store(const std::string& store_dir) {
  {
    RawDb raw;
    GPUCKPT_RETURN_IF_ERROR(OpenRaw(store_dir, &raw));
    rocksdb::WriteBatch batch;
    std::unique_ptr<rocksdb::Iterator> it(
        raw.db->NewIterator(rocksdb::ReadOptions(), raw.handles[1]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      GPUCKPT_ASSIGN_OR_RETURN(std::string record,
                               RecordOfValue(store_dir, it->value().ToStringView()));
      if (!batch.Put(raw.handles[1], it->key(), record).ok()) return Status::IOError("batch");
    }
    if (!batch.Put(raw.handles[0], format::kMetaStoreVersionKey, "1").ok())
      return Status::IOError("batch");
    rocksdb::WriteOptions w;
    w.sync = true;
    it.reset();
    rocksdb::Status s = raw.db->Write(w, &batch);
    if (!s.ok()) return Status::IOError(s.ToString());
  }
  RemoveTree(store_dir + "/" + format::kPacksDirName);
  return Status::Ok();
}

Result<std::string> StoredVersion(const std::string& store_dir) {
  RawDb raw;
  GPUCKPT_RETURN_IF_ERROR(OpenRaw(store_dir, &raw));
  std::string v;
  rocksdb::Status s =
      raw.db->Get(rocksdb::ReadOptions(), raw.handles[0], format::kMetaStoreVersionKey, &v);
  if (!s.ok()) return Status::IOError(s.ToString());
  return v;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  ListDirInto(dir, "", &out);
  return out;
}

std::string ImageU32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

std::string ProtoVarint(uint64_t v) {
  std::string out;
  do {
    out.push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return out;
}

std::string ProtoVarintField(uint32_t field, uint64_t v) {
  return ProtoVarint(uint64_t{field} << 3) + ProtoVarint(v);
}

std::string ProtoBytesField(uint32_t field, const std::string& bytes) {
  return ProtoVarint(uint64_t{field} << 3 | 2) + ProtoVarint(bytes.size()) + bytes;
}

std::string CriuImageBytes(uint32_t type_magic, const std::vector<std::string>& records) {
  // IMG_COMMON_MAGIC (criu/include/magic.h).
  std::string out = ImageU32(0x54564319) + ImageU32(type_magic);
  for (const std::string& r : records) out += ImageU32(static_cast<uint32_t>(r.size())) + r;
  return out;
}

}  // namespace gpuckpt::testing
