#include "core/catalog/records.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/base/display_text.h"
#include "core/base/hex.h"
#include "core/base/time_text.h"
#include "core/store/chunk_codec.h"
#include "core/store/format.h"
#include "gpuckpt/store.h"

namespace gpuckpt {
namespace {

using nlohmann::json;

const char* FileTypeName(FileType t) {
  switch (t) {
    case FileType::kRegular:
      return "file";
    case FileType::kDirectory:
      return "dir";
    case FileType::kSymlink:
      return "symlink";
  }
  return "file";
}

json ChunkingToJson(const ChunkingOptions& c) {
  auto sizes = [](const ChunkSizes& s) {
    return json{{"min", s.min_size}, {"avg", s.avg_size}, {"max", s.max_size}};
  };
  return json{{"generic", sizes(c.generic)},
              {"pages", sizes(c.pages)},
              {"page_size", c.page_size},
              {"page_image_globs", c.page_image_globs}};
}

// Paths and symlink targets are bytes, and JSON strings must be UTF-8: a
// value that is not valid UTF-8 is kept exactly, as hex under "<key>_hex"
// instead of "<key>" (FORMAT.md).
void PutBytes(json& j, const std::string& key, const std::string& bytes) {
  if (IsValidUtf8(bytes)) {
    j[key] = bytes;
    return;
  }
  j[key + "_hex"] = LowerHex(bytes);
}

// Throws json::exception (as j.at() does) when neither form is there or
// the hex is malformed.
std::string GetBytes(const json& j, const std::string& key) {
  if (!j.contains(key + "_hex")) return j.at(key).get<std::string>();
  const std::string hex = j.at(key + "_hex").get<std::string>();
  if (hex.size() % 2 != 0) throw json::other_error::create(501, key + "_hex has odd length", &j);
  std::optional<std::string> bytes = ParseLowerHex(hex);
  if (!bytes) throw json::other_error::create(501, key + "_hex is not lower-case hex", &j);
  return *bytes;
}

json HolesToJson(const std::vector<FileHole>& holes) {
  json out = json::array();
  for (const FileHole& h : holes) out.push_back(json::array({h.offset, h.length}));
  return out;
}

// Holes as EncodeFileRecord() writes them: [offset, length] pairs in
// order, apart from each other, inside the file, at most kMaxFileHoles. A
// record that breaks this would make readers return zeros over data.
Result<std::vector<FileHole>> HolesFromJson(const json& j, uint64_t size) {
  if (!j.is_array() || j.size() > kMaxFileHoles)
    return Status::Corruption("file record: holes is not a list of at most " +
                              std::to_string(kMaxFileHoles));
  std::vector<FileHole> holes;
  uint64_t after = 0;  // a hole must start past the end of the one before
  for (const json& pair : j) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_unsigned() ||
        !pair[1].is_number_unsigned())
      return Status::Corruption("file record: a hole is not [offset, length]");
    const FileHole h{pair[0].get<uint64_t>(), pair[1].get<uint64_t>()};
    if (h.length == 0 || h.offset < after || h.offset > size || size - h.offset < h.length ||
        (!holes.empty() && h.offset == after))
      return Status::Corruption("file record: hole [" + std::to_string(h.offset) + ", +" +
                                std::to_string(h.length) + ") is out of order or outside the file");
    holes.push_back(h);
    after = h.end();
  }
  return holes;
}

}  // namespace

Status ValidateSnapshotName(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return Status::InvalidArgument("snapshot name must be 1 to 128 characters");
  }
  if (name[0] == '.' || name[0] == '-') {
    return Status::InvalidArgument("snapshot name '" + std::string(name) +
                                   "' must not start with '.' or '-'");
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status::InvalidArgument("snapshot name '" + std::string(name) +
                                     "' may only hold letters, digits, '.', '_' and '-'");
    }
  }
  return Status::Ok();
}

Status ValidateEntryPath(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.size() > 4096) {
    return Status::InvalidArgument("bad path '" + std::string(path) + "' in snapshot");
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string_view::npos) {
      return Status::InvalidArgument("bad path '" + std::string(path) + "' in snapshot");
    }
    start = end + 1;
  }
  return Status::Ok();
}

std::string SnapshotInfoToJson(const SnapshotInfo& info, int indent) {
  json extra = json::object();
  if (!info.extra_json.empty()) {
    extra = json::parse(info.extra_json, nullptr, /*allow_exceptions=*/false);
    if (extra.is_discarded()) extra = json::object();
  }
  json j = {
      {"format", 1},
      {"id", info.id},
      {"created", Rfc3339Utc(info.created_ns, /*with_nanoseconds=*/true)},
      {"source", DisplayText(info.source)},
      {"files", info.file_count},
      {"logical_bytes", info.logical_bytes},
      {"chunks", info.chunk_count},
      {"new_chunks", info.new_chunks},
      {"new_bytes", info.new_bytes},
      {"stored_bytes", info.stored_bytes},
      {"duration_s", info.duration_s},
      {"commit_s", info.commit_s},
      {"sync_s", info.sync_s},
      {"chunking", ChunkingToJson(info.chunking)},
      {"extra", extra},
  };
  if (!info.base.empty()) {
    j["base"] = info.base;
    j["base_chunks"] = info.base_chunks;
  }
  // Only when set: records without it (all those written before domains
  // existed) are in the shared domain.
  if (info.dedup_domain) j["dedup_domain"] = *info.dedup_domain;
  if (!info.written_by.empty()) j["written_by"] = info.written_by;
  return j.dump(indent);
}

std::string SnapshotManifestJson(const SnapshotInfo& info) {
  return SnapshotInfoToJson(info, 2) + "\n";
}

std::string EncodeSnapshotRecord(const SnapshotInfo& info) {
  json j = json::parse(SnapshotInfoToJson(info));
  j["key"] = info.key;
  // Readers before `created` existed take the time from here; the store's
  // own record is read by nothing that loses digits.
  j["created_ns"] = info.created_ns;
  if (info.pool_incarnation != 0) j["pool_incarnation"] = info.pool_incarnation;
  std::string record(1, static_cast<char>(format::kSnapshotRecordVersion));
  record += j.dump();
  return record;
}

Result<SnapshotInfo> DecodeSnapshotRecord(std::string_view id, std::string_view record) {
  auto corrupt = [&](const std::string& why) {
    return Status::Corruption("manifest of snapshot '" + std::string(id) + "': " + why);
  };
  if (record.empty() || static_cast<uint8_t>(record[0]) != format::kSnapshotRecordVersion) {
    return corrupt("unknown record version");
  }
  json j = json::parse(record.substr(1), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return corrupt("not a JSON object");
  try {
    SnapshotInfo info;
    info.id = std::string(id);
    info.key = j.at("key").get<uint64_t>();
    info.created_ns = j.value("created_ns", int64_t{0});
    if (auto it = j.find("created"); it != j.end() && it->is_string()) {
      if (auto ns = ParseRfc3339Utc(it->get<std::string>())) info.created_ns = *ns;
    }
    info.source = j.value("source", std::string());
    info.file_count = j.value("files", uint64_t{0});
    info.logical_bytes = j.value("logical_bytes", uint64_t{0});
    info.chunk_count = j.value("chunks", uint64_t{0});
    info.new_chunks = j.value("new_chunks", uint64_t{0});
    info.new_bytes = j.value("new_bytes", uint64_t{0});
    info.stored_bytes = j.value("stored_bytes", uint64_t{0});
    info.duration_s = j.value("duration_s", 0.0);
    info.commit_s = j.value("commit_s", 0.0);
    info.sync_s = j.value("sync_s", 0.0);
    info.base = j.value("base", std::string());
    info.base_chunks = j.value("base_chunks", uint64_t{0});
    info.written_by = j.value("written_by", std::string());
    info.pool_incarnation = j.value("pool_incarnation", uint64_t{0});
    if (j.contains("dedup_domain")) {
      // A wrapped uid would name chunks in someone else's domain.
      const uint64_t uid = j.at("dedup_domain").get<uint64_t>();
      if (uid > UINT32_MAX) return corrupt("dedup_domain " + std::to_string(uid) + " is not a uid");
      info.dedup_domain = static_cast<uint32_t>(uid);
    }
    info.extra_json = j.contains("extra") ? j["extra"].dump() : "{}";
    if (j.contains("chunking")) {
      const json& c = j["chunking"];
      auto sizes = [](const json& s) {
        return ChunkSizes{s.at("min").get<uint32_t>(), s.at("avg").get<uint32_t>(),
                          s.at("max").get<uint32_t>()};
      };
      info.chunking.generic = sizes(c.at("generic"));
      info.chunking.pages = sizes(c.at("pages"));
      info.chunking.page_size = c.at("page_size").get<uint32_t>();
      info.chunking.page_image_globs = c.at("page_image_globs").get<std::vector<std::string>>();
    }
    return info;
  } catch (const json::exception& e) {
    return corrupt(e.what());
  }
}

std::string EncodeFileRecord(const FileEntry& e) {
  json j = {{"type", FileTypeName(e.type)},
            {"mode", e.mode},
            {"uid", e.uid},
            {"gid", e.gid},
            {"size", e.size},
            {"mtime_ns", e.mtime_ns},
            {"chunks", e.chunk_count},
            {"new_bytes", e.new_bytes},
            {"stored_bytes", e.stored_bytes}};
  PutBytes(j, "path", e.path);
  if (e.type == FileType::kSymlink) PutBytes(j, "target", e.symlink_target);
  // Only when there are any: a file without holes is the record older
  // builds wrote, and read.
  if (e.type == FileType::kRegular && !e.holes.empty()) j["holes"] = HolesToJson(e.holes);
  const bool spooled = e.type == FileType::kRegular && e.spooled;
  if (spooled) j["spooled"] = true;
  std::string record(1, static_cast<char>(spooled ? format::kSpooledFileRecordVersion
                                                  : format::kFileRecordVersion));
  record += j.dump();
  return record;
}

Result<FileEntry> DecodeFileRecord(std::string_view record) {
  const uint8_t version = record.empty() ? 0 : static_cast<uint8_t>(record[0]);
  if (version != format::kFileRecordVersion && version != format::kSpooledFileRecordVersion) {
    return Status::Corruption("file record with unknown version");
  }
  json j = json::parse(record.substr(1), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Corruption("file record is not a JSON object");
  try {
    FileEntry e;
    e.path = GetBytes(j, "path");
    const std::string type = j.at("type").get<std::string>();
    if (type == "file") {
      e.type = FileType::kRegular;
    } else if (type == "dir") {
      e.type = FileType::kDirectory;
    } else if (type == "symlink") {
      e.type = FileType::kSymlink;
      e.symlink_target = GetBytes(j, "target");
    } else {
      return Status::Corruption("file record of unknown type '" + type + "'");
    }
    e.mode = j.at("mode").get<uint32_t>() & 07777;
    e.uid = j.at("uid").get<uint32_t>();
    e.gid = j.at("gid").get<uint32_t>();
    e.size = j.at("size").get<uint64_t>();
    e.mtime_ns = j.value("mtime_ns", int64_t{0});
    e.chunk_count = j.value("chunks", uint64_t{0});
    e.new_bytes = j.value("new_bytes", uint64_t{0});
    e.stored_bytes = j.value("stored_bytes", uint64_t{0});
    if (auto holes = j.find("holes"); holes != j.end()) {
      if (e.type != FileType::kRegular)
        return Status::Corruption("file record: holes in a " + type + " record");
      GPUCKPT_ASSIGN_OR_RETURN(e.holes, HolesFromJson(*holes, e.size));
    }
    e.spooled = j.value("spooled", false);
    if (e.spooled != (version == format::kSpooledFileRecordVersion) ||
        (e.spooled && e.type != FileType::kRegular)) {
      return Status::Corruption("file record: 'spooled' does not match its version");
    }
    GPUCKPT_RETURN_IF_ERROR(ValidateEntryPath(e.path).WithContext("file record"));
    return e;
  } catch (const json::exception& ex) {
    return Status::Corruption(std::string("file record: ") + ex.what());
  }
}

const FileHole* HoleContaining(const std::vector<FileHole>& holes, uint64_t offset) {
  // The last hole starting at or before `offset`.
  auto it = std::upper_bound(holes.begin(), holes.end(), offset,
                             [](uint64_t o, const FileHole& h) { return o < h.offset; });
  if (it == holes.begin()) return nullptr;
  --it;
  return offset < it->end() ? &*it : nullptr;
}

std::string EncodeExtentRecord(const ChunkHash& hash, uint64_t seq, uint64_t length,
                               const std::optional<ChunkFingerprint>& fingerprint) {
  std::string record(1, static_cast<char>(format::kExtentRecordVersion));
  record.append(hash.view());
  PutVarint64(&record, seq);
  PutVarint64(&record, length);
  if (fingerprint) record.append(fingerprint->view());
  return record;
}

Result<Extent> DecodeExtentRecord(uint64_t offset, std::string_view record) {
  if (record.size() < 1 + format::kChunkHashSize + 1 ||
      static_cast<uint8_t>(record[0]) != format::kExtentRecordVersion) {
    return Status::Corruption("malformed extent record at offset " + std::to_string(offset));
  }
  Extent e;
  e.offset = offset;
  GPUCKPT_ASSIGN_OR_RETURN(e.hash, ChunkHash::FromBytes(record.substr(1, format::kChunkHashSize)));
  std::string_view rest = record.substr(1 + format::kChunkHashSize);
  if (!GetVarint64(&rest, &e.seq) || !GetVarint64(&rest, &e.length) || e.length == 0 ||
      e.length > format::kMaxChunkSize) {
    return Status::Corruption("extent at offset " + std::to_string(offset) + " has a bad length");
  }
  // The fingerprint was added as a trailing field: older extents end here.
  if (rest.size() >= format::kFingerprintSize) {
    GPUCKPT_ASSIGN_OR_RETURN(e.fingerprint,
                             ChunkFingerprint::FromBytes(rest.substr(0, format::kFingerprintSize)));
  }
  return e;
}

}  // namespace gpuckpt
