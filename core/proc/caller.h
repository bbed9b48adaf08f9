// Caller: who is asking gpuckptfs for something (the uid, gid and pid of a
// FUSE request), and the rule for which processes that caller may see and
// checkpoint.
//
// The rule is ptrace's (__ptrace_may_access() in kernel/ptrace.c), because a
// checkpoint reads and can later rebuild a process's whole memory: root may
// checkpoint anything; anyone else only a process that is entirely theirs.
// gpuckptfs runs as root, so this check is the only thing between a user and
// another user's process.
//
// Thread-safety: values and free functions; safe to use concurrently.
#ifndef GPUCKPT_CORE_PROC_CALLER_H_
#define GPUCKPT_CORE_PROC_CALLER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/proc/process_info.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

struct Caller {
  uint32_t uid = 0, gid = 0;  // fuse_req_ctx(): the caller's fsuid and fsgid
  int pid = 0;                // the calling thread, in the daemon's pid namespace; 0 if unknown
  std::vector<uint32_t> groups = {};  // supplementary groups (CallerGroups())
  // Set once the caller gave up on their request (a signal interrupted
  // their write, e.g. Ctrl-C): long work on it stops (kCancelled). Shared
  // with whoever sets it; null for a request that cannot be given up.
  std::shared_ptr<const std::atomic<bool>> interrupted = nullptr;

  bool is_root() const { return uid == 0; }
  bool Cancelled() const { return interrupted && interrupted->load(std::memory_order_relaxed); }
  // gid is the caller's gid or one of its supplementary groups.
  bool InGroup(uint32_t gid) const;
};

// Supplementary groups of the calling process (/proc/PID/status Groups:);
// empty if it is gone or its status does not parse.
std::vector<uint32_t> CallerGroups(int pid, const std::string& proc_root = "/proc");

// A Caller for a FUSE request: uid, gid and pid as fuse_req_ctx() gives them,
// groups from /proc/PID/status, but only if that status still shows
// fsuid == uid and fsgid == gid. A request's pid can exit and be reused
// before we read its groups; a reused pid of someone else must not lend the
// caller its groups (fewer groups only ever mean less access).
Caller MakeCaller(uint32_t uid, uint32_t gid, int pid, const std::string& proc_root = "/proc");

// A Caller for the user `uid` as this machine's user database (NSS:
// getpwuid_r, getgrouplist) knows them: their primary gid and every group
// they belong to, pid 0. What the daemon acts as on behalf of a user who
// did not ask themselves: the owner of a copy root imports, the user a
// checkpoint's images say the tree was. kNotFound when the database does
// not know the uid (their groups cannot be known).
Result<Caller> UserCaller(uint32_t uid);

// May `caller` see and checkpoint `target`? Root: yes. Anyone else only if
// the target's real, effective and saved uids all equal caller.uid, its real,
// effective and saved gids all belong to the caller (its gid or groups), it is
// dumpable (not a setuid program, nor a process that changed its ids) and it
// holds no capabilities. Otherwise kPermissionDenied, with a reason naming
// the pid and its owner.
Status MayCheckpoint(const Caller& caller, const ProcessInfo& target);

// Owner shown for a process's <pid>/ directory: its real uid and gid.
struct ProcessOwner {
  uint32_t uid = 0, gid = 0;
};
inline ProcessOwner OwnerOf(const ProcessInfo& info) { return {info.creds.ruid, info.creds.rgid}; }

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_CALLER_H_
