// Encoding of the catalog's records (see core/store/FORMAT.md), and the rules
// for what may be in them: the snapshot manifest, file records and extent
// records. Pure functions of their inputs; thread-safe.
#ifndef GPUCKPT_CORE_CATALOG_RECORDS_H_
#define GPUCKPT_CORE_CATALOG_RECORDS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/store/chunk_fingerprint.h"
#include "core/store/chunk_hash.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

// 1-128 characters of [A-Za-z0-9._-], not starting with '.' or '-': safe as
// a file name, in a URL and on a command line.
Status ValidateSnapshotName(std::string_view name);

// A relative path with '/' separators and no empty, "." or ".." component.
Status ValidateEntryPath(std::string_view path);

std::string EncodeSnapshotRecord(const SnapshotInfo& info);
Result<SnapshotInfo> DecodeSnapshotRecord(std::string_view id, std::string_view record);

// The manifest as users see it (manifest.json, `gpuckpt ls --json`).
std::string SnapshotInfoToJson(const SnapshotInfo& info, int indent = -1);

// A regular file's holes are written only when it has any, and checked
// when read (in order, apart, inside the file, at most kMaxFileHoles).
std::string EncodeFileRecord(const FileEntry& entry);
Result<FileEntry> DecodeFileRecord(std::string_view record);

// The hole of `holes` (in offset order) that holds byte `offset`, if any.
const FileHole* HoleContaining(const std::vector<FileHole>& holes, uint64_t offset);

struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
  ChunkHash hash;
  uint64_t seq = 0;  // key of the chunk record
  // The chunk's fingerprint under the store's key; absent in extents written
  // before fingerprints existed.
  std::optional<ChunkFingerprint> fingerprint;
};
// An extent without a fingerprint is one written before they existed (or
// fetched from a pool that had none for it).
std::string EncodeExtentRecord(const ChunkHash& hash, uint64_t seq, uint64_t length,
                               const std::optional<ChunkFingerprint>& fingerprint);
// `offset` comes from the key.
Result<Extent> DecodeExtentRecord(uint64_t offset, std::string_view record);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_CATALOG_RECORDS_H_
