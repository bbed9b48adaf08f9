// Constants of the persistent store format; the grammar is in FORMAT.md
// beside this file. Every record starts with a version byte; fields are
// only ever added.
#ifndef GPUCKPT_CORE_STORE_FORMAT_H_
#define GPUCKPT_CORE_STORE_FORMAT_H_

#include <cstddef>
#include <cstdint>

namespace gpuckpt::format {

// Version of the store as a whole, kept in the meta column family. A store
// with a higher version is refused rather than misread.
// Version 2 keeps chunk records in pack files; version 1 stores (records in
// RocksDB) are read as they are and become version 2 when opened.
inline constexpr uint32_t kStoreVersion = 2;

// Column families.
inline constexpr char kMetaFamily[] = "default";
inline constexpr char kChunksFamily[] = "chunks";
// Per chunk: its raw and stored length. Small, so existence checks, stats
// and gc scan it instead of the chunk data.
inline constexpr char kChunkMetaFamily[] = "chunk_meta";
inline constexpr char kSnapshotsFamily[] = "snapshots";
inline constexpr char kFilesFamily[] = "files";
inline constexpr char kExtentsFamily[] = "extents";

// Keys in the meta family.
inline constexpr char kMetaStoreVersionKey[] = "store_version";
inline constexpr char kMetaNextSnapshotKey[] = "next_snapshot_key";
// The store's secret fingerprint seed (kFingerprintSeedSize random bytes,
// made when a store without one is opened).
inline constexpr char kMetaFingerprintSeedKey[] = "fingerprint_seed";

// Record versions (first byte of each value).
inline constexpr uint8_t kChunkRecordVersion = 1;
inline constexpr uint8_t kSnapshotRecordVersion = 1;
inline constexpr uint8_t kFileRecordVersion = 1;
// A file record whose bytes still lie in the spool (not yet chunked): a
// version of its own, so that builds that know no spool refuse it rather
// than read a file without extents.
inline constexpr uint8_t kSpooledFileRecordVersion = 2;
inline constexpr uint8_t kExtentRecordVersion = 1;
inline constexpr uint8_t kChunkMetaRecordVersion = 1;
// First byte of a value in the chunks family that says where the record lies
// in a pack file instead of holding it (its high bit sets it apart from
// kChunkRecordVersion).
inline constexpr uint8_t kPackLocationVersion = 0x81;

// Codec byte of a chunk record.
inline constexpr uint8_t kCodecRaw = 0;
inline constexpr uint8_t kCodecZstd = 1;

inline constexpr size_t kChunkHashSize = 32;    // SHA-256
inline constexpr size_t kFingerprintSize = 16;  // keyed XXH3-128
inline constexpr size_t kFingerprintSeedSize = 32;

// Label in front of the seed when a dedup domain's key is derived from it
// (DeriveChunkDomainKey), setting that use of the seed apart from others.
inline constexpr char kChunkDomainLabel[] = "gpuckpt chunk domain key v1";

// Largest chunk a reader accepts; protects against a corrupt length field
// making us allocate gigabytes.
inline constexpr uint32_t kMaxChunkSize = 64u << 20;

// Name of the flock()ed file that keeps a second process out of a store.
inline constexpr char kLockFileName[] = "LOCK.gpuckpt";
// RocksDB's own files live in this subdirectory of the store.
inline constexpr char kDbDirName[] = "db";
// Chunk records live in pack files in this subdirectory of the store.
inline constexpr char kPacksDirName[] = "packs";
// Space held back on the store's filesystem so that rm and gc can still
// write (RocksDB's WAL and manifest) when the disk is full; see StoreDb.
inline constexpr char kReserveFileName[] = "RESERVE.gpuckpt";
// Its size: 1% of the filesystem, at least kReserveMinBytes, at most
// kReserveMaxBytes. What rm and gc write before they free anything (a
// resumed flush of what a failed snapshot left in the memtables, deletion
// records, a compaction of the small chunk-location table) is a few MiB.
inline constexpr uint64_t kReserveMinBytes = 8ull << 20;
inline constexpr uint64_t kReserveMaxBytes = 64ull << 20;

}  // namespace gpuckpt::format

#endif  // GPUCKPT_CORE_STORE_FORMAT_H_
