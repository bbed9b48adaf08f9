// Spool: the raw bytes of snapshot files that were made durable before
// they were chunked (STORE/spool/, see core/store/FORMAT.md, "Spooled
// files").
//
// On few cores, hashing and compressing a checkpoint takes several times
// longer than writing it to disk. A writer told to spool
// (SnapshotWriterOptions::spool) moves each file's bytes into a spool file
// of its own as they come (splice(2) from a pipe: no copy through user
// memory), syncs the spool files before the snapshot is published, and
// leaves the chunking to the store's settler, which runs behind on idle CPU
// and deletes each spool file once the file's extents are durable. Until
// then a reader reads the spool file.
//
// A spool file is named by the snapshot key and file index it holds the
// bytes of, so the directory itself says what is still to settle: no other
// record points to it. Every write that makes a spool file durable goes
// through the store's StoreFileOps (power-loss tests see them).
//
// Thread-safe: the directory descriptor is only read after Open().
#ifndef GPUCKPT_CORE_SNAPSHOT_SPOOL_H_
#define GPUCKPT_CORE_SNAPSHOT_SPOOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/unique_fd.h"
#include "core/store/store_env.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

class Spool {
 public:
  // Opens STORE/spool, making it (mode 0700, the store directory synced)
  // when it does not exist and `create` is set; without it a missing
  // directory is an empty spool (a read-only store, or one written before
  // spooling existed). Borrows `ops`, which must outlive the Spool.
  static Result<std::unique_ptr<Spool>> Open(const std::string& store_dir, StoreFileOps* ops,
                                             bool create);

  // The spool file of file `index` of snapshot `key`.
  static std::string FileName(uint64_t key, uint32_t index);

  // Creates the spool file of (`key`, `index`); kAlreadyExists when there
  // is one.
  Result<UniqueFd> Create(uint64_t key, uint32_t index) const;
  // Moves everything `src` gives until its end into `dst` from offset 0:
  // spliced when `src` is a pipe, else read and written. Writeback of what
  // is written starts at once (sync_file_range), so the sync before
  // publishing finds little left to write. `cancelled` is asked between
  // writes of a few MiB. Returns the bytes moved.
  Result<uint64_t> Receive(int src, int dst, const std::function<bool()>& cancelled) const;
  // Makes a spool file's data durable.
  Status Sync(int fd) const;
  // Makes the names created and removed in the spool durable.
  Status SyncDirectory() const;

  // Opens the spool file of (`key`, `index`) for reading; kNotFound when
  // there is none (settled meanwhile, say).
  Result<UniqueFd> OpenForReading(uint64_t key, uint32_t index) const;
  // Removes it; one that is not there is not an error.
  Status Remove(uint64_t key, uint32_t index) const;
  // What the spool files hold together (their sizes).
  Result<uint64_t> Bytes() const;
  // Every spool file, as (key, index), in order; names that are not a
  // spool file's are left alone.
  Result<std::vector<std::pair<uint64_t, uint32_t>>> List() const;

 private:
  Spool(std::string dir, UniqueFd dir_fd, StoreFileOps* ops)
      : dir_(std::move(dir)), dir_fd_(std::move(dir_fd)), ops_(ops) {}

  const std::string dir_;
  const UniqueFd dir_fd_;  // -1: no spool directory (nothing spooled)
  StoreFileOps* const ops_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_SNAPSHOT_SPOOL_H_
