// Whether a Unix stream socket bound to a path listens.
//
// A server's socket file appears at bind(), and a client that connects
// before the server's listen() is refused. A caller that waits for a server
// it started (CRIU's lazy-pages server, perhaps behind a wrapper script of
// the admin's) asks this instead of watching for the file. The kernel's
// socket diagnostics (NETLINK_SOCK_DIAG, as `ss -xl` uses) are asked for
// the listening sockets of the caller's network namespace, and the one
// bound to the file is found by the file's inode, so nothing connects to
// the server (which would count as its client) and a socket bound to the
// same name elsewhere, or one in another process's working directory bound
// by a relative name, does not count.
//
// Thread-safe (a free function).
#ifndef GPUCKPT_CORE_BASE_UNIX_SOCKET_STATE_H_
#define GPUCKPT_CORE_BASE_UNIX_SOCKET_STATE_H_

#include <string>

#include "gpuckpt/status.h"

namespace gpuckpt {

// True when a socket bound to the file `path` listens in the caller's
// network namespace; false when the file is not there yet or its socket
// does not listen yet. kInvalidArgument when `path` is there and not a
// socket; kUnavailable when the kernel has no socket diagnostics for Unix
// sockets (CONFIG_UNIX_DIAG off).
Result<bool> UnixSocketListens(const std::string& path);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_UNIX_SOCKET_STATE_H_
