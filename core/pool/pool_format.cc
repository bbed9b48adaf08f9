#include "core/pool/pool_format.h"

#include <fmt/format.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/base/big_endian.h"
#include "core/base/hex.h"
#include "core/store/chunk_codec.h"

namespace gpuckpt::pool {

namespace {

constexpr char kBodyMagic[] = "GPCKBODY";
constexpr uint32_t kBodyVersion = 1;
constexpr uint8_t kIndexEntryVersion = 1;
constexpr uint8_t kCatalogEntryVersion = 1;
constexpr uint8_t kExtentHasFingerprint = 1;

std::string Hex16(uint64_t v) { return fmt::format("{:016x}", v); }

std::optional<uint64_t> ParseHex16(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  auto bytes = ParseLowerHex(s);
  if (!bytes) return std::nullopt;
  return GetBigEndian(*bytes, 8);
}

bool TakeBytes(std::string_view* in, size_t n, std::string_view* out) {
  if (in->size() < n) return false;
  *out = in->substr(0, n);
  in->remove_prefix(n);
  return true;
}

}  // namespace

std::string MetaObject() { return "gpuckpt.meta"; }
std::string CatalogObject() { return "gpuckpt.catalog"; }
std::string GcObject() { return "gpuckpt.gc"; }
std::string NameObject(std::string_view id) { return fmt::format("gpuckpt.name.{}", id); }
std::string BodyObjectPrefix(std::string_view id) { return fmt::format("gpuckpt.body.{}.", id); }
std::string BodyObject(std::string_view id, uint64_t incarnation, uint32_t part) {
  return fmt::format("{}{}.{}", BodyObjectPrefix(id), Hex16(incarnation), part);
}
std::string IndexObject(unsigned shard) { return fmt::format("gpuckpt.index.{:02x}", shard); }
unsigned IndexShardOf(const ChunkHash& hash) { return hash.bytes[0] % kIndexShards; }
std::string PackObject(uint64_t writer, uint64_t number) {
  return fmt::format("gpuckpt.pack.{}.{}", Hex16(writer), Hex16(number));
}

std::optional<std::pair<uint64_t, uint64_t>> ParsePackObject(std::string_view oid) {
  constexpr std::string_view kPrefix = "gpuckpt.pack.";
  if (oid.size() != kPrefix.size() + 33 || oid.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  oid.remove_prefix(kPrefix.size());
  if (oid[16] != '.') return std::nullopt;
  auto writer = ParseHex16(oid.substr(0, 16));
  auto number = ParseHex16(oid.substr(17));
  if (!writer || !number) return std::nullopt;
  return std::make_pair(*writer, *number);
}

std::string EncodePoolMeta(const PoolMeta& meta) {
  nlohmann::json j = {{"format", meta.format},
                      {"fingerprint_seed", LowerHex(meta.fingerprint_seed)}};
  return j.dump() + "\n";
}

Result<PoolMeta> DecodePoolMeta(std::string_view data) {
  auto j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("format") || !j["format"].is_number_unsigned() ||
      !j.contains("fingerprint_seed") || !j["fingerprint_seed"].is_string()) {
    return Status::Corruption("the pool's gpuckpt.meta is not a gpuckpt pool description");
  }
  PoolMeta meta;
  meta.format = j["format"].get<uint32_t>();
  if (meta.format != kPoolFormat) {
    return Status::Unavailable(
        fmt::format("the pool has gpuckpt pool format {}, this gpuckpt knows only format {}",
                    meta.format, kPoolFormat));
  }
  auto seed = ParseLowerHex(j["fingerprint_seed"].get<std::string>());
  if (!seed || seed->size() != format::kFingerprintSeedSize) {
    return Status::Corruption("the pool's fingerprint seed is malformed");
  }
  meta.fingerprint_seed = std::move(*seed);
  return meta;
}

std::string EncodeIndexEntry(const IndexEntry& entry) {
  std::string out(1, static_cast<char>(kIndexEntryVersion));
  PutBigEndian(&out, entry.pack_writer, 8);
  PutVarint64(&out, entry.pack_number);
  PutVarint64(&out, entry.offset);
  PutVarint64(&out, entry.length);
  PutVarint64(&out, entry.raw_length);
  PutVarint64(&out, entry.condemned_by);
  return out;
}

Result<IndexEntry> DecodeIndexEntry(std::string_view value) {
  auto bad = [] { return Status::Corruption("malformed chunk index entry in the pool"); };
  if (value.size() < 9 || static_cast<uint8_t>(value[0]) != kIndexEntryVersion) return bad();
  IndexEntry e;
  e.pack_writer = GetBigEndian(value.substr(1), 8);
  value.remove_prefix(9);
  if (!GetVarint64(&value, &e.pack_number) || !GetVarint64(&value, &e.offset) ||
      !GetVarint64(&value, &e.length) || !GetVarint64(&value, &e.raw_length) ||
      !GetVarint64(&value, &e.condemned_by) || !value.empty()) {
    return bad();
  }
  if (e.length == 0 || e.length > kPackObjectBytes + (64u << 20)) return bad();
  return e;
}

std::string IndexKey(const ChunkHash& hash) { return std::string(hash.view()); }

Result<ChunkHash> ChunkHashOfIndexKey(std::string_view key) { return ChunkHash::FromBytes(key); }

std::string EncodeCatalogEntry(const CatalogEntry& entry) {
  std::string out(1, static_cast<char>(kCatalogEntryVersion));
  PutBigEndian(&out, entry.incarnation, 8);
  PutVarint64(&out, entry.body_parts);
  PutVarint64(&out, entry.body_bytes);
  PutBigEndian(&out, entry.body_checksum, 8);
  out += entry.snapshot_record;
  return out;
}

Result<CatalogEntry> DecodeCatalogEntry(std::string_view value) {
  auto bad = [] { return Status::Corruption("malformed catalog entry in the pool"); };
  if (value.size() > kMaxCatalogEntryBytes) return bad();
  if (value.size() < 9 || static_cast<uint8_t>(value[0]) != kCatalogEntryVersion) return bad();
  CatalogEntry e;
  e.incarnation = GetBigEndian(value.substr(1), 8);
  value.remove_prefix(9);
  uint64_t parts = 0;
  if (!GetVarint64(&value, &parts) || !GetVarint64(&value, &e.body_bytes) || value.size() < 8) {
    return bad();
  }
  if (parts == 0 || parts > kMaxBodyBytes / kBodyPartBytes + 1 ||
      e.body_bytes > parts * kBodyPartBytes) {
    return bad();
  }
  e.body_parts = static_cast<uint32_t>(parts);
  e.body_checksum = GetBigEndian(value, 8);
  value.remove_prefix(8);
  e.snapshot_record = std::string(value);
  return e;
}

struct BodyEncoder::State {
  ZSTD_CCtx* cctx = nullptr;
  std::string encoded;
  std::string pending;  // decoded bytes not yet given to zstd
  uint64_t decoded_bytes = 0;
  Status failed;

  ~State() { ZSTD_freeCCtx(cctx); }

  Status Compress(ZSTD_EndDirective mode) {
    ZSTD_inBuffer in{pending.data(), pending.size(), 0};
    for (;;) {
      const size_t old = encoded.size();
      encoded.resize(old + ZSTD_CStreamOutSize());
      ZSTD_outBuffer out{encoded.data() + old, ZSTD_CStreamOutSize(), 0};
      const size_t left = ZSTD_compressStream2(cctx, &out, &in, mode);
      encoded.resize(old + out.pos);
      if (ZSTD_isError(left)) {
        return Status::Internal(std::string("compressing a snapshot body: ") +
                                ZSTD_getErrorName(left));
      }
      const bool done = mode == ZSTD_e_end ? left == 0 : in.pos == in.size;
      if (done) break;
    }
    pending.clear();
    return Status::Ok();
  }
};

BodyEncoder::BodyEncoder() : state_(std::make_unique<State>()) {
  state_->cctx = ZSTD_createCCtx();
  // Level 3: bodies are written once per snapshot and read by every
  // machine that restores it; extents of zero pages repeat a lot.
  ZSTD_CCtx_setParameter(state_->cctx, ZSTD_c_compressionLevel, 3);
  state_->pending.assign(kBodyMagic, sizeof(kBodyMagic) - 1);
  for (int i = 0; i < 4; ++i) state_->pending.push_back(static_cast<char>(kBodyVersion >> (8 * i)));
}

BodyEncoder::~BodyEncoder() = default;

Status BodyEncoder::AddFile(std::string_view file_record, const std::vector<BodyExtent>& extents) {
  if (!state_->failed.ok()) return state_->failed;
  std::string& p = state_->pending;
  const size_t before = p.size();
  PutVarint64(&p, file_record.size());
  p += file_record;
  PutVarint64(&p, extents.size());
  for (const BodyExtent& e : extents) {
    p += e.hash.view();
    PutVarint64(&p, e.length);
    p.push_back(static_cast<char>(e.fingerprint ? kExtentHasFingerprint : 0));
    if (e.fingerprint) p += e.fingerprint->view();
  }
  state_->decoded_bytes += p.size() - before;
  if (state_->decoded_bytes > kMaxBodyBytes) {
    state_->failed = Status::InvalidArgument(fmt::format(
        "the snapshot's index is larger than a pool body may be ({} bytes)", kMaxBodyBytes));
    return state_->failed;
  }
  if (p.size() >= (1u << 20)) state_->failed = state_->Compress(ZSTD_e_continue);
  return state_->failed;
}

Result<std::string> BodyEncoder::Finish() {
  GPUCKPT_RETURN_IF_ERROR(state_->failed);
  GPUCKPT_RETURN_IF_ERROR(state_->Compress(ZSTD_e_end));
  return std::move(state_->encoded);
}

namespace {

Result<std::string> DecompressBody(std::string_view encoded, std::string_view what) {
  auto corrupt = [&](std::string why) {
    return Status::Corruption(fmt::format("snapshot body {}: {}", what, why));
  };
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  std::string out;
  ZSTD_inBuffer in{encoded.data(), encoded.size(), 0};
  size_t left = 1;
  while (in.pos < in.size) {
    const size_t old = out.size();
    if (old > kMaxBodyBytes) {
      return Status::InvalidArgument(
          fmt::format("snapshot body {} decodes to more than {} bytes", what, kMaxBodyBytes));
    }
    out.resize(old + ZSTD_DStreamOutSize());
    ZSTD_outBuffer o{out.data() + old, ZSTD_DStreamOutSize(), 0};
    left = ZSTD_decompressStream(dctx.get(), &o, &in);
    out.resize(old + o.pos);
    if (ZSTD_isError(left)) return corrupt(ZSTD_getErrorName(left));
    if (left == 0 && in.pos < in.size) return corrupt("bytes after the end of its frame");
  }
  if (left != 0) return corrupt("it is cut short");
  return out;
}

Result<BodyFile> DecodeBodyFile(std::string_view* in) {
  BodyFile file;
  uint64_t record_len = 0;
  std::string_view record;
  if (!GetVarint64(in, &record_len) || !TakeBytes(in, record_len, &record)) {
    return Status::Corruption("malformed file record");
  }
  file.file_record = std::string(record);
  uint64_t count = 0;
  // An extent takes at least 34 bytes: a count beyond what is left is a lie.
  if (!GetVarint64(in, &count) || count > in->size() / 34) {
    return Status::Corruption("malformed extent count");
  }
  file.extents.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    BodyExtent e;
    std::string_view hash;
    std::string_view flags;
    if (!TakeBytes(in, format::kChunkHashSize, &hash) || !GetVarint64(in, &e.length) ||
        e.length == 0 || !TakeBytes(in, 1, &flags)) {
      return Status::Corruption("malformed extent");
    }
    std::memcpy(e.hash.bytes.data(), hash.data(), hash.size());
    if (static_cast<uint8_t>(flags[0]) & kExtentHasFingerprint) {
      std::string_view fp;
      if (!TakeBytes(in, format::kFingerprintSize, &fp)) {
        return Status::Corruption("malformed extent fingerprint");
      }
      e.fingerprint.emplace();
      std::memcpy(e.fingerprint->bytes.data(), fp.data(), fp.size());
    }
    file.extents.push_back(e);
  }
  return file;
}

}  // namespace

Result<std::vector<BodyFile>> DecodeBody(std::string_view encoded, std::string_view what) {
  GPUCKPT_ASSIGN_OR_RETURN(std::string decoded, DecompressBody(encoded, what));
  std::string_view in(decoded);
  const std::string_view magic(kBodyMagic, sizeof(kBodyMagic) - 1);
  if (in.size() < magic.size() + 4 || in.substr(0, magic.size()) != magic) {
    return Status::Corruption(fmt::format("snapshot body {} is not a gpuckpt body", what));
  }
  in.remove_prefix(magic.size());
  uint32_t version = 0;
  for (int i = 0; i < 4; ++i)
    version |= static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  in.remove_prefix(4);
  if (version != kBodyVersion) {
    return Status::Unavailable(fmt::format("snapshot body {} has version {}, this gpuckpt reads {}",
                                           what, version, kBodyVersion));
  }
  std::vector<BodyFile> files;
  while (!in.empty()) {
    auto file = DecodeBodyFile(&in);
    if (!file.ok()) return file.status().WithContext(fmt::format("snapshot body {}", what));
    files.push_back(std::move(*file));
  }
  return files;
}

uint64_t BodyChecksum(std::string_view encoded) {
  return XXH3_64bits(encoded.data(), encoded.size());
}

}  // namespace gpuckpt::pool
