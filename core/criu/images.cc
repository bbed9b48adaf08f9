#include "core/criu/images.h"

#include <cstring>
#include <optional>
#include <string>

namespace gpuckpt {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// A bounds-checked cursor over one protobuf message. `base` is the message's
// offset in the file, so that errors point at the byte that is wrong.
class ProtoReader {
 public:
  ProtoReader(std::string_view bytes, size_t base, std::string_view file)
      : bytes_(bytes), base_(base), file_(file) {}

  bool done() const { return pos_ == bytes_.size(); }

  Status Corrupt(std::string_view what) const {
    return Status::Corruption(std::string(file_) + ": offset " + std::to_string(base_ + pos_) +
                              ": " + std::string(what));
  }

  Result<uint64_t> Varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ == bytes_.size()) return Corrupt("truncated varint");
      const uint8_t byte = static_cast<uint8_t>(bytes_[pos_++]);
      // The tenth byte may only carry the top bit of a 64-bit value.
      if (shift == 63 && byte > 1) return Corrupt("varint overflows 64 bits");
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return Corrupt("varint longer than 10 bytes");
  }

  Result<uint32_t> Uint32() {
    GPUCKPT_ASSIGN_OR_RETURN(uint64_t v, Varint());
    if (v > UINT32_MAX) return Corrupt("uint32 field out of range");
    return static_cast<uint32_t>(v);
  }

  // Reads a tag; sets `field` and `wire`.
  Status Tag(uint32_t* field, uint32_t* wire) {
    GPUCKPT_ASSIGN_OR_RETURN(uint64_t tag, Varint());
    if (tag >> 3 == 0 || tag >> 3 > 0x1fffffff) return Corrupt("bad field number");
    *field = static_cast<uint32_t>(tag >> 3);
    *wire = static_cast<uint32_t>(tag & 7);
    return Status::Ok();
  }

  // A length-delimited payload, as a reader positioned at its start.
  Result<ProtoReader> Sub() {
    GPUCKPT_ASSIGN_OR_RETURN(uint64_t len, Varint());
    if (len > bytes_.size() - pos_) return Corrupt("length-delimited field runs past the end");
    ProtoReader sub(bytes_.substr(pos_, len), base_ + pos_, file_);
    pos_ += len;
    return sub;
  }

  Status Skip(uint32_t wire) {
    switch (wire) {
      case kVarint:
        return Varint().status();
      case kFixed64:
        return Advance(8);
      case kFixed32:
        return Advance(4);
      case kLengthDelimited:
        return Sub().status();
      default:
        return Corrupt("unsupported wire type " + std::to_string(wire));
    }
  }

  // A repeated uint32, packed (one length-delimited run) or not.
  Status AppendUint32(uint32_t wire, std::vector<uint32_t>* out) {
    if (wire == kVarint) {
      GPUCKPT_ASSIGN_OR_RETURN(uint32_t v, Uint32());
      out->push_back(v);
      return Status::Ok();
    }
    if (wire != kLengthDelimited) return Corrupt("repeated uint32 with wrong wire type");
    GPUCKPT_ASSIGN_OR_RETURN(ProtoReader packed, Sub());
    while (!packed.done()) {
      GPUCKPT_ASSIGN_OR_RETURN(uint32_t v, packed.Uint32());
      out->push_back(v);
    }
    return Status::Ok();
  }

  Status ScalarUint32(uint32_t wire, uint32_t* out) {
    if (wire != kVarint) return Corrupt("uint32 field with wrong wire type");
    GPUCKPT_ASSIGN_OR_RETURN(*out, Uint32());
    return Status::Ok();
  }

 private:
  Status Advance(size_t n) {
    if (n > bytes_.size() - pos_) return Corrupt("fixed-size field runs past the end");
    pos_ += n;
    return Status::Ok();
  }

  std::string_view bytes_;
  size_t pos_ = 0;
  size_t base_;
  std::string_view file_;
};

uint32_t LoadU32(std::string_view bytes, size_t pos) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + pos, sizeof(v));
  return v;
}

// Checks the two magics and splits the rest into records.
Result<std::vector<ProtoReader>> SplitImage(std::string_view bytes, uint32_t type_magic,
                                            std::string_view file,
                                            uint32_t head_magic = kCriuImgCommonMagic) {
  const ProtoReader at_start(bytes, 0, file);
  if (bytes.size() < 8) return at_start.Corrupt("too short for the image magic");
  if (LoadU32(bytes, 0) != head_magic) return at_start.Corrupt("wrong head magic");
  if (LoadU32(bytes, 4) != type_magic) return at_start.Corrupt("wrong image type magic");
  std::vector<ProtoReader> records;
  size_t pos = 8;
  while (pos < bytes.size()) {
    const ProtoReader here(bytes.substr(pos), pos, file);
    if (bytes.size() - pos < 4) return here.Corrupt("truncated record length");
    const uint32_t len = LoadU32(bytes, pos);
    if (len > bytes.size() - pos - 4) return here.Corrupt("record runs past the end of the file");
    records.emplace_back(bytes.substr(pos + 4, len), pos + 4, file);
    pos += 4 + size_t{len};
  }
  return records;
}

Result<CriuTask> ParseTask(ProtoReader r) {
  CriuTask task;
  uint32_t seen = 0;
  while (!r.done()) {
    uint32_t field = 0, wire = 0;
    GPUCKPT_RETURN_IF_ERROR(r.Tag(&field, &wire));
    uint32_t* scalar[] = {nullptr, &task.pid, &task.ppid, &task.pgid, &task.sid};
    if (field >= 1 && field <= 4) {
      GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, scalar[field]));
      seen |= 1u << field;
    } else if (field == 5) {
      GPUCKPT_RETURN_IF_ERROR(r.AppendUint32(wire, &task.threads));
    } else {
      GPUCKPT_RETURN_IF_ERROR(r.Skip(wire));
    }
  }
  if (seen != 0x1e) return r.Corrupt("pstree_entry lacks a required field");
  return task;
}

Result<CriuCreds> ParseCreds(ProtoReader r) {
  CriuCreds c;
  uint32_t* scalar[] = {nullptr, &c.uid,  &c.gid,   &c.euid, &c.egid,
                        &c.suid, &c.sgid, &c.fsuid, &c.fsgid};
  std::vector<uint32_t>* repeated[] = {&c.cap_inh, &c.cap_prm, &c.cap_eff, &c.cap_bnd};
  uint32_t seen = 0;
  while (!r.done()) {
    uint32_t field = 0, wire = 0;
    GPUCKPT_RETURN_IF_ERROR(r.Tag(&field, &wire));
    if (field >= 1 && field <= 8) {
      GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, scalar[field]));
      seen |= 1u << field;
    } else if (field >= 9 && field <= 12) {
      GPUCKPT_RETURN_IF_ERROR(r.AppendUint32(wire, repeated[field - 9]));
    } else if (field == 13) {
      GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, &c.secbits));
      seen |= 1u << field;
    } else if (field == 14) {
      GPUCKPT_RETURN_IF_ERROR(r.AppendUint32(wire, &c.groups));
    } else if (field == 19) {
      GPUCKPT_RETURN_IF_ERROR(r.AppendUint32(wire, &c.cap_amb));
    } else {
      GPUCKPT_RETURN_IF_ERROR(r.Skip(wire));
    }
  }
  if (seen != 0x21fe) return r.Corrupt("creds_entry lacks a required field");
  return c;
}

// The last occurrence of embedded message `want` in `r` (protobuf merges
// repeated occurrences; the last one wins for what we read), if any.
Result<std::optional<ProtoReader>> FindMessage(ProtoReader r, uint32_t want) {
  std::optional<ProtoReader> found;
  while (!r.done()) {
    uint32_t field = 0, wire = 0;
    GPUCKPT_RETURN_IF_ERROR(r.Tag(&field, &wire));
    if (field != want) {
      GPUCKPT_RETURN_IF_ERROR(r.Skip(wire));
      continue;
    }
    if (wire != kLengthDelimited) return r.Corrupt("embedded message with wrong wire type");
    GPUCKPT_ASSIGN_OR_RETURN(ProtoReader sub, r.Sub());
    found = sub;
  }
  return found;
}

}  // namespace

Result<std::vector<CriuTask>> ParsePstreeImage(std::string_view bytes, std::string_view file_name) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<ProtoReader> records,
                           SplitImage(bytes, kCriuPstreeMagic, file_name));
  std::vector<CriuTask> tasks;
  for (const ProtoReader& record : records) {
    GPUCKPT_ASSIGN_OR_RETURN(CriuTask task, ParseTask(record));
    tasks.push_back(std::move(task));
  }
  if (tasks.empty()) return ProtoReader(bytes, 0, file_name).Corrupt("no tasks in pstree image");
  return tasks;
}

Result<CriuCreds> ParseCoreCreds(std::string_view bytes, std::string_view file_name) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<ProtoReader> records,
                           SplitImage(bytes, kCriuCoreMagic, file_name));
  if (records.size() != 1) {
    return ProtoReader(bytes, 0, file_name)
        .Corrupt("core image holds " + std::to_string(records.size()) + " records");
  }
  // Every field is walked, so that a malformed record fails even where the
  // creds themselves are intact.
  GPUCKPT_ASSIGN_OR_RETURN(std::optional<ProtoReader> thread_core, FindMessage(records[0], 5));
  if (!thread_core) return Status::NotFound(std::string(file_name) + ": no thread_core");
  GPUCKPT_ASSIGN_OR_RETURN(std::optional<ProtoReader> creds, FindMessage(*thread_core, 10));
  if (!creds) return Status::NotFound(std::string(file_name) + ": no creds in thread_core");
  return ParseCreds(*creds);
}

Result<CriuPagemap> ParsePagemapImage(std::string_view bytes, std::string_view file_name) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<ProtoReader> records,
                           SplitImage(bytes, kCriuPagemapMagic, file_name));
  if (records.empty()) return ProtoReader(bytes, 0, file_name).Corrupt("no pagemap head");
  CriuPagemap map;
  {
    ProtoReader r = records[0];
    bool seen = false;
    while (!r.done()) {
      uint32_t field = 0, wire = 0;
      GPUCKPT_RETURN_IF_ERROR(r.Tag(&field, &wire));
      if (field == 1) {
        GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, &map.pages_id));
        seen = true;
      } else {
        GPUCKPT_RETURN_IF_ERROR(r.Skip(wire));
      }
    }
    if (!seen) return r.Corrupt("pagemap_head lacks pages_id");
  }
  for (size_t i = 1; i < records.size(); ++i) {
    ProtoReader r = records[i];
    CriuPagemapEntry e;
    uint32_t seen = 0, in_parent = 0;
    bool has_flags = false;
    while (!r.done()) {
      uint32_t field = 0, wire = 0;
      GPUCKPT_RETURN_IF_ERROR(r.Tag(&field, &wire));
      if (field == 1) {
        if (wire != kVarint) return r.Corrupt("vaddr with wrong wire type");
        GPUCKPT_ASSIGN_OR_RETURN(e.vaddr, r.Varint());
        seen |= 1;
      } else if (field == 2) {
        GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, &e.nr_pages));
        seen |= 2;
      } else if (field == 3) {
        GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, &in_parent));
      } else if (field == 4) {
        GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, &e.flags));
        has_flags = true;
      } else {
        GPUCKPT_RETURN_IF_ERROR(r.Skip(wire));
      }
    }
    if (seen != 3) return r.Corrupt("pagemap_entry lacks vaddr or nr_pages");
    if (!has_flags) e.flags = in_parent ? CriuPagemapEntry::kParent : CriuPagemapEntry::kPresent;
    map.entries.push_back(e);
  }
  return map;
}

Result<CriuDumpStats> ParseDumpStatsImage(std::string_view bytes, std::string_view file_name) {
  GPUCKPT_ASSIGN_OR_RETURN(std::vector<ProtoReader> records,
                           SplitImage(bytes, kCriuStatsMagic, file_name, kCriuImgServiceMagic));
  if (records.size() != 1) {
    return ProtoReader(bytes, 0, file_name)
        .Corrupt("stats image holds " + std::to_string(records.size()) + " records");
  }
  GPUCKPT_ASSIGN_OR_RETURN(std::optional<ProtoReader> dump, FindMessage(records[0], 1));
  if (!dump) return ProtoReader(bytes, 0, file_name).Corrupt("no dump_stats_entry");
  CriuDumpStats stats;
  ProtoReader r = *dump;
  uint32_t seen = 0;
  while (!r.done()) {
    uint32_t field = 0, wire = 0;
    GPUCKPT_RETURN_IF_ERROR(r.Tag(&field, &wire));
    uint32_t* times[] = {nullptr, &stats.freezing_us, &stats.frozen_us, &stats.memdump_us,
                         &stats.memwrite_us};
    if (field >= 1 && field <= 4) {
      GPUCKPT_RETURN_IF_ERROR(r.ScalarUint32(wire, times[field]));
      seen |= 1u << field;
    } else if (field == 5 || field == 7) {
      if (wire != kVarint) return r.Corrupt("page count with wrong wire type");
      GPUCKPT_ASSIGN_OR_RETURN(uint64_t pages, r.Varint());
      (field == 5 ? stats.pages_scanned : stats.pages_written) = pages;
    } else {
      GPUCKPT_RETURN_IF_ERROR(r.Skip(wire));
    }
  }
  if ((seen & 0x6) != 0x6) return r.Corrupt("dump_stats_entry lacks its times");
  return stats;
}

bool LooksLikeCriuImage(std::string_view first_bytes) {
  if (first_bytes.size() < 4) return false;
  const uint32_t magic = LoadU32(first_bytes, 0);
  return magic == kCriuImgCommonMagic || magic == kCriuImgServiceMagic ||
         magic == kCriuInventoryMagic;
}

}  // namespace gpuckpt
