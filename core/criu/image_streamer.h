// The gpuckpt end of CRIU's image streaming (`criu dump --stream`, `criu
// restore --stream`, criu/img-streamer.c in CRIU 4.1): instead of opening
// image files, CRIU connects to a UNIX socket in its images directory
// (streamer-capture.sock on dump, streamer-serve.sock on restore), names
// each image file there and passes a pipe for its bytes.
//
// Wire format, one connection per CRIU run, requests strictly one at a time
// (CRIU holds a lock across request and reply, also between its restore
// processes that share the connection):
//   request: u32 length (host order) + img_streamer_request_entry
//            {1: string filename}
//   restore only, reply: u32 length + img_streamer_reply_entry {1: bool
//            exists}; nothing more follows when false
//   then:    one byte with SCM_RIGHTS carrying one pipe end: the read end on
//            dump (CRIU writes the file), the write end on restore
// CRIU closes the connection when it needs no more files (end of dump; on
// restore once the tasks are resumed).
//
// Only the CRIU the daemon started may connect: for a user's dump or
// restore the socket is that user's (CRIU runs as them), so any process of
// theirs could connect first and stream its own images into a checkpoint,
// or take a restore's. A connection whose peer (SO_PEERCRED) is not CRIU's
// pid is closed unread, and the server goes on waiting for CRIU's. Errors are not reported in-band:
// a streamer that fails closes its pipe and CRIU sees EPIPE or a short read.
//
// CRIU keeps several image files open at once and writes them interleaved
// (pagemap-N.img and pages-N.img, for example), so each file is handled on a
// thread of its own; handling them one after another would deadlock.
//
// SIGPIPE: the threads that call on_file / write_file block SIGPIPE, so a
// write into a pipe whose reader is gone fails with EPIPE instead of killing
// the process; a callback that writes from another thread of its own must
// arrange that itself (or the process ignores SIGPIPE).
//
// Thread-safety: Serve() is called once, from one thread. The callbacks run
// concurrently with each other and must be thread-safe. Ownership: the
// server owns its listening socket and removes its socket file when
// destroyed; it must outlive Serve().
#ifndef GPUCKPT_CORE_CRIU_IMAGE_STREAMER_H_
#define GPUCKPT_CORE_CRIU_IMAGE_STREAMER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "gpuckpt/status.h"

namespace gpuckpt {

inline constexpr const char* kStreamerCaptureSocket = "streamer-capture.sock";
inline constexpr const char* kStreamerServeSocket = "streamer-serve.sock";

// Whether `name` is acceptable as an image file name from CRIU: non-empty,
// at most 255 bytes, no '/' or NUL, not "." or "..".
bool IsValidImageFileName(const std::string& name);

// The listening socket both servers share. Internal to this module.
class StreamerSocket;

// Takes the image files of one `criu dump --stream`.
class ImageCaptureServer {
 public:
  // Creates <dir>/streamer-capture.sock and listens. `dir` must exist and
  // be private to the caller; a stale socket of that name is replaced.
  // kInvalidArgument when the path does not fit a sockaddr_un.
  static Result<std::unique_ptr<ImageCaptureServer>> Listen(const std::string& dir);
  ~ImageCaptureServer();

  const std::string& socket_path() const;

  // Serves CRIU's one connection until CRIU closes it (end of dump). For
  // each image file, calls on_file(name, fd) on a thread of its own; it must
  // read fd (a pipe) to EOF; the server closes fd when it returns. Returns
  // once the connection is closed and every on_file returned: OK, or the
  // first error of an on_file or of the protocol (after which the
  // connection is shut down, so CRIU fails at its next file, and the
  // server still waits for the on_file calls in flight, which end when
  // CRIU closes its pipe ends, at the latest when it exits).
  // kAborted when stop_fd (e.g. CRIU's pidfd; -1: none) becomes readable
  // before CRIU connected, or while the connection is silent and open.
  // Untrusted names (see IsValidImageFileName) give kInvalidArgument.
  // Only a connection from `peer_pid` (CRIU's pid, the process that
  // connects) is served; others are closed unread.
  Status Serve(const std::function<Status(const std::string& name, int fd)>& on_file, int stop_fd,
               pid_t peer_pid);

 private:
  explicit ImageCaptureServer(std::unique_ptr<StreamerSocket> socket);
  std::unique_ptr<StreamerSocket> socket_;
};

// Serves the image files of one `criu restore --stream`.
class ImageServeServer {
 public:
  // Creates <dir>/streamer-serve.sock and listens. For a restore that runs
  // as another user (CriuCommand::run_as), the caller makes the directory
  // and socket_path() reachable and writable by that user.
  static Result<std::unique_ptr<ImageServeServer>> Listen(const std::string& dir);
  ~ImageServeServer();

  const std::string& socket_path() const;

  // For each file CRIU requests, replies exists(name) (called on the
  // serving thread); if true, takes CRIU's pipe and calls write_file(name,
  // fd) on a thread of its own to write the whole file into it. An error of
  // write_file after CRIU closed its read end (CRIU often reads only what
  // it needs) is not an error. CRIU may ask for a name more than once, and
  // for many that do not exist. Returns when CRIU closes the connection and
  // every write_file returned; errors, stop_fd and peer_pid as for
  // ImageCaptureServer::Serve.
  Status Serve(const std::function<bool(const std::string& name)>& exists,
               const std::function<Status(const std::string& name, int fd)>& write_file,
               int stop_fd, pid_t peer_pid);

 private:
  explicit ImageServeServer(std::unique_ptr<StreamerSocket> socket);
  std::unique_ptr<StreamerSocket> socket_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_CRIU_IMAGE_STREAMER_H_
