// The objects gpuckpt keeps in a shared RADOS pool, and their encodings
// (core/store/FORMAT.md, "The shared pool"). Pure functions of their
// inputs: thread-safe, no I/O.
//
// What lies where:
//   gpuckpt.meta                  the pool's format and fingerprint seed
//   gpuckpt.catalog               omap: snapshot id -> catalog entry
//   gpuckpt.name.<id>             the name's reservation (made exclusively)
//   gpuckpt.body.<id>.<inc>.<n>   part n of a snapshot's body (files, extents)
//   gpuckpt.index.<ss>            omap: chunk name -> where its record lies
//   gpuckpt.pack.<writer>.<n>     chunk records, as in a local pack
//   gpuckpt.gc                    the collector's lock and state
#ifndef GPUCKPT_CORE_POOL_POOL_FORMAT_H_
#define GPUCKPT_CORE_POOL_POOL_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/store/chunk_fingerprint.h"
#include "core/store/chunk_hash.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt::pool {

inline constexpr uint32_t kPoolFormat = 1;
// Index shards: chunk names spread over this many objects, so that a
// lookup of many names is one omap read per shard and no one object's map
// grows with the whole pool.
inline constexpr unsigned kIndexShards = 64;
// A pack object is written once it holds this many bytes of records (or
// when the snapshot ends): large enough that a RADOS write costs little
// per chunk, small enough to keep a few in flight in memory.
inline constexpr uint64_t kPackObjectBytes = 8ull << 20;
// A body part: far below RADOS's largest object (128 MiB by default).
inline constexpr uint64_t kBodyPartBytes = 16ull << 20;
// A snapshot body larger than this (decoded) is refused: 80 GB of 4 KiB
// chunks would need about 1.1 GB.
inline constexpr uint64_t kMaxBodyBytes = 4ull << 30;
// A catalog entry larger than this is refused.
inline constexpr uint64_t kMaxCatalogEntryBytes = 4u << 20;

std::string MetaObject();
std::string CatalogObject();
std::string GcObject();
std::string NameObject(std::string_view id);
std::string BodyObject(std::string_view id, uint64_t incarnation, uint32_t part);
// The prefix of every body part of every incarnation of `id`.
std::string BodyObjectPrefix(std::string_view id);
std::string IndexObject(unsigned shard);
unsigned IndexShardOf(const ChunkHash& hash);
std::string PackObject(uint64_t writer, uint64_t number);
// The writer of a pack object's name; nullopt for any other name.
std::optional<std::pair<uint64_t, uint64_t>> ParsePackObject(std::string_view oid);

// gpuckpt.meta: JSON {"format": 1, "fingerprint_seed": "<hex>"}.
struct PoolMeta {
  uint32_t format = kPoolFormat;
  std::string fingerprint_seed;  // raw bytes
};
std::string EncodePoolMeta(const PoolMeta& meta);
Result<PoolMeta> DecodePoolMeta(std::string_view data);

// An index entry: where one chunk's record lies in the pool.
struct IndexEntry {
  uint64_t pack_writer = 0;
  uint64_t pack_number = 0;
  uint64_t offset = 0;
  uint64_t length = 0;      // of the record
  uint64_t raw_length = 0;  // of the chunk
  // 0: live. Otherwise the collection that found no snapshot naming the
  // chunk; a writer that reuses the chunk rewrites the entry with 0.
  uint64_t condemned_by = 0;
};
std::string EncodeIndexEntry(const IndexEntry& entry);
Result<IndexEntry> DecodeIndexEntry(std::string_view value);
// The omap key of a chunk in its index shard: the name's 32 bytes.
std::string IndexKey(const ChunkHash& hash);
Result<ChunkHash> ChunkHashOfIndexKey(std::string_view key);

// A catalog entry: a published snapshot of the pool.
struct CatalogEntry {
  // Random, given when the snapshot is pushed: tells a snapshot from a
  // later one of the same name.
  uint64_t incarnation = 0;
  uint32_t body_parts = 0;
  uint64_t body_bytes = 0;     // encoded, all parts together
  uint64_t body_checksum = 0;  // XXH3-64 of the encoded body
  // The snapshot-record (core/store/FORMAT.md), its key 0.
  std::string snapshot_record;
};
std::string EncodeCatalogEntry(const CatalogEntry& entry);
Result<CatalogEntry> DecodeCatalogEntry(std::string_view value);

// A snapshot's body: its file records and each regular file's extents.
struct BodyExtent {
  ChunkHash hash;
  uint64_t length = 0;
  std::optional<ChunkFingerprint> fingerprint;
};
struct BodyFile {
  std::string file_record;          // as in the files family (FORMAT.md)
  std::vector<BodyExtent> extents;  // in offset order, from offset 0
};
// Appends files to a body and encodes it (zstd), without holding the
// decoded body whole.
class BodyEncoder {
 public:
  BodyEncoder();
  ~BodyEncoder();
  BodyEncoder(const BodyEncoder&) = delete;
  BodyEncoder& operator=(const BodyEncoder&) = delete;
  Status AddFile(std::string_view file_record, const std::vector<BodyExtent>& extents);
  // The encoded body; the encoder is spent.
  Result<std::string> Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};
// Decodes an encoded body (all parts joined); `what` names it in errors.
// kCorruption for anything malformed, kInvalidArgument beyond kMaxBodyBytes.
Result<std::vector<BodyFile>> DecodeBody(std::string_view encoded, std::string_view what);

uint64_t BodyChecksum(std::string_view encoded);

}  // namespace gpuckpt::pool

#endif  // GPUCKPT_CORE_POOL_POOL_FORMAT_H_
