// SnapshotWriter: builds one snapshot file by file and publishes it
// atomically.
//
// Data is chunked, hashed and compressed on the writer's worker threads
// while the caller goes on reading, into staging memory bounded by
// SnapshotWriterOptions::staging_bytes; chunks already in the store are
// never written again. Nothing becomes visible before Commit() returns OK: the manifest is
// the last record written (with a WAL sync), and a writer destroyed without
// Commit() — or a process killed at any point — leaves only unreferenced
// records that Gc() removes.
//
// AddFile(), AddStream() and AddEntry() may be called from several threads at once (a
// CRIU dump streams several image files at a time); the other members are
// called by one thread while no AddFile() runs. Several writers of one Store
// may run at once. Borrows the Store, which must outlive it.
#ifndef GPUCKPT_SNAPSHOT_WRITER_H_
#define GPUCKPT_SNAPSHOT_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

class SnapshotWriter {
 public:
  virtual ~SnapshotWriter() = default;

  // Reads `fd` from its current position to EOF as the contents of regular
  // file `meta.path` (meta.size is ignored; the bytes read decide). Does not
  // close `fd`. Works on pipes and sockets as well as files.
  virtual Status AddFile(const FileEntry& meta, int fd) = 0;

  // Reads the contents of regular file `meta.path` from `read`, which fills
  // up to `len` bytes of `buf` and returns how many (0 at the end), until
  // it returns 0; an error it returns fails the file. For sources that are
  // no descriptor, such as a member of an archive being decompressed.
  using ReadFn = std::function<Result<size_t>(char* buf, size_t len)>;
  virtual Status AddStream(const FileEntry& meta, const ReadFn& read) = 0;

  // Adds a directory or symlink entry (no data).
  virtual Status AddEntry(const FileEntry& meta) = 0;

  // Replaces the spec's extra_json (merged into the manifest under "extra")
  // before Commit(): what is known only at the end, such as durations.
  virtual void SetExtraJson(std::string extra_json) = 0;

  // true: the workers hash, compress and write only on CPU time nothing
  // else wants (SCHED_IDLE), so that a source that must not be slowed (CRIU
  // copying a frozen process) keeps the cores, and its bytes wait in the
  // staging memory. The writer leaves the background by itself once the
  // staging memory is full (the source then waits for the workers), and
  // where the process could not come back from SCHED_IDLE it never enters
  // it. false: normal priority again. Any thread may call it.
  virtual void SetBackground(bool background) = 0;

  // Bytes read so far, for progress reports.
  virtual uint64_t bytes_read() const = 0;

  // Calls `progress(bytes_read, total)` from an AddFile() thread as data is
  // read (about every 64 MiB; from one thread at a time). `total` is the caller's estimate, 0 if
  // none.
  virtual void SetProgress(ProgressFn progress, uint64_t total) = 0;

  // Waits for all chunks to be durable, then publishes the snapshot.
  virtual Result<SnapshotInfo> Commit() = 0;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_SNAPSHOT_WRITER_H_
