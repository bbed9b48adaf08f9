#include "core/store/chunk_codec.h"

#include <xxhash.h>
#include <zstd.h>

#include <cmath>
#include <memory>

#include "core/store/format.h"

namespace gpuckpt {
namespace {

constexpr size_t kChecksumSize = 16;

void PutChecksum(std::string* dst, const uint8_t* data, size_t len) {
  const XXH128_hash_t h = XXH3_128bits(data, len);
  for (uint64_t part : {h.low64, h.high64}) {
    for (int i = 0; i < 8; ++i) dst->push_back(static_cast<char>((part >> (8 * i)) & 0xff));
  }
}

// Whether a chunk looks like random bytes (compressed data, encrypted data,
// many kinds of weights and keys), judged from the byte histogram of a
// sample: four 512-byte pieces spread over the chunk, whose Shannon entropy
// costs a fortieth of a zstd attempt. Random bytes give ~7.9 bits a byte on
// such a sample; data zstd can shrink by 1/32 gives less than 7.5 (float32
// weights ~7.2, bfloat16 ~6.7, code, text and structs far less; measured
// with zstd -1 on 16 KiB chunks). A chunk that is half zeros and half
// random lands near 5 and is compressed.
bool LooksIncompressible(const uint8_t* data, size_t len) {
  constexpr size_t kPiece = 512;
  constexpr size_t kPieces = 4;
  constexpr double kRandomBitsPerByte = 7.5;
  if (len < 2 * kPiece * kPieces) return false;  // small: just try
  uint32_t counts[256] = {};
  for (size_t p = 0; p < kPieces; ++p) {
    const uint8_t* piece = data + (len - kPiece) * p / (kPieces - 1);
    for (size_t i = 0; i < kPiece; ++i) ++counts[piece[i]];
  }
  constexpr double kTotal = kPiece * kPieces;
  double bits = 0;
  for (uint32_t c : counts) {
    if (c == 0) continue;
    const double p = c / kTotal;
    bits -= p * std::log2(p);
  }
  return bits > kRandomBitsPerByte;
}

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

}  // namespace

void PutVarint64(std::string* dst, uint64_t v) {
  while (v >= 0x80) {
    dst->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  dst->push_back(static_cast<char>(v));
}

bool GetVarint64(std::string_view* in, uint64_t* v) {
  uint64_t result = 0;
  for (int shift = 0; shift <= 63 && !in->empty(); shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    result |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) {
      *v = result;
      return true;
    }
  }
  return false;
}

void EncodeChunkRecord(const uint8_t* data, size_t len, const ChunkHash& hash, int zstd_level,
                       std::string* record) {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
  record->clear();
  record->push_back(static_cast<char>(format::kChunkRecordVersion));
  const size_t codec_pos = record->size();
  record->push_back(static_cast<char>(format::kCodecZstd));
  PutVarint64(record, len);
  record->append(hash.view());
  PutChecksum(record, data, len);
  const size_t header = record->size();
  // Only worth it when it saves at least 1/32: below that the read-side
  // decompression costs more than the bytes saved.
  const size_t budget = len - len / 32;
  size_t n = 0;
  const bool attempt = cctx && !LooksIncompressible(data, len);
  if (attempt) {
    record->resize(header + ZSTD_compressBound(len));
    n = ZSTD_compressCCtx(cctx.get(), record->data() + header, record->size() - header, data, len,
                          zstd_level);
  }
  if (attempt && !ZSTD_isError(n) && n < budget) {
    record->resize(header + n);
    return;
  }
  (*record)[codec_pos] = static_cast<char>(format::kCodecRaw);
  record->resize(header);
  record->append(reinterpret_cast<const char*>(data), len);
}

std::string EncodeChunkMeta(const ChunkMeta& meta) {
  std::string record(1, static_cast<char>(format::kChunkMetaRecordVersion));
  PutVarint64(&record, meta.seq);
  PutVarint64(&record, meta.raw_length);
  PutVarint64(&record, meta.stored_length);
  return record;
}

Result<ChunkMeta> DecodeChunkMeta(std::string_view record) {
  ChunkMeta meta;
  if (record.empty() || static_cast<uint8_t>(record[0]) != format::kChunkMetaRecordVersion) {
    return Status::Corruption("chunk meta record with unknown version");
  }
  record.remove_prefix(1);
  if (!GetVarint64(&record, &meta.seq) || !GetVarint64(&record, &meta.raw_length) ||
      !GetVarint64(&record, &meta.stored_length)) {
    return Status::Corruption("malformed chunk meta record");
  }
  return meta;
}

Result<uint64_t> ChunkRecordRawLength(std::string_view record) {
  if (record.size() < 3) return Status::Corruption("chunk record too short");
  if (static_cast<uint8_t>(record[0]) != format::kChunkRecordVersion) {
    return Status::Corruption("chunk record version " + std::to_string(uint8_t(record[0])) +
                              " is not supported");
  }
  record.remove_prefix(2);
  uint64_t raw_len = 0;
  if (!GetVarint64(&record, &raw_len) || raw_len > format::kMaxChunkSize) {
    return Status::Corruption("chunk record has a bad length");
  }
  return raw_len;
}

namespace {

// A record's header taken apart: what DecodeChunkRecord() and
// RawChunkPayload() both check before they look at the payload.
struct ParsedRecord {
  uint8_t codec = 0;
  uint64_t raw_len = 0;
  std::string_view checksum;
  std::string_view payload;
};

Result<ParsedRecord> ParseRecord(std::string_view record, std::string_view what, ChunkHash* hash) {
  auto corrupt = [&](const std::string& why) {
    return Status::Corruption("chunk " + std::string(what) + ": " + why);
  };
  ParsedRecord parsed;
  auto raw_len = ChunkRecordRawLength(record);
  if (!raw_len.ok()) return raw_len.status().WithContext("chunk " + std::string(what));
  parsed.raw_len = *raw_len;
  parsed.codec = static_cast<uint8_t>(record[1]);
  std::string_view payload = record.substr(2);
  uint64_t ignored;
  GetVarint64(&payload, &ignored);
  if (payload.size() < format::kChunkHashSize) return corrupt("record too short for its hash");
  auto stored_hash = ChunkHash::FromBytes(payload.substr(0, format::kChunkHashSize));
  if (!stored_hash.ok()) return corrupt("bad hash");
  *hash = *stored_hash;
  payload.remove_prefix(format::kChunkHashSize);
  if (payload.size() < kChecksumSize) return corrupt("record too short for its checksum");
  parsed.checksum = payload.substr(0, kChecksumSize);
  payload.remove_prefix(kChecksumSize);
  parsed.payload = payload;
  if (parsed.codec == format::kCodecRaw && payload.size() != parsed.raw_len)
    return corrupt("raw payload length mismatch");
  if (parsed.codec != format::kCodecRaw && parsed.codec != format::kCodecZstd)
    return corrupt("unknown codec " + std::to_string(parsed.codec));
  return parsed;
}

bool ChecksumMatches(std::string_view data, std::string_view checksum) {
  std::string expected;
  PutChecksum(&expected, reinterpret_cast<const uint8_t*>(data.data()), data.size());
  return expected == checksum;
}

Status BadChecksum(std::string_view what) {
  return Status::Corruption("chunk " + std::string(what) + ": bytes do not match the checksum");
}

}  // namespace

Status DecodeChunkRecord(std::string_view record, std::string_view what, std::string* out,
                         ChunkHash* hash, bool check_checksum) {
  GPUCKPT_ASSIGN_OR_RETURN(ParsedRecord parsed, ParseRecord(record, what, hash));
  if (parsed.codec == format::kCodecRaw) {
    out->assign(parsed.payload);
    if (check_checksum && !ChecksumMatches(*out, parsed.checksum)) return BadChecksum(what);
    return Status::Ok();
  }
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx(ZSTD_createDCtx());
  if (!dctx) return Status::Internal("out of memory for a zstd context");
  out->resize(parsed.raw_len);
  const size_t n = ZSTD_decompressDCtx(dctx.get(), out->data(), out->size(), parsed.payload.data(),
                                       parsed.payload.size());
  if (ZSTD_isError(n))
    return Status::Corruption("chunk " + std::string(what) + ": zstd: " + ZSTD_getErrorName(n));
  if (n != parsed.raw_len)
    return Status::Corruption("chunk " + std::string(what) + ": decompressed length mismatch");
  if (check_checksum && !ChecksumMatches(*out, parsed.checksum)) return BadChecksum(what);
  return Status::Ok();
}

Result<std::optional<std::string_view>> RawChunkPayload(std::string_view record,
                                                        std::string_view what, ChunkHash* hash,
                                                        bool check_checksum) {
  GPUCKPT_ASSIGN_OR_RETURN(ParsedRecord parsed, ParseRecord(record, what, hash));
  if (parsed.codec != format::kCodecRaw) return std::optional<std::string_view>();
  if (check_checksum && !ChecksumMatches(parsed.payload, parsed.checksum)) return BadChecksum(what);
  return std::optional<std::string_view>(parsed.payload);
}

}  // namespace gpuckpt
