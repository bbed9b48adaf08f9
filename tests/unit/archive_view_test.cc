// archives/<id>.tar (fs/archive_view.h) on a real store: which stored files
// become which members, in which order; that each member starts where the
// previous one's padded data ends and the size is known before any read;
// that reads of any length at any offset (inside a header, across a
// header, data and padding, into the trailer) give the bytes of one
// sequential read; that libarchive reads the result back as the stored
// files; that an open archive keeps reading the checkpoint it was opened
// on; and how StoreView shows archives/ to the owner and to others.
#include "fs/archive_view.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fs/store_view.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::TempDir;

constexpr uint32_t kOwner = 4242;

FileEntry Regular(const std::string& path, uint64_t size, uint32_t uid = 0) {
  FileEntry e;
  e.path = path;
  e.type = FileType::kRegular;
  e.mode = 0644;
  e.uid = uid;
  e.gid = uid;
  e.size = size;
  e.mtime_ns = 1700000000123456789;
  return e;
}

// What libarchive reads back from a tar: each member's header fields and data.
struct ReadMember {
  std::string name;
  mode_t type = 0;
  mode_t perm = 0;
  int64_t uid = 0, gid = 0;
  int64_t size = 0;
  int64_t mtime = 0;
  std::string symlink;
  std::string data;
};

std::vector<ReadMember> ReadBack(const std::string& tar, std::string* error) {
  std::vector<ReadMember> out;
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  if (archive_read_open_memory(a, tar.data(), tar.size()) != ARCHIVE_OK) {
    *error = archive_error_string(a);
    archive_read_free(a);
    return out;
  }
  struct archive_entry* entry = nullptr;
  int r;
  while ((r = archive_read_next_header(a, &entry)) == ARCHIVE_OK) {
    ReadMember m;
    m.name = archive_entry_pathname(entry);
    m.type = archive_entry_filetype(entry);
    m.perm = archive_entry_perm(entry);
    m.uid = archive_entry_uid(entry);
    m.gid = archive_entry_gid(entry);
    m.size = archive_entry_size(entry);
    m.mtime = archive_entry_mtime(entry);
    if (archive_entry_symlink(entry) != nullptr) m.symlink = archive_entry_symlink(entry);
    char buf[65536];
    la_ssize_t n;
    while ((n = archive_read_data(a, buf, sizeof(buf))) > 0) m.data.append(buf, n);
    if (n < 0) *error = archive_error_string(a);
    out.push_back(std::move(m));
  }
  if (r != ARCHIVE_EOF) *error = archive_error_string(a);
  archive_read_free(a);
  return out;
}

std::string ReadRange(FileReader& reader, uint64_t offset, size_t len) {
  std::string out(len, '\xAA');
  auto n = reader.Pread(offset, len, out.data());
  EXPECT_OK(n);
  if (!n.ok()) return "";
  out.resize(*n);
  return out;
}

// The whole file in one read.
std::string ReadWhole(FileReader& reader) { return ReadRange(reader, 0, reader.entry().size); }

TEST(TarHeaderTest, PlainUstarAndDeterministic) {
  FileEntry e = Regular("checkpoint/pages-1.img", 12345, 1000);
  ASSERT_OK_AND_ASSIGN(std::string a, TarHeader(e));
  ASSERT_OK_AND_ASSIGN(std::string b, TarHeader(e));
  EXPECT_EQ(a.size(), 512u);  // restricted pax: plain ustar where it fits
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.substr(257, 5), "ustar");
  EXPECT_EQ(a.substr(0, e.path.size() + 1), e.path + std::string(1, '\0'));
  // No user names from the host.
  EXPECT_EQ(a.substr(265, 32), std::string(32, '\0'));
  EXPECT_EQ(a.substr(297, 32), std::string(32, '\0'));
}

TEST(TarHeaderTest, WhatUstarCannotSayGoesIntoAPaxHeader) {
  // A name that cannot be split into ustar's prefix and name.
  FileEntry long_name = Regular("checkpoint/" + std::string(150, 'x'), 1);
  // Ids and sizes past ustar's fields.
  FileEntry big_uid = Regular("a", 1, 5000000);
  FileEntry huge = Regular("b", 9ull << 30);
  FileEntry link;
  link.path = "l";
  link.type = FileType::kSymlink;
  link.symlink_target = std::string(200, 't');
  for (const FileEntry& e : {long_name, big_uid, huge, link}) {
    ASSERT_OK_AND_ASSIGN(std::string h, TarHeader(e));
    EXPECT_GT(h.size(), 512u) << e.path;
    EXPECT_EQ(h.size() % 512, 0u) << e.path;
    EXPECT_EQ(h[156], 'x') << e.path;  // the pax extended header comes first
    ASSERT_OK_AND_ASSIGN(std::string again, TarHeader(e));
    EXPECT_EQ(h, again) << e.path;
    // libarchive reads back what was meant (data: zeros, of the size said).
    std::string tar = h;
    const uint64_t data = e.type == FileType::kRegular ? e.size : 0;
    if (data < (1u << 20)) {
      tar += std::string((data + 511) / 512 * 512, '\0') + std::string(1024, '\0');
      std::string error;
      auto members = ReadBack(tar, &error);
      ASSERT_EQ(members.size(), 1u) << error;
      EXPECT_EQ(members[0].name, e.path);
      EXPECT_EQ(members[0].uid, e.uid);
      EXPECT_EQ(members[0].symlink, e.symlink_target);
    }
  }
}

TEST(ArchiveIdTest, NamesAndIds) {
  EXPECT_EQ(ArchiveFileName("ckpt-1"), "ckpt-1.tar");
  EXPECT_EQ(ArchiveIdOf("ckpt-1.tar"), std::optional<std::string>("ckpt-1"));
  EXPECT_EQ(ArchiveIdOf("x.tar.tar"), std::optional<std::string>("x.tar"));
  EXPECT_EQ(ArchiveIdOf(".tar"), std::nullopt);
  EXPECT_EQ(ArchiveIdOf("ckpt-1"), std::nullopt);
  EXPECT_EQ(ArchiveIdOf("ckpt-1.tgz"), std::nullopt);
}

class ArchiveViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
  }

  void Add(SnapshotWriter* writer, const std::string& path, const std::string& bytes,
           uint32_t mode = 0600) {
    FileEntry e;
    e.path = path;
    e.mode = mode;
    e.uid = kOwner;
    e.gid = kOwner;
    e.mtime_ns = 1600000000000000000;
    ASSERT_OK(testing::AddBytes(writer, e, bytes));
    contents_[path] = bytes;
  }

  void AddEntry(SnapshotWriter* writer, const std::string& path, FileType type,
                const std::string& target = "") {
    FileEntry e;
    e.path = path;
    e.type = type;
    e.mode = type == FileType::kDirectory ? 0750 : 0777;
    e.uid = kOwner;
    e.gid = kOwner;
    e.symlink_target = target;
    e.mtime_ns = 1600000000000000000;
    ASSERT_OK(writer->AddEntry(e));
  }

  // A snapshot as a Podman import leaves it: images/ and container/, plus
  // files the archive leaves out. Sizes around 512 so that members end on,
  // just before and just after block boundaries.
  void AddPodmanLike(const std::string& id, uint64_t seed) {
    nlohmann::json extra = {{"owner", {{"uid", kOwner}, {"gid", kOwner}}}};
    auto writer = store_->BeginSnapshot({id, "test", extra.dump(), "", std::nullopt});
    ASSERT_OK(writer);
    SnapshotWriter* w = writer->get();
    AddEntry(w, "images", FileType::kDirectory);
    Add(w, "images/core-1.img", testing::RandomBytes(511, seed));
    Add(w, "images/empty.img", "");
    Add(w, "images/inventory.img", testing::RandomBytes(512, seed + 1));
    Add(w, "images/pages-1.img", testing::RandomBytes(300000, seed + 2));
    Add(w, "images/pagemap-1.img", testing::RandomBytes(513, seed + 3));
    Add(w, "images/" + std::string(120, 'L') + ".img", testing::RandomBytes(7, seed + 4));
    AddEntry(w, "images/link", FileType::kSymlink, "pages-1.img");
    AddEntry(w, "container", FileType::kDirectory);
    Add(w, "container/config.dump", "{\"id\":\"" + id + "\"}\n");
    Add(w, "container/spec.dump", "{\"ociVersion\":\"1.0.0\"}\n");
    Add(w, "container/artifacts/dump.log", testing::RandomBytes(1000, seed + 5));
    Add(w, "container/manifest.json", "shadow");  // would shadow gpuckpt's
    Add(w, "container/checkpoint/x", "shadow");   // would mix into checkpoint/
    Add(w, "device/cuda-1.bin", "old layout");    // left out
    Add(w, "other.txt", "left out");
    ASSERT_OK((*writer)->Commit().status());
  }

  Result<std::shared_ptr<const ArchiveLayout>> Layout(const std::string& id) {
    GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store_->Get(id));
    GPUCKPT_ASSIGN_OR_RETURN(auto files, store_->ListFiles(id));
    return ArchiveLayout::Build(info, OwnerOf(info), files);
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
  std::map<std::string, std::string> contents_;  // stored path -> bytes
};

TEST_F(ArchiveViewTest, MembersInPodmanLayoutAndOrder) {
  AddPodmanLike("c1", 1);
  ASSERT_OK_AND_ASSIGN(auto layout, Layout("c1"));
  std::vector<std::string> names;
  for (const auto& m : layout->members()) names.push_back(m.entry.path);
  const std::vector<std::string> expected = {
      "manifest.json",
      "artifacts",  // no entry stored: shown as the owner's
      "artifacts/dump.log",
      "config.dump",
      "spec.dump",
      "checkpoint",
      "checkpoint/" + std::string(120, 'L') + ".img",
      "checkpoint/core-1.img",
      "checkpoint/empty.img",
      "checkpoint/inventory.img",
      "checkpoint/link",
      "checkpoint/pagemap-1.img",
      "checkpoint/pages-1.img",
  };
  EXPECT_EQ(names, expected);
  const auto& m = layout->members();
  EXPECT_EQ(m[0].entry.mode, 0400u);
  EXPECT_EQ(m[0].entry.uid, kOwner);
  EXPECT_EQ(m[1].entry.type, FileType::kDirectory);
  EXPECT_EQ(m[1].entry.mode, 0700u);
  EXPECT_EQ(m[5].entry.mode, 0750u);  // the stored images/ entry's
  EXPECT_EQ(m[10].entry.type, FileType::kSymlink);
  EXPECT_EQ(m[10].entry.size, 0u);
  ASSERT_TRUE(m[12].stored.has_value());
  EXPECT_EQ(m[12].stored->path, "images/pages-1.img");
  EXPECT_EQ(layout->file().path, "c1.tar");
  EXPECT_EQ(layout->file().mode, 0400u);
  EXPECT_EQ(layout->file().uid, kOwner);
}

TEST_F(ArchiveViewTest, OffsetsFollowFromTheListing) {
  AddPodmanLike("c1", 2);
  ASSERT_OK_AND_ASSIGN(auto layout, Layout("c1"));
  const auto& members = layout->members();
  uint64_t at = 0;
  for (const auto& m : members) {
    EXPECT_EQ(m.offset, at) << m.entry.path;
    EXPECT_EQ(m.header_size % 512, 0u) << m.entry.path;
    ASSERT_OK_AND_ASSIGN(std::string header, TarHeader(m.entry));
    EXPECT_EQ(header.size(), m.header_size) << m.entry.path;
    EXPECT_EQ(m.end() % 512, 0u);
    at = m.end();
  }
  EXPECT_EQ(layout->size(), at + 1024);
  // The long name needs a pax header; the others fit ustar.
  EXPECT_GT(members[6].header_size, 512u);
  EXPECT_EQ(members[7].header_size, 512u);
}

TEST_F(ArchiveViewTest, LibarchiveReadsBackTheStoredFiles) {
  AddPodmanLike("c1", 3);
  ASSERT_OK_AND_ASSIGN(auto layout, Layout("c1"));
  ASSERT_OK_AND_ASSIGN(auto reader, OpenArchive(store_.get(), layout));
  EXPECT_EQ(reader->entry().size, layout->size());
  const std::string tar = ReadWhole(*reader);
  ASSERT_EQ(tar.size(), layout->size());
  EXPECT_EQ(tar.substr(tar.size() - 1024), std::string(1024, '\0'));
  // Between a member's data and the next header: zeros.
  for (const auto& m : layout->members()) {
    const uint64_t data_end = m.offset + m.header_size + m.entry.size;
    EXPECT_EQ(tar.substr(data_end, m.end() - data_end), std::string(m.end() - data_end, '\0'))
        << m.entry.path;
  }
  std::string error;
  auto read = ReadBack(tar, &error);
  EXPECT_EQ(error, "");
  ASSERT_EQ(read.size(), layout->members().size());
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, store_->Get("c1"));
  for (size_t i = 0; i < read.size(); ++i) {
    const ArchiveMember& m = layout->members()[i];
    const ReadMember& r = read[i];
    EXPECT_EQ(r.name, m.entry.type == FileType::kDirectory ? m.entry.path + "/" : m.entry.path);
    EXPECT_EQ(r.uid, m.entry.uid) << r.name;
    EXPECT_EQ(r.perm, m.entry.mode) << r.name;
    EXPECT_EQ(r.mtime, m.entry.mtime_ns / 1000000000) << r.name;
    switch (m.entry.type) {
      case FileType::kRegular:
        EXPECT_EQ(r.type, AE_IFREG) << r.name;
        EXPECT_EQ(r.data, i == 0 ? SnapshotManifestJson(info) : contents_.at(m.stored->path))
            << r.name;
        break;
      case FileType::kDirectory:
        EXPECT_EQ(r.type, AE_IFDIR) << r.name;
        break;
      case FileType::kSymlink:
        EXPECT_EQ(r.type, AE_IFLNK) << r.name;
        EXPECT_EQ(r.symlink, "pages-1.img");
        break;
    }
  }
}

TEST_F(ArchiveViewTest, ReadsAtAnyOffsetAreSlicesOfTheWhole) {
  AddPodmanLike("c1", 4);
  ASSERT_OK_AND_ASSIGN(auto layout, Layout("c1"));
  ASSERT_OK_AND_ASSIGN(auto reader, OpenArchive(store_.get(), layout));
  const std::string whole = ReadWhole(*reader);
  ASSERT_EQ(whole.size(), layout->size());
  // Odd-sized reads, each crossing boundaries somewhere.
  for (size_t step : {1u, 7u, 511u, 513u, 4096u, 7777u, 1000000u}) {
    std::string pieced;
    for (uint64_t at = 0; at < whole.size(); at += step) pieced += ReadRange(*reader, at, step);
    EXPECT_EQ(pieced, whole) << "step " << step;
  }
  // Around every boundary: a header's start, where its data starts, where
  // its data ends (padding), and into the trailer.
  for (const auto& m : layout->members()) {
    const uint64_t data = m.offset + m.header_size;
    for (uint64_t at : {m.offset, data, data + m.entry.size, m.end()}) {
      for (uint64_t back : {0u, 1u, 3u}) {
        if (at < back) continue;
        for (size_t len : {1u, 2u, 5u, 600u, 1500u}) {
          const uint64_t from = at - back;
          EXPECT_EQ(ReadRange(*reader, from, len), whole.substr(from, len))
              << m.entry.path << " at " << from << " len " << len;
        }
      }
    }
  }
  // Past the end: nothing; across it: short.
  EXPECT_EQ(ReadRange(*reader, whole.size(), 10), "");
  EXPECT_EQ(ReadRange(*reader, whole.size() + 5000, 10), "");
  EXPECT_EQ(ReadRange(*reader, whole.size() - 3, 10), whole.substr(whole.size() - 3));
}

TEST_F(ArchiveViewTest, OnlyImagesGiveAnArchiveWithCheckpointDirectory) {
  // A plain process checkpoint: images/ files, no images/ directory entry,
  // no container/.
  {
    auto writer = store_->BeginSnapshot({"p1", "test", "", "", std::nullopt});
    ASSERT_OK(writer);
    Add(writer->get(), "images/core-1.img", "core");
    ASSERT_OK((*writer)->Commit().status());
  }
  ASSERT_OK_AND_ASSIGN(auto layout, Layout("p1"));
  std::vector<std::string> names;
  for (const auto& m : layout->members()) names.push_back(m.entry.path);
  EXPECT_EQ(names,
            (std::vector<std::string>{"manifest.json", "checkpoint", "checkpoint/core-1.img"}));
  EXPECT_EQ(layout->members()[1].entry.mode, 0700u);
  EXPECT_EQ(layout->members()[1].entry.uid, 0u);  // no owner recorded: root's
}

TEST_F(ArchiveViewTest, AnOpenArchiveKeepsReadingItsCheckpoint) {
  AddPodmanLike("c1", 5);
  ASSERT_OK_AND_ASSIGN(auto old_layout, Layout("c1"));
  ASSERT_OK_AND_ASSIGN(auto reader, OpenArchive(store_.get(), old_layout));
  const std::string before = ReadWhole(*reader);
  ASSERT_OK(store_->Remove("c1"));
  contents_.clear();
  AddPodmanLike("c1", 6);  // the same id, other bytes
  EXPECT_EQ(ReadWhole(*reader), before);
  // A layout of the removed incarnation opens no more.
  EXPECT_CODE(OpenArchive(store_.get(), old_layout), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(auto new_layout, Layout("c1"));
  ASSERT_OK_AND_ASSIGN(auto new_reader, OpenArchive(store_.get(), new_layout));
  EXPECT_NE(ReadWhole(*new_reader), before);
}

TEST_F(ArchiveViewTest, StoreViewShowsArchivesToTheOwnerAlone) {
  AddPodmanLike("c1", 7);
  StoreView view(store_.get(), nullptr);
  NodeId root_dir;
  const Caller root{};
  Caller owner;
  owner.uid = kOwner;
  owner.gid = kOwner;
  Caller other;
  other.uid = kOwner + 1;
  other.gid = kOwner + 1;

  ASSERT_OK_AND_ASSIGN(NodeId archives, view.Child(root_dir, "archives", root));
  EXPECT_EQ(archives.kind, NodeKind::kArchivesDir);
  for (const Caller& c : {root, owner}) {
    ASSERT_OK_AND_ASSIGN(auto children, view.Children(archives, c));
    ASSERT_EQ(children.size(), 1u);
    EXPECT_EQ(children[0].first, "c1.tar");
    ASSERT_OK_AND_ASSIGN(NodeId tar, view.Child(archives, "c1.tar", c));
    EXPECT_EQ(tar.kind, NodeKind::kArchive);
    ASSERT_OK_AND_ASSIGN(struct stat st, view.Attributes(tar, c));
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0400u);
    EXPECT_EQ(st.st_uid, kOwner);
    EXPECT_EQ(st.st_blocks, 0);
    ASSERT_OK_AND_ASSIGN(auto layout, Layout("c1"));
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout->size());
    ASSERT_OK_AND_ASSIGN(auto reader, view.OpenImage(tar));
    EXPECT_EQ(ReadWhole(*reader).size(), layout->size());
  }
  EXPECT_CODE(view.Child(archives, "c1", root), StatusCode::kNotFound);
  EXPECT_CODE(view.Child(archives, "nope.tar", root), StatusCode::kNotFound);
  // Someone else: absent, from lookups, attributes and listings alike.
  ASSERT_OK_AND_ASSIGN(auto listed, view.Children(archives, other));
  EXPECT_TRUE(listed.empty());
  EXPECT_CODE(view.Child(archives, "c1.tar", other), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(NodeId tar, view.Child(archives, "c1.tar", owner));
  EXPECT_CODE(view.Attributes(tar, other), StatusCode::kNotFound);

  // Removed: gone, and the old node stays gone once the id is reused.
  ASSERT_OK(view.RemoveSnapshot(NodeId{NodeKind::kSnapshotDir, "c1", tar.key, "", 0}, owner));
  EXPECT_CODE(view.Attributes(tar, owner), StatusCode::kNotFound);
  EXPECT_CODE(view.Child(archives, "c1.tar", owner), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(auto after, view.Children(archives, root));
  EXPECT_TRUE(after.empty());
  AddPodmanLike("c1", 8);
  view.Invalidate();
  EXPECT_CODE(view.Attributes(tar, owner), StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(NodeId again, view.Child(archives, "c1.tar", owner));
  EXPECT_NE(again.key, tar.key);
}

}  // namespace
}  // namespace gpuckpt
