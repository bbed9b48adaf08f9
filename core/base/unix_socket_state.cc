#include "core/base/unix_socket_state.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/base/unique_fd.h"

namespace gpuckpt {

namespace {

struct BoundFile {
  uint32_t ino = 0;  // as socket diagnostics give it: the low 32 bits
  uint32_t dev = 0;  // the kernel's own encoding (major << 20 | minor)
};

Status AskForListeners(int sock) {
  struct {
    nlmsghdr header;
    unix_diag_req request;
  } message = {};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  message.request.sdiag_family = AF_UNIX;
  message.request.udiag_states = 1u << TCP_LISTEN;
  message.request.udiag_show = UDIAG_SHOW_VFS;
  sockaddr_nl kernel = {};
  kernel.nl_family = AF_NETLINK;
  if (sendto(sock, &message, sizeof(message), 0, reinterpret_cast<sockaddr*>(&kernel),
             sizeof(kernel)) != static_cast<ssize_t>(sizeof(message))) {
    return StatusFromErrno(errno, "asking the kernel for listening Unix sockets");
  }
  return Status::Ok();
}

// Whether the listener that `msg` describes is bound to `file`.
bool IsBoundTo(const nlmsghdr* msg, const BoundFile& file) {
  const auto* diag = static_cast<const unix_diag_msg*>(NLMSG_DATA(msg));
  int left = static_cast<int>(msg->nlmsg_len) - static_cast<int>(NLMSG_LENGTH(sizeof(*diag)));
  for (auto* attr = reinterpret_cast<const rtattr*>(diag + 1); RTA_OK(attr, left);
       attr = RTA_NEXT(attr, left)) {
    if (attr->rta_type != UNIX_DIAG_VFS || RTA_PAYLOAD(attr) < sizeof(unix_diag_vfs)) continue;
    unix_diag_vfs vfs;
    memcpy(&vfs, RTA_DATA(attr), sizeof(vfs));
    if (vfs.udiag_vfs_ino == file.ino && vfs.udiag_vfs_dev == file.dev) return true;
  }
  return false;
}

}  // namespace

Result<bool> UnixSocketListens(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    return StatusFromErrno(errno, "looking at " + path);
  }
  if (!S_ISSOCK(st.st_mode)) return Status::InvalidArgument(path + " is not a socket");
  const BoundFile file{static_cast<uint32_t>(st.st_ino),
                       static_cast<uint32_t>(major(st.st_dev) << 20 | minor(st.st_dev))};

  UniqueFd sock(socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (sock.get() < 0) return StatusFromErrno(errno, "opening a socket diagnostics socket");
  GPUCKPT_RETURN_IF_ERROR(AskForListeners(sock.get()));
  // Read the whole dump even after a match: the socket is closed with it.
  bool found = false;
  alignas(nlmsghdr) char buf[32768];
  for (;;) {
    const ssize_t n = recv(sock.get(), buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "reading the listening Unix sockets");
    }
    if (n == 0) return found;
    // NLMSG_OK() and NLMSG_NEXT(), without their mix of signed and
    // unsigned lengths.
    const size_t got = static_cast<size_t>(n);
    for (size_t at = 0; at + sizeof(nlmsghdr) <= got;) {
      const auto* msg = reinterpret_cast<const nlmsghdr*>(buf + at);
      if (msg->nlmsg_len < sizeof(nlmsghdr) || msg->nlmsg_len > got - at) break;
      if (msg->nlmsg_type == NLMSG_DONE) return found;
      if (msg->nlmsg_type == NLMSG_ERROR) {
        const auto* error = static_cast<const nlmsgerr*>(NLMSG_DATA(msg));
        if (error->error == -ENOENT) {
          return Status::Unavailable("the kernel has no socket diagnostics for Unix sockets");
        }
        return StatusFromErrno(-error->error, "reading the listening Unix sockets");
      }
      if (msg->nlmsg_type == SOCK_DIAG_BY_FAMILY && IsBoundTo(msg, file)) found = true;
      at += NLMSG_ALIGN(msg->nlmsg_len);
    }
  }
}

}  // namespace gpuckpt
