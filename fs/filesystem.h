// Filesystem: gpuckptfs's FUSE low-level operations over a StoreView.
//
// Translates between the kernel and the store, nothing more: each operation
// is a DoX() returning a Result (or, for changes to the tree, which Status
// has no codes for, the errno itself), and a callback that replies exactly
// once. Nothing can be changed but by commands: inside a checkpoint, its
// device/<id> or its archives/<id>.tar every change is EROFS, elsewhere
// EPERM; `rmdir checkpoints/<id>` (as `rm -r` does it) removes a
// checkpoint. Writes to control files are commands, each run on a thread
// of its own (CommandRunner, at most 64 at once per uid) that replies when
// it ends, so the FUSE threads (16) only ever answer quick requests: any
// number of long checkpoints leave everyone's ls and cat answered. Borrows
// the Store and the Engine, which must outlive it.
#ifndef GPUCKPT_FS_FILESYSTEM_H_
#define GPUCKPT_FS_FILESYSTEM_H_

#include <functional>
#include <string>

#include "core/engine/engine.h"
#include "gpuckpt/status.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

struct MountOptions {
  std::string mountpoint = "/mnt/gpuckpt";
  // Let other users than the mounting one into the mount; the kernel then
  // checks the modes we report (default_permissions). Default: true.
  bool allow_other = true;
  bool debug = false;
  // The mount's source in the mount table (findmnt's SOURCE): the store's
  // path, so that two daemons' mounts are told apart. Its type is always
  // fuse.gpuckptfs (kGpuckptMountType).
  std::string source = "gpuckptfs";
  // Threads that read ahead of a lazy restore's server, which reads its
  // images past the kernel's read-ahead (fs/stream_read_ahead.h): -1 the
  // default (LazyReadAheadThreads(), as LazyReadAheadOptionsForThisMachine()
  // says), 0 none; a count reads ahead of strides and streams alike.
  int lazy_read_ahead_threads = -1;
};

// kBusy, saying what is mounted, when a mount's mount point is exactly
// `resolved_mountpoint` (an absolute path without symlinks, as realpath()
// gives it): mounting there would hide that mount (another gpuckptfs and
// its checkpoints, say) until unmounted. Reads /proc/self/mountinfo.
Status CheckNothingMountedAt(const std::string& resolved_mountpoint);

// Mounts, calls `on_mounted` (the mount is then visible), serves until
// unmounted or signalled (SIGINT, SIGTERM, SIGHUP: after the lazily restored
// trees are resident, at most 10 minutes; a second signal at once: see
// fs/graceful_stop.h), asks the commands still
// running to give up (as their writers' Ctrl-C would) and waits for them,
// unmounts. Errors:
// something is mounted there already (kBusy, CheckNothingMountedAt()), the
// mount failed (kUnavailable), or the session broke. Runs in the calling
// process: daemonizing is the caller's business (it must happen before the
// Store is opened, since RocksDB's threads do not survive fork()).
Status ServeFilesystem(Store* store, Engine* engine, const MountOptions& options,
                       const std::function<void()>& on_mounted);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_FILESYSTEM_H_
