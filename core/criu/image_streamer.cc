#include "core/criu/image_streamer.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <optional>
#include <thread>
#include <vector>

#include "core/base/log.h"
#include "core/base/mutex.h"

namespace gpuckpt {

namespace {

// Far above the largest request CRIU sends (a tag, a length and a name of
// at most PATH_MAX), so a bogus length prefix cannot make us allocate.
constexpr uint32_t kMaxMessage = 8192;

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// poll() on `fd` alone with a zero timeout: whether it is readable now.
// CRIU's pipes hold 64 KiB: an image of gigabytes then crosses them in tens
// of thousands of wake-ups on each side. 1 MiB (the largest an unprivileged
// process may ask for, by default) moved 1.6x as many bytes a second in a
// pipe between two threads on the 2-core build machine; 4 MiB where we may.
// Best effort: a pipe that stays small only moves slower.
void EnlargePipe(int fd) {
  for (int bytes : {4 << 20, 1 << 20}) {
    if (fcntl(fd, F_SETPIPE_SZ, bytes) >= 0) return;
  }
}

bool ReadableNow(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// The filename of an img_streamer_request_entry, decoded by hand.
Result<std::string> DecodeRequest(const std::string& body) {
  std::optional<std::string> name;
  size_t pos = 0;
  auto varint = [&]() -> std::optional<uint64_t> {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && pos < body.size(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(body[pos++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    return std::nullopt;
  };
  while (pos < body.size()) {
    const std::optional<uint64_t> tag = varint();
    std::optional<uint64_t> value = tag ? varint() : std::nullopt;
    if (!value) return Status::Corruption("streamer request: bad varint");
    if ((*tag & 7) == 0) continue;  // an unknown varint field
    if ((*tag & 7) != 2 || *value > body.size() - pos) {
      return Status::Corruption("streamer request: bad field");
    }
    if (*tag >> 3 == 1) name = body.substr(pos, *value);
    pos += *value;
  }
  if (!name) return Status::Corruption("streamer request without a filename");
  return *name;
}

}  // namespace

bool IsValidImageFileName(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

// The listening socket, and the one connection it serves.
class StreamerSocket {
 public:
  ~StreamerSocket() {
    if (conn_ >= 0) close(conn_);
    if (listen_ >= 0) close(listen_);
    if (!path_.empty()) unlink(path_.c_str());
  }

  static Result<std::unique_ptr<StreamerSocket>> Listen(const std::string& dir, const char* name) {
    auto socket = std::make_unique<StreamerSocket>();
    socket->path_ = dir + "/" + name;
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    if (socket->path_.size() >= sizeof(addr.sun_path)) {
      socket->path_.clear();
      return Status::InvalidArgument("streamer socket path too long: " + dir + "/" + name);
    }
    strcpy(addr.sun_path, socket->path_.c_str());
    struct stat st;
    if (lstat(addr.sun_path, &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        const std::string taken = socket->path_;
        socket->path_.clear();
        return Status::AlreadyExists(taken + " exists and is not a socket");
      }
      unlink(addr.sun_path);  // stale, from a run that did not clean up
    }
    socket->listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (socket->listen_ < 0) return StatusFromErrno(errno, "socket");
    if (bind(socket->listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int err = errno;
      socket->path_.clear();
      return StatusFromErrno(err, "bind " + std::string(addr.sun_path));
    }
    if (listen(socket->listen_, 1) != 0) return StatusFromErrno(errno, "listen " + socket->path_);
    return socket;
  }

  const std::string& path() const { return path_; }

  // Waits for CRIU to connect. A connection that is already queued when
  // stop_fd fires is still taken: CRIU may have connected, sent all and
  // exited.
  // A connection from any other process than `peer_pid` is closed unread
  // (the socket may be a user's, whose processes could connect first).
  Status Accept(int stop_fd, pid_t peer_pid) {
    stop_fd_ = stop_fd;
    while (true) {
      GPUCKPT_RETURN_IF_ERROR(WaitReadable(listen_, "before CRIU connected"));
      const int conn = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0 && (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)) continue;
      if (conn < 0) return StatusFromErrno(errno, "accept on " + path_);
      ucred peer{};
      socklen_t len = sizeof(peer);
      if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.pid == peer_pid) {
        conn_ = conn;
        return Status::Ok();
      }
      spdlog::warn("streamer socket={} refused a connection from pid={} uid={}: not CRIU (pid {})",
                   LogValue(path_), peer.pid, peer.uid, peer_pid);
      close(conn);
    }
  }

  // The next request's file name; nullopt when CRIU closed the connection.
  Result<std::optional<std::string>> ReadRequest() {
    uint32_t len = 0;
    std::vector<int> fds;
    GPUCKPT_ASSIGN_OR_RETURN(bool got, ReadExact(&len, sizeof(len), &fds));
    if (!got) return std::optional<std::string>();
    if (len > kMaxMessage) return Status::Corruption("streamer request too long");
    std::string body(len, '\0');
    GPUCKPT_ASSIGN_OR_RETURN(got, ReadExact(body.data(), len, &fds));
    if (!got || !fds.empty()) {
      CloseAll(fds);
      return Status::IOError("CRIU broke off a streamer request on " + path_);
    }
    GPUCKPT_ASSIGN_OR_RETURN(std::string name, DecodeRequest(body));
    if (!IsValidImageFileName(name)) {
      return Status::InvalidArgument("CRIU named an invalid image file on " + path_);
    }
    return std::optional<std::string>(std::move(name));
  }

  // The pipe end CRIU passes after a request.
  Result<int> ReceiveFd() {
    char byte;
    std::vector<int> fds;
    GPUCKPT_ASSIGN_OR_RETURN(bool got, ReadExact(&byte, 1, &fds));
    if (!got || fds.size() != 1) {
      CloseAll(fds);
      return Status::IOError("CRIU sent no pipe after a streamer request on " + path_);
    }
    EnlargePipe(fds[0]);
    return fds[0];
  }

  // Replies to a restore request (img_streamer_reply_entry {1: exists}).
  Status SendReply(bool exists) {
    const unsigned char msg[6] = {2, 0, 0, 0, 0x08, static_cast<unsigned char>(exists ? 1 : 0)};
    size_t done = 0;
    while (done < sizeof(msg)) {
      const ssize_t n = send(conn_, msg + done, sizeof(msg) - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (errno == EAGAIN) {
        pollfd p = {conn_, POLLOUT, 0};
        poll(&p, 1, 100);
      } else if (errno != EINTR) {
        return StatusFromErrno(errno, "reply on " + path_);
      }
    }
    return Status::Ok();
  }

  // Makes the serving thread see EOF; called by a failing worker.
  void Shutdown() { shutdown(conn_, SHUT_RDWR); }

 private:
  // Waits until `fd` is readable. When stop_fd fires first, what is already
  // queued on `fd` is still taken; otherwise kAborted.
  Status WaitReadable(int fd, const char* when) {
    while (true) {
      pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      const int n = poll(p, stop_fd_ >= 0 ? 2 : 1, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return StatusFromErrno(errno, "poll on " + path_);
      if (p[0].revents != 0) return Status::Ok();
      if (ReadableNow(fd)) return Status::Ok();
      return Status::Aborted("CRIU exited " + std::string(when) + " (" + path_ + ")");
    }
  }

  // Reads exactly n bytes, collecting any descriptors that come along.
  // false: EOF before the first byte. EOF later is an error.
  Result<bool> ReadExact(void* buf, size_t n, std::vector<int>* fds) {
    size_t done = 0;
    while (done < n) {
      GPUCKPT_RETURN_IF_ERROR(WaitReadable(conn_, "with the streamer connection open"));
      iovec iov = {static_cast<char*>(buf) + done, n - done};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
      msghdr msg = {};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      const ssize_t got = recvmsg(conn_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got < 0) return StatusFromErrno(errno, "recvmsg on " + path_);
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd;
          memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds->push_back(fd);
        }
      }
      if (msg.msg_flags & MSG_CTRUNC) return Status::IOError("too many fds from CRIU on " + path_);
      if (got == 0 && done == 0) return false;
      if (got == 0) return Status::IOError("CRIU closed " + path_ + " mid-message");
      done += static_cast<size_t>(got);
    }
    return true;
  }

  std::string path_;
  int listen_ = -1;
  int conn_ = -1;
  int stop_fd_ = -1;
};

namespace {

// The threads that handle one file each. The first error shuts the
// connection down, so that the serving loop ends and CRIU fails early.
class FileWorkers {
 public:
  explicit FileWorkers(StreamerSocket* socket) : socket_(socket) {}
  ~FileWorkers() { JoinAll().PermitUnchecked(); }

  void Start(std::function<Status()> work) {
    Reap();
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread thread([this, work = std::move(work), done] {
      // A write into a pipe CRIU closed fails with EPIPE instead of
      // killing the process (SIGPIPE from a pipe goes to the writing thread).
      sigset_t pipe_set;
      sigemptyset(&pipe_set);
      sigaddset(&pipe_set, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
      Status status = work();
      if (!status.ok()) Fail(status);
      done->store(true);
    });
    workers_.push_back({std::move(thread), done});
  }

  void Fail(const Status& status) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (first_error_.ok()) first_error_ = status;
    }
    socket_->Shutdown();
  }

  Status JoinAll() EXCLUDES(mu_) {
    for (Worker& w : workers_) w.thread.join();
    workers_.clear();
    MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  // Joins the workers that are done, so that a dump of many files does not
  // keep a thread per file.
  void Reap() {
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (!it->done->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = workers_.erase(it);
    }
  }

  StreamerSocket* const socket_;
  std::list<Worker> workers_;  // only the serving thread touches the list
  Mutex mu_;
  Status first_error_ GUARDED_BY(mu_);
};

// Whether the reader of pipe write end `fd` is gone (poll reports POLLERR).
bool PipeReaderGone(int fd) {
  pollfd p = {fd, POLLOUT, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & POLLERR);
}

}  // namespace

ImageCaptureServer::ImageCaptureServer(std::unique_ptr<StreamerSocket> socket)
    : socket_(std::move(socket)) {}
ImageCaptureServer::~ImageCaptureServer() = default;
const std::string& ImageCaptureServer::socket_path() const { return socket_->path(); }

Result<std::unique_ptr<ImageCaptureServer>> ImageCaptureServer::Listen(const std::string& dir) {
  GPUCKPT_ASSIGN_OR_RETURN(auto socket, StreamerSocket::Listen(dir, kStreamerCaptureSocket));
  return std::unique_ptr<ImageCaptureServer>(new ImageCaptureServer(std::move(socket)));
}

Status ImageCaptureServer::Serve(
    const std::function<Status(const std::string& name, int fd)>& on_file, int stop_fd,
    pid_t peer_pid) {
  GPUCKPT_RETURN_IF_ERROR(socket_->Accept(stop_fd, peer_pid));
  FileWorkers workers(socket_.get());
  Status loop = [&]() -> Status {
    while (true) {
      GPUCKPT_ASSIGN_OR_RETURN(std::optional<std::string> name, socket_->ReadRequest());
      if (!name) return Status::Ok();
      GPUCKPT_ASSIGN_OR_RETURN(int fd, socket_->ReceiveFd());
      workers.Start([&on_file, name = *name, fd] {
        Status status = on_file(name, fd);
        close(fd);
        return status.ok() ? status : status.WithContext("image " + name);
      });
    }
  }();
  if (!loop.ok()) workers.Fail(loop);
  return workers.JoinAll();
}

ImageServeServer::ImageServeServer(std::unique_ptr<StreamerSocket> socket)
    : socket_(std::move(socket)) {}
ImageServeServer::~ImageServeServer() = default;
const std::string& ImageServeServer::socket_path() const { return socket_->path(); }

Result<std::unique_ptr<ImageServeServer>> ImageServeServer::Listen(const std::string& dir) {
  GPUCKPT_ASSIGN_OR_RETURN(auto socket, StreamerSocket::Listen(dir, kStreamerServeSocket));
  return std::unique_ptr<ImageServeServer>(new ImageServeServer(std::move(socket)));
}

Status ImageServeServer::Serve(
    const std::function<bool(const std::string& name)>& exists,
    const std::function<Status(const std::string& name, int fd)>& write_file, int stop_fd,
    pid_t peer_pid) {
  GPUCKPT_RETURN_IF_ERROR(socket_->Accept(stop_fd, peer_pid));
  FileWorkers workers(socket_.get());
  Status loop = [&]() -> Status {
    while (true) {
      GPUCKPT_ASSIGN_OR_RETURN(std::optional<std::string> name, socket_->ReadRequest());
      if (!name) return Status::Ok();
      const bool found = exists(*name);
      GPUCKPT_RETURN_IF_ERROR(socket_->SendReply(found));
      if (!found) continue;
      GPUCKPT_ASSIGN_OR_RETURN(int fd, socket_->ReceiveFd());
      workers.Start([&write_file, name = *name, fd] {
        Status status = write_file(name, fd);
        if (!status.ok() && PipeReaderGone(fd)) status = Status::Ok();  // CRIU had enough
        close(fd);
        return status.ok() ? status : status.WithContext("image " + name);
      });
    }
  }();
  if (!loop.ok()) workers.Fail(loop);
  return workers.JoinAll();
}

}  // namespace gpuckpt
