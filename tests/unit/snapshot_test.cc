// The Store API end to end: round trips (export and FileReader::Pread) at
// the chunkers' size bounds, metadata (modes, symlinks, directories),
// deduplication, remove + gc, aborted writers, the single-process lock, and
// the CLI on top of it all.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "core/catalog/records.h"
#include "core/store/chunker.h"
#include "gpuckpt/store.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::ExportMatches;
using testing::Import;
using testing::RandomStream;
using testing::Rng;
using testing::TempDir;

class SnapshotTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> Open(const StoreOptions& options = testing::TestOptions()) {
    auto s = Store::Open(store_dir_, options);
    EXPECT_TRUE(testing::IsOk(s));
    return s.ok() ? std::move(s).value() : nullptr;
  }
  StoreStats StatsOf(Store& store) {
    auto s = store.Stats();
    EXPECT_TRUE(testing::IsOk(s));
    return s.ok() ? *s : StoreStats{};
  }
  void ExpectFsckClean(Store& store) {
    auto r = store.Fsck();
    ASSERT_OK(r);
    EXPECT_TRUE(r->clean()) << "first problem: " << (r->problems.empty() ? "" : r->problems[0]);
  }

  TempDir tmp_;
  const std::string store_dir_ = tmp_.Sub("store");
};

// --- round trips ------------------------------------------------------------------

// Data of a test file: random, or (for page images) pages of which every
// third is zero, so both chunk codecs are read back.
std::string FileData(uint64_t size, uint64_t seed, bool page_image) {
  std::string data = RandomStream(seed).Bytes(0, size);
  if (page_image) {
    for (uint64_t p = 0; p * 4096 < size; p += 3) {
      std::memset(data.data() + p * 4096, 0, std::min<uint64_t>(4096, size - p * 4096));
    }
  }
  return data;
}

std::vector<uint64_t> BoundarySizes(const ChunkSizes& s) {
  std::vector<uint64_t> out = {0, 1};
  for (uint64_t b : {s.min_size, s.avg_size, s.max_size}) {
    out.push_back(b - 1);
    out.push_back(b);
    out.push_back(b + 1);
  }
  out.push_back(2ull * s.max_size + 17);
  return out;
}

// Reads [offset, offset+len) through `reader` and compares with `data`
// (the whole file); the expected count is short past EOF.
::testing::AssertionResult PreadMatches(FileReader& reader, const std::string& data,
                                        uint64_t offset, size_t len) {
  std::string buf(len + 16, '\x5a');
  auto n = reader.Pread(offset, len, buf.data());
  if (!n.ok())
    return ::testing::AssertionFailure()
           << "Pread(" << offset << ", " << len << "): " << n.status().ToString();
  const size_t expect = offset >= data.size() ? 0 : std::min<size_t>(len, data.size() - offset);
  if (*n != expect) {
    return ::testing::AssertionFailure()
           << "Pread(" << offset << ", " << len << ") returned " << *n << ", expected " << expect;
  }
  if (expect > 0 && std::memcmp(buf.data(), data.data() + offset, expect) != 0) {
    return ::testing::AssertionFailure()
           << "Pread(" << offset << ", " << len << ") returned wrong data";
  }
  if (buf[expect] != '\x5a') {
    return ::testing::AssertionFailure()
           << "Pread(" << offset << ", " << len << ") wrote past its count";
  }
  return ::testing::AssertionSuccess();
}

TEST_F(SnapshotTest, FilesAtChunkSizeBoundsRoundTripByExportAndPread) {
  const ChunkingOptions chunking;
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  struct File {
    std::string name;
    std::string data;
    bool page_image;
  };
  std::vector<File> files;
  uint64_t seed = 100;
  for (uint64_t size : BoundarySizes(chunking.generic)) {
    files.push_back(
        {"generic-" + std::to_string(size) + ".bin", FileData(size, seed++, false), false});
  }
  // The page chunker's bounds plus one page either side (a set: the minimum
  // may itself be one page).
  std::set<uint64_t> page_sizes;
  for (uint64_t size : BoundarySizes(chunking.pages)) page_sizes.insert(size);
  for (uint64_t size : {4095u, 4096u, 4097u}) page_sizes.insert(size);
  for (uint64_t size : page_sizes) {
    files.push_back({"pages-" + std::to_string(size) + ".img", FileData(size, seed++, true), true});
  }
  for (const auto& f : files) testing::WriteFile(src + "/" + f.name, f.data);

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, Import(*store, src, "bounds"));
  EXPECT_EQ(info.file_count, files.size());
  uint64_t logical = 0;
  for (const auto& f : files) logical += f.data.size();
  EXPECT_EQ(info.logical_bytes, logical);
  EXPECT_TRUE(ExportMatches(*store, "bounds", src, tmp_.path()));

  ASSERT_OK_AND_ASSIGN(auto entries, store->ListFiles("bounds"));
  std::map<std::string, FileEntry> by_path;
  for (auto& e : entries) by_path[e.path] = e;

  Rng rng(1);
  for (const auto& f : files) {
    SCOPED_TRACE(f.name);
    const FileEntry& e = by_path[f.name];
    EXPECT_EQ(e.size, f.data.size());
    const ChunkSizes& sizes = f.page_image ? chunking.pages : chunking.generic;
    if (f.data.empty()) {
      EXPECT_EQ(e.chunk_count, 0u);
    }
    if (!f.data.empty() && f.data.size() <= sizes.min_size) {
      EXPECT_EQ(e.chunk_count, 1u);
    }
    if (f.data.size() > sizes.max_size) {
      EXPECT_GE(e.chunk_count, 2u);
    }

    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("bounds", f.name));
    EXPECT_EQ(reader->entry().size, f.data.size());
    const uint64_t size = f.data.size();
    // Whole file, past EOF, at EOF, zero length.
    EXPECT_TRUE(PreadMatches(*reader, f.data, 0, size + 100));
    EXPECT_TRUE(PreadMatches(*reader, f.data, size, 10));
    EXPECT_TRUE(PreadMatches(*reader, f.data, size + 4096, 10));
    EXPECT_TRUE(PreadMatches(*reader, f.data, size > 3 ? size - 3 : 0, 10));
    EXPECT_TRUE(PreadMatches(*reader, f.data, 0, 0));
    // Around every chunk boundary (computed with the store's chunker).
    auto chunker = Chunker::Create(sizes, f.page_image ? chunking.page_size : 1);
    ASSERT_OK(chunker);
    uint64_t pos = 0;
    while (pos < size) {
      pos += chunker->NextChunkLength(reinterpret_cast<const uint8_t*>(f.data.data()) + pos,
                                      size - pos, pos, true);
      if (pos < size) {
        EXPECT_TRUE(PreadMatches(*reader, f.data, pos - 1, 2));
        EXPECT_TRUE(PreadMatches(*reader, f.data, pos >= 100 ? pos - 100 : 0, 4196));
        EXPECT_TRUE(PreadMatches(*reader, f.data, pos, 1));
      }
    }
    // Random ranges, some crossing several chunks.
    for (int i = 0; i < 20 && size > 0; ++i) {
      const uint64_t off = rng.Uniform(0, size + 10);
      EXPECT_TRUE(PreadMatches(*reader, f.data, off, rng.Uniform(1, 3 * sizes.max_size)));
    }
  }
  ExpectFsckClean(*store);
}

// Read() hands raw chunks out as views into the buffer they were read
// into (no copy): what one read holds must stay as it was while other
// reads, on other threads, take read buffers and give them back, and a
// buffer must go back only when the last piece in it is let go.
TEST_F(SnapshotTest, PiecesOfAReadStayIntactWhileLaterReadsReuseBuffers) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  const uint64_t size = 24u << 20;
  const std::string data = FileData(size, 7, /*page_image=*/true);  // raw and zstd chunks
  testing::WriteFile(src + "/pages-1.img", data);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, src, "held"));
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("held", "pages-1.img"));

  auto matches = [&](const FileReader::ReadPieces& read, uint64_t offset) {
    uint64_t at = offset;
    for (const FileReader::Piece& p : read.pieces) {
      if (std::memcmp(p.data, data.data() + at, p.size) != 0) return false;
      at += p.size;
    }
    return true;
  };
  // Reads held at once, at offsets that are not chunk boundaries.
  std::vector<std::pair<uint64_t, FileReader::ReadPieces>> kept;
  for (uint64_t offset = 12345; offset + (1u << 20) <= size; offset += 5u << 20) {
    ASSERT_OK_AND_ASSIGN(FileReader::ReadPieces read, reader->Read(offset, 1u << 20));
    ASSERT_EQ(read.size(), 1u << 20);
    kept.emplace_back(offset, std::move(read));
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      Rng rng(40 + t);
      for (int i = 0; i < 60; ++i) {
        const uint64_t offset = rng.Uniform(0, size - 1);
        auto read = reader->Read(offset, rng.Uniform(1, 3u << 20));
        if (!read.ok() || !matches(*read, offset)) ++wrong;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0) << "reads beside the kept ones returned wrong bytes";
  for (const auto& [offset, read] : kept) EXPECT_TRUE(matches(read, offset)) << "at " << offset;
}

TEST_F(SnapshotTest, DirectoriesSymlinksModesAndOwnersRoundTrip) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  testing::MakeDirs(src + "/empty-dir", 0700);
  testing::MakeDirs(src + "/shared", 02775);
  testing::MakeDirs(src + "/a/b/c", 0750);
  testing::WriteFile(src + "/a/b/c/deep.txt", "deep\n", 0640);
  testing::WriteFile(src + "/exec.sh", "#!/bin/sh\n", 0755);
  testing::WriteFile(src + "/private", "secret", 0600);
  testing::WriteFile(src + "/setuid", "s", 04711);
  testing::WriteFile(src + "/readonly", "r", 0444);
  testing::MakeDirs(src + "/ro-dir", 0755);
  testing::WriteFile(src + "/ro-dir/inside", "still exported", 0644);
  chmod((src + "/ro-dir").c_str(), 0555);  // export must still fill it
  ASSERT_EQ(symlink("a/b/c/deep.txt", (src + "/rel-link").c_str()), 0);
  ASSERT_EQ(symlink("/etc/hostname", (src + "/abs-link").c_str()), 0);
  ASSERT_EQ(symlink("does/not/exist", (src + "/dangling").c_str()), 0);
  ASSERT_EQ(symlink("a/b", (src + "/dir-link").c_str()), 0);
  const bool root = geteuid() == 0;
  if (root) {
    ASSERT_EQ(lchown((src + "/private").c_str(), 1234, 5678), 0);
  }
  // Directory mtimes last: creating entries changed them.
  const timespec old_times[2] = {{1000000000, 123456789}, {1000000000, 123456789}};
  ASSERT_EQ(utimensat(AT_FDCWD, (src + "/a/b").c_str(), old_times, 0), 0);

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, src, "meta"));
  ASSERT_OK_AND_ASSIGN(auto entries, store->ListFiles("meta"));
  std::map<std::string, FileEntry> by_path;
  for (auto& e : entries) by_path[e.path] = e;
  EXPECT_EQ(by_path["rel-link"].type, FileType::kSymlink);
  EXPECT_EQ(by_path["rel-link"].symlink_target, "a/b/c/deep.txt");
  EXPECT_EQ(by_path["dir-link"].type, FileType::kSymlink) << "symlinks are stored, not followed";
  EXPECT_EQ(by_path["a/b/c"].type, FileType::kDirectory);
  EXPECT_EQ(by_path["a/b/c"].mode, 0750u);
  EXPECT_EQ(by_path["shared"].mode, 02775u);
  EXPECT_EQ(by_path["setuid"].mode, 04711u);
  EXPECT_EQ(by_path.count("dir-link/c"), 0u);
  EXPECT_CODE(store->OpenFile("meta", "a/b"), StatusCode::kInvalidArgument);
  EXPECT_CODE(store->OpenFile("meta", "rel-link"), StatusCode::kInvalidArgument);

  const std::string dest = tmp_.Sub("out");
  ASSERT_OK(store->Export("meta", dest));
  EXPECT_TRUE(testing::TreesEqual(src, dest));
  if (root) {
    struct stat st {};
    ASSERT_EQ(lstat((dest + "/private").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 1234u);
    EXPECT_EQ(st.st_gid, 5678u);
  }
  ExpectFsckClean(*store);
}

// Names are bytes: a file name and a symlink target that are not UTF-8
// (Latin-1 here) are stored, listed, read and exported exactly, and the
// snapshot's source path shows them escaped.
// A file opened as a listing named it reads that snapshot's file, found
// by its record, never another snapshot's that took the id meanwhile.
TEST_F(SnapshotTest, AListedFileOpensOnlyInTheSnapshotItWasListedIn) {
  const std::string first = tmp_.Sub("first"), second = tmp_.Sub("second");
  testing::MakeDirs(first + "/d");
  testing::MakeDirs(second + "/d");
  testing::WriteFile(first + "/d/a.img", "first a");
  testing::WriteFile(first + "/d/b.img", "first b");
  testing::WriteFile(second + "/d/a.img", "second a");
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, Import(*store, first, "job"));
  ASSERT_OK_AND_ASSIGN(auto entries, store->ListFiles("job"));
  auto entry = [&](const std::string& path) {
    auto it = std::find_if(entries.begin(), entries.end(),
                           [&](const FileEntry& e) { return e.path == path; });
    EXPECT_NE(it, entries.end()) << path;
    return it == entries.end() ? FileEntry{} : *it;
  };
  for (const char* path : {"d/a.img", "d/b.img"}) {
    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenListedFile("job", info.key, entry(path)));
    EXPECT_TRUE(PreadMatches(*reader, std::string("first ") + path[2], 0, 64)) << path;
  }
  // Not a regular file, or not the record the listing named.
  EXPECT_CODE(store->OpenListedFile("job", info.key, entry("d")), StatusCode::kInvalidArgument);
  FileEntry renamed = entry("d/a.img");
  renamed.path = "d/b.img";
  EXPECT_CODE(store->OpenListedFile("job", info.key, renamed), StatusCode::kNotFound);
  // The id removed and made again: the old listing opens nothing.
  ASSERT_OK(store->Remove("job"));
  EXPECT_CODE(store->OpenListedFile("job", info.key, entry("d/a.img")), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo again, Import(*store, second, "job"));
  ASSERT_NE(again.key, info.key);
  EXPECT_CODE(store->OpenListedFile("job", info.key, entry("d/a.img")), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(auto now, store->ListFiles("job"));
  for (const auto& e : now) {
    if (e.path != "d/a.img") continue;
    ASSERT_OK_AND_ASSIGN(auto reader, store->OpenListedFile("job", again.key, e));
    EXPECT_TRUE(PreadMatches(*reader, "second a", 0, 64));
  }
}

TEST_F(SnapshotTest, NamesThatAreNotUtf8RoundTripExactly) {
  const std::string src = tmp_.Sub("caf\xe9");
  testing::MakeDirs(src);
  testing::MakeDirs(src + "/d\xff\xfe");
  testing::WriteFile(src + "/d\xff\xfe/r\xe9sum\xe9.txt", "bytes\n");
  ASSERT_EQ(symlink("d\xff\xfe/r\xe9sum\xe9.txt", (src + "/link\x80").c_str()), 0);

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, src, "latin1"));
  ASSERT_OK_AND_ASSIGN(auto entries, store->ListFiles("latin1"));
  std::map<std::string, FileEntry> by_path;
  for (auto& e : entries) by_path[e.path] = e;
  ASSERT_EQ(by_path.count("d\xff\xfe/r\xe9sum\xe9.txt"), 1u);
  EXPECT_EQ(by_path["link\x80"].symlink_target, "d\xff\xfe/r\xe9sum\xe9.txt");
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("latin1", "d\xff\xfe/r\xe9sum\xe9.txt"));
  std::string text(6, '\0');
  ASSERT_OK_AND_ASSIGN(size_t n, reader->Pread(0, text.size(), text.data()));
  EXPECT_EQ(text.substr(0, n), "bytes\n");
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, store->Get("latin1"));
  EXPECT_NE(info.source.find("caf\\xE9"), std::string::npos) << info.source;

  const std::string dest = tmp_.Sub("out");
  ASSERT_OK(store->Export("latin1", dest));
  EXPECT_TRUE(testing::TreesEqual(src, dest));
  ExpectFsckClean(*store);
}

TEST_F(SnapshotTest, WriterAddFileReadsPipesToEof) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const uint64_t size = (5u << 20) + 333;
  const RandomStream stream(42);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::thread feeder = testing::FeedPipe(fds[1], stream, size, 100000);  // odd-sized writes
  SnapshotSpec spec;
  spec.name = "piped";
  spec.extra_json = R"({"pid": 4242})";
  ASSERT_OK_AND_ASSIGN(auto writer, store->BeginSnapshot(spec));
  FileEntry dir;
  dir.path = "dir";
  dir.type = FileType::kDirectory;
  dir.mode = 0755;
  ASSERT_OK(writer->AddEntry(dir));
  FileEntry file;
  file.path = "dir/pages-1.img";
  file.mode = 0600;
  file.size = 1;  // ignored: the bytes read decide
  std::vector<uint64_t> progress;
  writer->SetProgress([&](uint64_t done, uint64_t) { progress.push_back(done); }, size);
  const Status added = writer->AddFile(file, fds[0]);
  feeder.join();
  close(fds[0]);
  ASSERT_OK(added);
  EXPECT_EQ(writer->bytes_read(), size);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, writer->Commit());
  EXPECT_EQ(info.logical_bytes, size);
  EXPECT_EQ(info.file_count, 2u);
  EXPECT_CODE(writer->Commit(), StatusCode::kInvalidArgument) << "committed twice";
  writer.reset();

  ASSERT_OK_AND_ASSIGN(SnapshotInfo got, store->Get("piped"));
  EXPECT_EQ(got.key, info.key);
  EXPECT_EQ(got.logical_bytes, size);
  EXPECT_NE(got.extra_json.find("4242"), std::string::npos) << got.extra_json;
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("piped", "dir/pages-1.img"));
  EXPECT_EQ(reader->entry().size, size);
  const std::string all = stream.Bytes(0, size);
  EXPECT_TRUE(PreadMatches(*reader, all, 0, size));
  EXPECT_TRUE(PreadMatches(*reader, all, size - 5000, 10000));
}

// --- deduplication ------------------------------------------------------------------

TEST_F(SnapshotTest, SecondImportOfTheSameTreeStoresNoNewChunk) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 1, 24u << 20);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, Import(*store, src, "first"));
  const StoreStats before = StatsOf(*store);
  EXPECT_GT(first.new_chunks, 0u);
  // Nothing counted twice, nothing stored twice.
  EXPECT_EQ(before.chunk_count, first.new_chunks);
  EXPECT_EQ(before.unique_bytes, first.new_bytes);
  EXPECT_EQ(before.stored_bytes, first.stored_bytes);
  EXPECT_LT(first.stored_bytes, first.logical_bytes) << "zero pages and text must compress";

  ASSERT_OK_AND_ASSIGN(SnapshotInfo second, Import(*store, src, "second"));
  EXPECT_EQ(second.new_chunks, 0u);
  EXPECT_EQ(second.new_bytes, 0u);
  EXPECT_EQ(second.stored_bytes, 0u);
  EXPECT_EQ(second.chunk_count, first.chunk_count);
  EXPECT_EQ(second.logical_bytes, first.logical_bytes);
  const StoreStats after = StatsOf(*store);
  EXPECT_EQ(after.chunk_count, before.chunk_count);
  EXPECT_EQ(after.unique_bytes, before.unique_bytes);
  EXPECT_EQ(after.snapshot_count, 2u);
  EXPECT_EQ(after.logical_bytes, 2 * first.logical_bytes);
  EXPECT_TRUE(ExportMatches(*store, "first", src, tmp_.path()));
  EXPECT_TRUE(ExportMatches(*store, "second", src, tmp_.path()));
}

TEST_F(SnapshotTest, ManifestSaysHowLongTheCommitAndItsSyncTook) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 3, 4u << 20);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo made, Import(*store, src, "timed"));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo read, store->Get("timed"));
  EXPECT_GT(read.sync_s, 0.0);  // at least the synced flush
  EXPECT_LE(read.sync_s, read.commit_s);
  EXPECT_LE(read.commit_s, read.duration_s);
  EXPECT_DOUBLE_EQ(read.commit_s, made.commit_s);
  EXPECT_NE(SnapshotManifestJson(read).find("\"sync_s\""), std::string::npos);
}

// The manifest's time is an RFC 3339 string with nanoseconds (a 19-digit
// integer would lose digits in jq or JavaScript); records written before
// (created_ns alone) still read, and the store's own record keeps
// created_ns for older readers.
TEST(SnapshotRecordTest, CreatedIsAStringAndOldRecordsStillRead) {
  SnapshotInfo info;
  info.id = "x";
  info.key = 3;
  info.created_ns = 1796157684'123456789;
  const std::string manifest = SnapshotManifestJson(info);
  EXPECT_NE(manifest.find("\"created\": \"2026-12-01T20:41:24.123456789Z\""), std::string::npos)
      << manifest;
  EXPECT_EQ(manifest.find("created_ns"), std::string::npos) << manifest;
  const std::string record = EncodeSnapshotRecord(info);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo read, DecodeSnapshotRecord("x", record));
  EXPECT_EQ(read.created_ns, info.created_ns);
  const std::string old = std::string(1, static_cast<char>(record[0])) +
                          R"({"key":3,"created_ns":1796157684123456789,"files":0})";
  ASSERT_OK_AND_ASSIGN(SnapshotInfo earlier, DecodeSnapshotRecord("x", old));
  EXPECT_EQ(earlier.created_ns, info.created_ns);
}

TEST_F(SnapshotTest, SameDataUnderAnotherNameOrInAnotherSnapshotDedups) {
  const std::string a = tmp_.Sub("a"), b = tmp_.Sub("b");
  testing::MakeDirs(a);
  testing::MakeDirs(b + "/renamed");
  const std::string generic = testing::RandomBytes(3u << 20, 7);
  const std::string pages = FileData(3u << 20, 8, true);
  // Within one snapshot: the same bytes twice.
  testing::WriteFile(a + "/one.bin", generic);
  testing::WriteFile(a + "/two.bin", generic);
  testing::WriteFile(a + "/pages-1.img", pages);
  // Another snapshot: the same bytes under other names.
  testing::WriteFile(b + "/renamed/three.bin", generic);
  testing::WriteFile(b + "/pages-77.img", pages);

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo ia, Import(*store, a, "a"));
  ASSERT_OK_AND_ASSIGN(auto files, store->ListFiles("a"));
  uint64_t one_chunks = 0, pages_chunks = 0;
  for (const auto& f : files) {
    if (f.path == "one.bin") one_chunks = f.chunk_count;
    if (f.path == "pages-1.img") pages_chunks = f.chunk_count;
  }
  ASSERT_GT(one_chunks, 10u);
  EXPECT_EQ(ia.chunk_count, 2 * one_chunks + pages_chunks);
  // two.bin stored nothing: each of its chunks was already stored or in flight.
  EXPECT_LE(ia.new_chunks, one_chunks + pages_chunks);
  EXPECT_EQ(StatsOf(*store).chunk_count, ia.new_chunks);

  ASSERT_OK_AND_ASSIGN(SnapshotInfo ib, Import(*store, b, "b"));
  EXPECT_EQ(ib.new_chunks, 0u);
  EXPECT_EQ(ib.new_bytes, 0u);
  EXPECT_EQ(ib.chunk_count, one_chunks + pages_chunks);
  EXPECT_EQ(StatsOf(*store).chunk_count, ia.new_chunks);
  EXPECT_TRUE(ExportMatches(*store, "a", a, tmp_.path()));
  EXPECT_TRUE(ExportMatches(*store, "b", b, tmp_.path()));
}

// Imports `before` then `after` (one file each, same name) and returns the
// second import's new chunks.
uint64_t NewChunksOfSecondVersion(Store& store, const TempDir& tmp, const std::string& name,
                                  const std::string& before, const std::string& after,
                                  const std::string& tag) {
  const std::string d1 = tmp.Sub(tag + "-v1"), d2 = tmp.Sub(tag + "-v2");
  testing::MakeDirs(d1);
  testing::MakeDirs(d2);
  testing::WriteFile(d1 + "/" + name, before);
  testing::WriteFile(d2 + "/" + name, after);
  auto i1 = Import(store, d1, tag + "-v1");
  auto i2 = Import(store, d2, tag + "-v2");
  EXPECT_TRUE(testing::IsOk(i1));
  EXPECT_TRUE(testing::IsOk(i2));
  EXPECT_TRUE(ExportMatches(store, tag + "-v2", d2, tmp.path()));
  testing::RemoveTree(d1);
  testing::RemoveTree(d2);
  return i2.ok() ? i2->new_chunks : ~uint64_t{0};
}

TEST_F(SnapshotTest, ByteInsertedNearTheStartStoresAtMostThreeNewChunks) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string before = testing::RandomBytes(64u << 20, 21);
  std::string after = before;
  after.insert(after.begin() + 5000, '!');
  const uint64_t fresh = NewChunksOfSecondVersion(*store, tmp_, "data.bin", before, after, "byte");
  EXPECT_GE(fresh, 1u);
  EXPECT_LE(fresh, 3u);
}

TEST_F(SnapshotTest, PageInsertedNearTheStartOfAPageImageStoresAtMostThreeNewChunks) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string before = testing::RandomBytes(64u << 20, 22);
  std::string after = before;
  after.insert(3 * 4096, testing::RandomBytes(4096, 23));
  const uint64_t fresh =
      NewChunksOfSecondVersion(*store, tmp_, "pages-3.img", before, after, "ins");
  EXPECT_GE(fresh, 1u);
  EXPECT_LE(fresh, 3u);
}

TEST_F(SnapshotTest, PageChangedInTheMiddleOfAPageImageStoresAtMostTwoNewChunks) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string before = testing::RandomBytes(64u << 20, 24);
  std::string after = before;
  after.replace(before.size() / 2 + 5 * 4096, 4096, testing::RandomBytes(4096, 25));
  const uint64_t fresh =
      NewChunksOfSecondVersion(*store, tmp_, "pages-3.img", before, after, "chg");
  EXPECT_GE(fresh, 1u);
  EXPECT_LE(fresh, 2u);
}

// --- remove, gc, aborted writers ---------------------------------------------------------

TEST_F(SnapshotTest, RemoveAndGcReclaimOnlyChunksOfTheRemovedSnapshot) {
  const std::string s1 = tmp_.Sub("s1"), s2 = tmp_.Sub("s2");
  testing::MakeDirs(s1);
  testing::MakeDirs(s2);
  const std::string shared = testing::RandomBytes(2u << 20, 31);
  testing::WriteFile(s1 + "/shared.bin", shared);
  testing::WriteFile(s2 + "/shared.bin", shared);
  testing::WriteRandomFile(s1 + "/only1.bin", 2u << 20, 32);
  testing::WriteRandomFile(s2 + "/only2.bin", 2u << 20, 33);

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo i1, Import(*store, s1, "s1"));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo i2, Import(*store, s2, "s2"));
  uint64_t only1_chunks = 0, only1_bytes = 0;
  ASSERT_OK_AND_ASSIGN(auto files, store->ListFiles("s1"));
  for (const auto& f : files) {
    if (f.path == "only1.bin") {
      only1_chunks = f.chunk_count;
      only1_bytes = f.size;
    }
  }
  ASSERT_GT(only1_chunks, 0u);
  const StoreStats full = StatsOf(*store);
  EXPECT_EQ(full.chunk_count, i1.new_chunks + i2.new_chunks);

  ASSERT_OK(store->Remove("s1"));
  EXPECT_CODE(store->Get("s1"), StatusCode::kNotFound);
  EXPECT_EQ(StatsOf(*store).chunk_count, full.chunk_count) << "chunks stay until gc";
  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_EQ(gc.chunks_deleted, only1_chunks);
  EXPECT_EQ(gc.chunks_kept, full.chunk_count - only1_chunks);
  EXPECT_EQ(gc.orphan_records_deleted, 0u);
  EXPECT_GE(gc.bytes_deleted, only1_bytes) << "random chunks are stored raw";
  const StoreStats after = StatsOf(*store);
  EXPECT_EQ(after.chunk_count, full.chunk_count - only1_chunks);
  EXPECT_EQ(after.snapshot_count, 1u);
  EXPECT_TRUE(ExportMatches(*store, "s2", s2, tmp_.path()));
  ExpectFsckClean(*store);

  // A second gc finds nothing; removing the last snapshot frees everything.
  ASSERT_OK_AND_ASSIGN(GcReport again, store->Gc());
  EXPECT_EQ(again.chunks_deleted, 0u);
  ASSERT_OK(store->Remove("s2"));
  ASSERT_OK_AND_ASSIGN(GcReport last, store->Gc());
  EXPECT_EQ(last.chunks_deleted, after.chunk_count);
  EXPECT_EQ(StatsOf(*store).chunk_count, 0u);
  // The name is free again.
  ASSERT_OK(Import(*store, s1, "s1"));
  EXPECT_TRUE(ExportMatches(*store, "s1", s1, tmp_.path()));
}

// A removed snapshot is gone for anyone who opens it afterwards (a reader
// already open goes on: store_safety_test).
TEST_F(SnapshotTest, RemovedSnapshotCannotBeOpenedAnew) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  testing::WriteRandomFile(src + "/f.bin", 1u << 20, 34);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, src, "gone"));
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("gone", "f.bin"));
  ASSERT_OK(store->Remove("gone"));
  EXPECT_CODE(store->OpenFile("gone", "f.bin"), StatusCode::kNotFound);
  EXPECT_CODE(store->Get("gone"), StatusCode::kNotFound);
  EXPECT_CODE(store->ListFiles("gone"), StatusCode::kNotFound);
  ASSERT_OK(store->Gc());
  EXPECT_CODE(store->OpenFile("gone", "f.bin"), StatusCode::kNotFound);
}

TEST_F(SnapshotTest, AbortedWriterLeavesNothingVisibleAndGcRemovesItsRecords) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 2, 1u << 20);
  // A writer keeps its extent records in 1 MiB batches per worker. Tiny
  // chunks (about 150 bytes) make the abandoned writer below fill and write
  // several of those, so it really leaves index records behind, as a large
  // import does.
  StoreOptions options = testing::TestOptions();
  options.chunking.generic = {64, 128, 1024};
  auto store = Open(options);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, src, "kept"));
  const StoreStats before = StatsOf(*store);

  testing::WriteRandomFile(tmp_.Sub("big"), 8u << 20, 35);
  {
    SnapshotSpec spec;
    spec.name = "ghost";
    ASSERT_OK_AND_ASSIGN(auto writer, store->BeginSnapshot(spec));
    const int fd = open(tmp_.Sub("big").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    FileEntry e;
    e.path = "big";
    e.mode = 0600;
    const Status s = writer->AddFile(e, fd);
    close(fd);
    ASSERT_OK(s);
    // Another name is taken while the writer lives.
    EXPECT_CODE(store->BeginSnapshot(spec), StatusCode::kAlreadyExists);
    // Destroyed without Commit().
  }
  EXPECT_CODE(store->Get("ghost"), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(auto list, store->List());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, "kept");
  EXPECT_GT(StatsOf(*store).chunk_count, before.chunk_count) << "the writer's chunks were written";

  ASSERT_OK_AND_ASSIGN(GcReport gc, store->Gc());
  EXPECT_GE(gc.orphan_records_deleted, 1u);
  EXPECT_GE(gc.chunks_deleted, 1u);
  EXPECT_EQ(StatsOf(*store).chunk_count, before.chunk_count);
  ExpectFsckClean(*store);
  EXPECT_TRUE(ExportMatches(*store, "kept", src, tmp_.path()));

  // The name was released with the writer.
  ASSERT_OK(Import(*store, src, "ghost"));
  EXPECT_TRUE(ExportMatches(*store, "ghost", src, tmp_.path()));
}

TEST_F(SnapshotTest, WriterRejectsBadPathsAndKeepsGoodEntries) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  SnapshotSpec spec;
  spec.name = "paths";
  ASSERT_OK_AND_ASSIGN(auto writer, store->BeginSnapshot(spec));
  FileEntry d;
  d.type = FileType::kDirectory;
  d.mode = 0755;
  for (const char* bad : {"", "/abs", "a/../b", "a//b", "./a", "a/", ".."}) {
    d.path = bad;
    EXPECT_CODE(writer->AddEntry(d), StatusCode::kInvalidArgument) << "path '" << bad << "'";
  }
  d.path = "ok";
  ASSERT_OK(writer->AddEntry(d));
  EXPECT_CODE(writer->AddEntry(d), StatusCode::kInvalidArgument) << "added twice";
  FileEntry reg;
  reg.path = "needs-data";
  EXPECT_CODE(writer->AddEntry(reg), StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, writer->Commit());
  EXPECT_EQ(info.file_count, 1u);
  ASSERT_OK_AND_ASSIGN(auto files, store->ListFiles("paths"));
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].path, "ok");
  EXPECT_EQ(files[0].type, FileType::kDirectory);
}

TEST_F(SnapshotTest, AutomaticNamesAreNumbersThatDoNotCollide) {
  const std::string src = tmp_.Sub("src");
  testing::MakeDirs(src);
  testing::WriteFile(src + "/f", "x");
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(Import(*store, src, "2"));  // takes a number the store might pick
  std::set<std::string> ids = {"2"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(SnapshotInfo info, Import(*store, src, ""));
    EXPECT_FALSE(info.id.empty());
    EXPECT_EQ(info.id.find_first_not_of("0123456789"), std::string::npos) << info.id;
    EXPECT_TRUE(ids.insert(info.id).second) << "id " << info.id << " handed out twice";
  }
  ASSERT_OK_AND_ASSIGN(auto list, store->List());
  EXPECT_EQ(list.size(), 4u);
  for (size_t i = 1; i < list.size(); ++i)
    EXPECT_LT(list[i - 1].key, list[i].key) << "oldest first";
}

TEST_F(SnapshotTest, ConcurrentImportsOfSharedDataStoreEachChunkOnce) {
  // Two imports at once that share most of their data, a reader of an
  // older snapshot and a gc beside them: every chunk is stored and counted
  // once, and everything reads back.
  const std::string a = tmp_.Sub("a"), b = tmp_.Sub("b"), old = tmp_.Sub("old");
  for (const auto& d : {a, b, old}) testing::MakeDirs(d);
  const std::string shared = testing::RandomBytes(6u << 20, 41);
  testing::WriteFile(a + "/shared.bin", shared);
  testing::WriteFile(b + "/also-shared.bin", shared);
  testing::WriteRandomFile(a + "/only-a.bin", 2u << 20, 42);
  testing::WriteRandomFile(b + "/only-b.bin", 2u << 20, 43);
  const std::string old_data = testing::RandomBytes(3u << 20, 44);
  testing::WriteFile(old + "/old.bin", old_data);

  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo old_info, Import(*store, old, "old"));
  ASSERT_OK_AND_ASSIGN(auto reader, store->OpenFile("old", "old.bin"));

  Result<SnapshotInfo> ia = Status::Internal("not run"), ib = Status::Internal("not run");
  std::atomic<bool> done{false};
  std::atomic<int> bad_reads{0};
  std::thread reader_thread([&] {
    Rng rng(45);
    std::string buf;
    while (!done.load()) {
      const uint64_t off = rng.Uniform(0, old_data.size() - 1);
      buf.assign(rng.Uniform(1, 300000), '\0');
      auto n = reader->Pread(off, buf.size(), buf.data());
      if (!n.ok() || std::memcmp(buf.data(), old_data.data() + off, *n) != 0) ++bad_reads;
    }
  });
  std::thread ta([&] { ia = Import(*store, a, "a"); });
  std::thread tb([&] { ib = Import(*store, b, "b"); });
  auto gc = store->Gc();  // waits for the writers, or runs before them
  ta.join();
  tb.join();
  done = true;
  reader_thread.join();
  ASSERT_OK(gc);
  ASSERT_OK(ia);
  ASSERT_OK(ib);
  EXPECT_EQ(bad_reads.load(), 0);

  // Unique chunks: old.bin's, shared.bin's once, and each only-*.bin's.
  uint64_t unique = old_info.chunk_count;
  ASSERT_OK_AND_ASSIGN(auto files_a, store->ListFiles("a"));
  ASSERT_OK_AND_ASSIGN(auto files_b, store->ListFiles("b"));
  for (const auto& f : files_a) unique += f.chunk_count;
  for (const auto& f : files_b) {
    if (f.path == "only-b.bin") unique += f.chunk_count;
  }
  EXPECT_EQ(ia->new_chunks + ib->new_chunks, unique - old_info.chunk_count);
  const StoreStats stats = StatsOf(*store);
  EXPECT_EQ(stats.chunk_count, unique);
  EXPECT_TRUE(ExportMatches(*store, "a", a, tmp_.path()));
  EXPECT_TRUE(ExportMatches(*store, "b", b, tmp_.path()));
  EXPECT_TRUE(ExportMatches(*store, "old", old, tmp_.path()));
  ExpectFsckClean(*store);
}

// --- one process per store ------------------------------------------------------------

TEST_F(SnapshotTest, SecondOpenerOfAStoreGetsBusy) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_CODE(Store::Open(store_dir_, testing::TestOptions()), StatusCode::kBusy);

  // The CLI's commands that change the store are refused (those that only
  // read open it beside the holder: read_only_store_test.cc).
  std::string out, err;
  EXPECT_EQ(testing::RunCli({"--store", store_dir_, "gc"}, &out, &err), 1);
  EXPECT_EQ(err.rfind("gpuckpt: ", 0), 0u) << err;
  EXPECT_NE(err.find("in use"), std::string::npos) << err;
  EXPECT_NE(err.find(std::to_string(getpid())), std::string::npos) << "names the holder: " << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one line: " << err;

  store.reset();
  EXPECT_EQ(testing::RunCli({"--store", store_dir_, "ls"}, &out, &err), 0) << err;
}

TEST_F(SnapshotTest, CliImportExportListRemoveGcFsckStats) {
  const std::string src = tmp_.Sub("src");
  testing::MakeCheckpointTree(src, 3, 4u << 20);
  std::string out, err;
  // Commands other than import do not create a store.
  EXPECT_EQ(testing::RunCli({"--store", store_dir_, "ls"}, &out, &err), 1);
  EXPECT_NE(access(store_dir_.c_str(), F_OK), 0);

  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "import", src, "--name", "cli"}, &out, &err), 0)
      << err;
  EXPECT_EQ(out, "cli\n");
  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "import", src}, &out, &err), 0) << err;
  const std::string auto_id = out.substr(0, out.find('\n'));
  EXPECT_FALSE(auto_id.empty());
  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "ls", "--json"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("\"id\": \"cli\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"id\": \"" + auto_id + "\""), std::string::npos) << out;
  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "export", "cli", tmp_.Sub("out")}, &out, &err),
            0)
      << err;
  EXPECT_TRUE(testing::TreesEqual(src, tmp_.Sub("out")));
  EXPECT_EQ(
      testing::RunCli({"--store", store_dir_, "export", "nope", tmp_.Sub("out2")}, &out, &err), 1);
  EXPECT_NE(err.find("No such file or directory"), std::string::npos) << err;
  EXPECT_EQ(err.find("NotFound"), std::string::npos) << err;
  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "rm", auto_id}, &out, &err), 0) << err;
  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "gc"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("deleted 0 chunks"), std::string::npos) << "the chunks are shared: " << out;
  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "fsck"}, &out, &err), 0) << out << err;
  EXPECT_TRUE(out.empty()) << out;
  ASSERT_EQ(testing::RunCli({"--store", store_dir_, "stats", "--json"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("\"snapshot_count\": 1"), std::string::npos) << out;
}

TEST_F(SnapshotTest, CliUsageErrorsExitWithStatus2) {
  // As documented in tools/gpuckpt/main.cc: 2 means bad usage.
  std::string out, err;
  EXPECT_EQ(testing::RunCli({"--store", store_dir_, "bogus"}, &out, &err), 2) << err;
  EXPECT_EQ(testing::RunCli({"--store", store_dir_}, &out, &err), 2) << err;
  EXPECT_EQ(testing::RunCli({"--store", store_dir_, "export", "only-an-id"}, &out, &err), 2) << err;
  EXPECT_EQ(testing::RunCli({"--store", store_dir_, "--zstd-level", "99", "ls"}, &out, &err), 2)
      << err;
  EXPECT_NE(access(store_dir_.c_str(), F_OK), 0) << "a usage error touched the store";
}

}  // namespace
}  // namespace gpuckpt
