// ChunkPacks: the files that hold chunk records, appended in arrival order.
//
// A chunk record is written to disk once: appended to the active pack file
// (STORE/packs/<id>.pack) with pwrite, and RocksDB keeps only where it lies
// (a pack location, see FORMAT.md). RocksDB never copies chunk bytes through
// a memtable, a flush or a compaction. Writeback of a pack is started every
// few MiB, so the disk sees large sequential writes while a checkpoint is
// still being stored and Sync() finds little left to write.
//
// Every call that changes a pack on disk goes through a StoreFileOps (the
// system calls, or a test's recorder of what was made durable).
//
// Durability: Sync() fdatasyncs every pack appended to since the last Sync()
// (and the packs directory when a pack was created). StoreDb calls it before
// RocksDB writes any memtable to disk, so no location record reaches the
// disk before the bytes it points to.
//
// A pack is never appended to after the process that created it closes the
// store: opening starts a new pack at the first Append(), so a pack cut
// short by a crash is only ever read where a durable location points, and
// such locations lie below its last Sync(). Space in packs is given back by
// gc (core/snapshot): it copies a pack's live records into the active pack
// and removes the old one.
//
// Thread-safe. Reads may run while another thread appends or removes packs:
// a removed pack reads as kNotFound (the caller looks its location up again).
#ifndef GPUCKPT_CORE_STORE_CHUNK_PACKS_H_
#define GPUCKPT_CORE_STORE_CHUNK_PACKS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/mutex.h"
#include "core/base/unique_fd.h"
#include "core/store/store_env.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

// Where one chunk record lies.
struct PackLocation {
  uint64_t pack = 0;    // pack id (its file name)
  uint64_t offset = 0;  // of the record in the pack file
  uint64_t length = 0;  // of the record
};

// The value stored under a chunk's seq in the chunks family for a packed
// chunk: version:u8(=kPackLocationVersion) pack:varint64 offset:varint64
// length:varint64. Chunk records kept inline by earlier versions start with
// kChunkRecordVersion instead, so the first byte tells them apart.
std::string EncodePackLocation(const PackLocation& location);
Result<PackLocation> DecodePackLocation(std::string_view value);
bool IsPackLocation(std::string_view value);

class ChunkPacks {
 public:
  // Opens (creating) the packs directory `dir`; the caller makes its name
  // durable (syncs its parent). Packs are created with mode 0600. `files`
  // must outlive the ChunkPacks.
  static Result<std::unique_ptr<ChunkPacks>> Open(const std::string& dir,
                                                  StoreFileOps* files = StoreFileOps::System());
  // Opens the packs directory `dir` for reading only, without creating it
  // (kNotFound when it is not there).
  static Result<std::unique_ptr<ChunkPacks>> OpenExisting(
      const std::string& dir, StoreFileOps* files = StoreFileOps::System());
  ~ChunkPacks();

  ChunkPacks(const ChunkPacks&) = delete;
  ChunkPacks& operator=(const ChunkPacks&) = delete;

  // Appends `record` to the active pack (creating one when there is none or
  // it is full) and returns where it lies. Durable after the next Sync().
  Result<PackLocation> Append(std::string_view record) EXCLUDES(mu_);

  // Reads `location` into `*out`. kNotFound when the pack is gone (removed
  // by gc after the caller looked the location up); kCorruption when the
  // pack is shorter than the location says.
  Status Read(const PackLocation& location, std::string* out) const;
  // Reads `len` bytes at `offset` of pack `pack` into `buf` (several records
  // in one read); errors as Read().
  Status ReadRange(uint64_t pack, uint64_t offset, size_t len, char* buf) const EXCLUDES(mu_);

  // As ReadRange(), but where the range is not all in the kernel's page
  // cache already, it comes from the disk straight into `buf` (direct I/O)
  // instead of through the cache, which it leaves alone. A range that is
  // all in the cache (a checkpoint just written) is still copied from
  // there. Where the filesystem has no direct I/O, as ReadRange().
  //
  // Direct I/O reads whole blocks of kDirectAlign bytes into memory aligned
  // as much: `buf - offset % kDirectAlign` must be aligned to kDirectAlign,
  // and every byte from there to DirectSpan(offset, len) bytes on may be
  // written (the bytes of the blocks around the range are undefined).
  Status ReadRangeDirect(uint64_t pack, uint64_t offset, size_t len, char* buf) const EXCLUDES(mu_);
  static constexpr uint64_t kDirectAlign = 4096;
  static constexpr uint64_t DirectSpan(uint64_t offset, uint64_t len) {
    return (offset % kDirectAlign + len + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  }

  // Asks the kernel to start reading `len` bytes at `offset` of pack `pack`
  // into its cache (a reader about to come that way). Best effort.
  void ReadAhead(uint64_t pack, uint64_t offset, uint64_t len) const EXCLUDES(mu_);
  // As ReadAhead(), asked on a thread of the process's own, so that the
  // caller does not wait while the kernel queues the reads.
  void ReadAheadLater(uint64_t pack, uint64_t offset, uint64_t len) const EXCLUDES(mu_);

  // Makes every Append() that returned before this call durable. Once a
  // sync failed every later Append() and Sync() fails too: the kernel may
  // have dropped the unwritten pages, so nothing after may claim to be
  // durable.
  Status Sync() EXCLUDES(sync_mu_, mu_);

  // The next Append() starts a new pack; the current one is no longer
  // appended to (gc rewrites packs only once no one appends to them).
  void Rotate() EXCLUDES(mu_);

  struct PackFile {
    uint64_t id = 0;
    uint64_t size = 0;  // bytes in the file
    bool active = false;
  };
  // Every pack file in the directory, by id.
  Result<std::vector<PackFile>> List() const EXCLUDES(mu_);

  // Deletes pack `id` (must not be the active one) and syncs the directory.
  Status Remove(uint64_t id) EXCLUDES(mu_);

  // Gives the filesystem back the blocks of `ranges` (offset, length) of
  // pack `id`, which must not be the active one: garbage between its live
  // records (gc). Punches holes (FALLOC_FL_PUNCH_HOLE), so the file keeps
  // its size and every other byte, needs no free space (unlike copying the
  // live records elsewhere) and readers of live records are undisturbed.
  // Returns by how many bytes the pack's allocation shrank. kUnavailable
  // where the filesystem cannot punch holes.
  Result<uint64_t> PunchHoles(uint64_t id, const std::vector<std::pair<uint64_t, uint64_t>>& ranges)
      EXCLUDES(mu_);

  const std::string& dir() const { return dir_; }

  // Bytes before the first record of every pack (its header).
  static constexpr uint64_t kHeaderSize = 16;
  // A pack is closed once it holds this much; gc works pack by pack.
  static constexpr uint64_t kTargetSize = 256ull << 20;

 private:
  struct File;
  ChunkPacks(std::string dir, UniqueFd dir_fd, StoreFileOps* files, uint64_t next_id)
      : dir_(std::move(dir)), dir_fd_(std::move(dir_fd)), files_(files), next_id_(next_id) {}

  // Writes all of `len` bytes at `offset` of `file`.
  Status WriteFully(const File& file, const char* data, size_t len, uint64_t offset) const;

  std::string PathOf(uint64_t id) const;
  // Creates the next pack. Its file is made and its header written with mu_
  // held: once in kTargetSize bytes appended, and every appender needs the
  // new pack before it can go on anyway.
  Status StartPackLocked() REQUIRES(mu_);
  // The open file of pack `id`, opened for reading on first use.
  Result<std::shared_ptr<File>> FileFor(uint64_t id) const EXCLUDES(mu_);
  // `file`'s descriptor for direct reads, opened on first use; -1 where
  // there is none (no direct I/O: a tmpfs before Linux 6.6).
  int DirectFdOf(File& file) const;

  const std::string dir_;
  const UniqueFd dir_fd_;
  StoreFileOps* const files_;

  // Held through a whole Sync(), its fdatasync()s included: that is what it
  // is for (see Sync()); only Sync() takes it.
  Mutex sync_mu_ ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  uint64_t next_id_ GUARDED_BY(mu_);
  std::shared_ptr<File> active_ GUARDED_BY(mu_);  // null: none yet
  mutable std::map<uint64_t, std::shared_ptr<File>> open_ GUARDED_BY(mu_);
  std::set<uint64_t> dirty_ GUARDED_BY(mu_);  // appended since Sync()
  bool dir_dirty_ GUARDED_BY(mu_) = false;    // a pack was created
  Status failed_ GUARDED_BY(mu_);             // sticky Sync() error
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_CHUNK_PACKS_H_
