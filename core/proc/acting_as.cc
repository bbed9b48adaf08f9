#include "core/proc/acting_as.h"

#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace gpuckpt {
namespace {

// The per-thread system calls, not glibc's wrappers (see the header).
int SetThreadGroups(const std::vector<gid_t>& groups) {
  return static_cast<int>(syscall(SYS_setgroups, groups.size(), groups.data()));
}
// setfsuid/setfsgid return the previous id and report no error; the
// new id took if asking again (with an invalid id, -1) returns it.
bool SetThreadFsUid(uid_t uid) {
  syscall(SYS_setfsuid, uid);
  return static_cast<uid_t>(syscall(SYS_setfsuid, static_cast<uid_t>(-1))) == uid;
}
bool SetThreadFsGid(gid_t gid) {
  syscall(SYS_setfsgid, gid);
  return static_cast<gid_t>(syscall(SYS_setfsgid, static_cast<gid_t>(-1))) == gid;
}

}  // namespace

Result<std::unique_ptr<ActingAs>> ActingAs::Begin(const Caller& caller) {
  const uid_t old_uid = static_cast<uid_t>(syscall(SYS_setfsuid, static_cast<uid_t>(-1)));
  const gid_t old_gid = static_cast<gid_t>(syscall(SYS_setfsgid, static_cast<gid_t>(-1)));
  if (caller.is_root()) return std::unique_ptr<ActingAs>(new ActingAs(false, old_uid, old_gid, {}));
  const int n = getgroups(0, nullptr);
  std::vector<gid_t> old_groups(n > 0 ? static_cast<size_t>(n) : 0);
  if (n > 0 && getgroups(n, old_groups.data()) != n)
    return StatusFromErrno(errno, "reading the daemon's groups");
  std::vector<gid_t> groups(caller.groups.begin(), caller.groups.end());
  // Groups first: once the fsuid is not 0 the thread may no longer set them.
  if (SetThreadGroups(groups) != 0) return StatusFromErrno(errno, "taking the caller's groups");
  if (!SetThreadFsGid(caller.gid) || !SetThreadFsUid(caller.uid)) {
    SetThreadFsUid(old_uid);
    SetThreadFsGid(old_gid);
    SetThreadGroups(old_groups);
    return Status::PermissionDenied("the kernel refused the caller's file access ids");
  }
  return std::unique_ptr<ActingAs>(new ActingAs(true, old_uid, old_gid, std::move(old_groups)));
}

ActingAs::~ActingAs() {
  if (!changed_) return;
  if (!SetThreadFsUid(old_uid_) || !SetThreadFsGid(old_gid_) || SetThreadGroups(old_groups_) != 0) {
    std::fprintf(stderr, "gpuckpt: cannot take back the daemon's file access ids\n");
    std::abort();
  }
}

}  // namespace gpuckpt
