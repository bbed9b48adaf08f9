// StoreEnv: the file I/O of a store, injectable so that tests can see which
// writes a store made durable and rewrite its directory to only those (a
// power loss: data not fdatasync()ed is gone, names whose directory was not
// fsync()ed may be gone).
//
// Two halves, because the store writes through two paths: RocksDB does all
// its file I/O through a rocksdb::FileSystem, and ChunkPacks writes pack
// files itself (pwrite, fdatasync, directory fsync) through StoreFileOps,
// as StoreDb makes the store's directories. A default StoreEnv is the real
// filesystem: RocksDB's default FileSystem, and the system calls one
// virtual call away. Internal: the public Store API never takes one.
#ifndef GPUCKPT_CORE_STORE_STORE_ENV_H_
#define GPUCKPT_CORE_STORE_STORE_ENV_H_

#include <sys/types.h>

#include <memory>

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace gpuckpt {

// The calls of ChunkPacks that change what a pack file holds or whether it
// exists, and those of StoreDb that make the store's directories, with the
// system calls' conventions (-1 and errno on failure).
// Reads, read-ahead and writeback hints (sync_file_range) change nothing
// durable and go to the system directly. The defaults are those system
// calls; a test overrides them to watch (and still make) each call.
// Called from any thread.
class StoreFileOps {
 public:
  virtual ~StoreFileOps() = default;

  // Creates `name` in directory `dir_fd` for reading and writing; fails when
  // it exists. Returns the descriptor.
  virtual int CreateExclusive(int dir_fd, const char* name, mode_t mode);
  virtual ssize_t Pwrite(int fd, const void* data, size_t len, off_t offset);
  // Moves up to `len` bytes from the pipe `pipe_fd` into `fd` at `offset`
  // (splice(2): no copy through user memory); returns the bytes moved, 0
  // at the pipe's end. A test's override may read and Pwrite() instead.
  virtual ssize_t SpliceFromPipe(int pipe_fd, int fd, off_t offset, size_t len);
  virtual int Fdatasync(int fd);
  // fsync() of a directory: makes the names created, renamed or removed in
  // it durable.
  virtual int FsyncDirectory(int dir_fd);
  virtual int Unlink(int dir_fd, const char* name);
  // fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).
  virtual int PunchHole(int fd, off_t offset, off_t len);
  virtual int MakeDirectory(const char* path, mode_t mode);
  // fsync() of the directory at `path`.
  virtual int SyncDirectory(const char* path);

  // The real filesystem; lives for the whole process.
  static StoreFileOps* System();
};

struct StoreEnv {
  // Where RocksDB does its file I/O; null: RocksDB's default filesystem.
  std::shared_ptr<rocksdb::FileSystem> rocksdb_fs;
  // Where ChunkPacks and the store's directories do; null:
  // StoreFileOps::System().
  std::shared_ptr<StoreFileOps> files;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_STORE_STORE_ENV_H_
