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
// AddFile(), AddStream(), AddSparse() and AddEntry() may be called from
// several threads at once (a CRIU dump streams several image files at a
// time); the other members are called by one thread while no AddFile()
// runs. Several writers of one Store
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
  // close `fd`. Works on pipes and sockets as well as files. A regular file
  // is read by its runs of data (lseek's SEEK_DATA and SEEK_HOLE), as
  // AddSparse() stores them: its holes of 64 KiB or more are not read and
  // stay holes (up to kMaxFileHoles of them; the rest, and smaller ones,
  // are read as the zeros they are). A run that turns out shorter than
  // SEEK_HOLE said, or an end before the last run's, is kAborted: the file
  // changed while it was read.
  virtual Status AddFile(const FileEntry& meta, int fd) = 0;

  // Reads the contents of regular file `meta.path` from `read`, which fills
  // up to `len` bytes of `buf` and returns how many (0 at the end), until
  // it returns 0; an error it returns fails the file. For sources that are
  // no descriptor, such as a member of an archive being decompressed.
  using ReadFn = std::function<Result<size_t>(char* buf, size_t len)>;
  virtual Status AddStream(const FileEntry& meta, const ReadFn& read) = 0;

  // The contents of a regular file with holes, as runs of data: a sparse
  // file, a sparse member of a tar archive. Used by the one thread that
  // adds the file.
  class SparseSource {
   public:
    virtual ~SparseSource() = default;
    struct Run {
      uint64_t offset = 0;  // where the run begins; with `end`, the file's size
      bool end = false;     // no more data
    };
    // The next run of data: it begins at or past the end of the one before
    // (the first at or past 0), and the bytes in between are a hole. With
    // `end`, there is no more data, and the file is `offset` bytes long (at
    // or past the end of the last run: the rest is a hole). A run that
    // begins where the one before ended just goes on with it.
    virtual Result<Run> NextRun() = 0;
    // Fills up to `len` bytes of `buf` with the current run's next bytes
    // and returns how many; 0 at the run's end. An error fails the file.
    virtual Result<size_t> Read(char* buf, size_t len) = 0;
  };
  // Stores regular file `meta.path` from `source`: its runs of data are
  // read, chunked and stored; a hole is no chunk and no extent, only a
  // line of the file record (FileEntry::holes), and reads back as zeros.
  // meta.size is ignored: the source's end decides. A source may leave at
  // most kMaxFileHoles holes (holes that touch are one); more, or a run
  // that goes backwards, fail the file with kInvalidArgument: a source
  // with more holes gives the rest as data (zeros). Borrows `source`.
  virtual Status AddSparse(const FileEntry& meta, SparseSource* source) = 0;

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

  // Bytes of file contents taken so far, holes included (a hole is taken
  // at once, without reading): the sum of the sizes of the files added,
  // for progress reports against a total of file sizes.
  virtual uint64_t bytes_read() const = 0;

  // Calls `progress(bytes_read, total)` from an AddFile() thread as data is
  // read (about every 64 MiB; from one thread at a time). `total` is the caller's estimate, 0 if
  // none.
  virtual void SetProgress(ProgressFn progress, uint64_t total) = 0;

  // Lets the caller stop the import: `cancelled` is asked, from the threads
  // that add files, when an entry or file is added and before each read of
  // a file's data (at most 4 MiB apart; a hole takes no reading), so a
  // cancellation takes effect within a read or two, in the middle of a
  // large file too. Once it returns true, the file being added, every
  // later Add...() and Commit() fail with kCancelled; the
  // writer is then only destroyed, which leaves nothing visible. A source
  // blocked in a read is not interrupted: it takes effect when the read
  // returns. `cancelled` must be cheap and safe to call from any thread
  // (an std::atomic<bool> read). Call before the first Add...(). Default:
  // never cancelled.
  virtual void SetCancel(std::function<bool()> cancelled) = 0;

  // Waits for all chunks to be durable, then publishes the snapshot.
  virtual Result<SnapshotInfo> Commit() = 0;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_SNAPSHOT_WRITER_H_
