#include "core/proc/caller.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace gpuckpt {
namespace {

// Credentials of `pid` (a thread id, as FUSE gives it, is fine); false when
// it is gone or its status does not parse.
bool ReadCredentials(int pid, const std::string& proc_root, ProcessCredentials* creds) {
  auto handle = ProcessHandle::Open(pid, proc_root);
  if (!handle.ok()) return false;
  int tgid = -1;
  return handle->ReadCredentials(creds, &tgid).ok();
}

}  // namespace

bool Caller::InGroup(uint32_t g) const {
  return g == gid || std::find(groups.begin(), groups.end(), g) != groups.end();
}

std::vector<uint32_t> CallerGroups(int pid, const std::string& proc_root) {
  ProcessCredentials creds;
  if (!ReadCredentials(pid, proc_root, &creds)) return {};
  return creds.groups;
}

Caller MakeCaller(uint32_t uid, uint32_t gid, int pid, const std::string& proc_root) {
  Caller caller;
  caller.uid = uid;
  caller.gid = gid;
  caller.pid = pid;
  ProcessCredentials creds;
  if (pid > 0 && ReadCredentials(pid, proc_root, &creds) && creds.fsuid == uid &&
      creds.fsgid == gid) {
    caller.groups = std::move(creds.groups);
  }
  return caller;
}

Result<Caller> UserCaller(uint32_t uid) {
  long hint = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(hint > 0 ? static_cast<size_t>(hint) : 16384);
  passwd pw{};
  passwd* found = nullptr;
  int err;
  while ((err = getpwuid_r(uid, &pw, buf.data(), buf.size(), &found)) == ERANGE)
    buf.resize(buf.size() * 2);
  if (err != 0) return StatusFromErrno(err, "looking up uid " + std::to_string(uid));
  if (found == nullptr)
    return Status::NotFound("uid " + std::to_string(uid) +
                            " is not a user of this machine (no passwd entry): their groups "
                            "cannot be known");
  Caller caller;
  caller.uid = uid;
  caller.gid = pw.pw_gid;
  std::vector<gid_t> groups(32);
  int count = static_cast<int>(groups.size());
  while (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count) > groups.size() ? static_cast<size_t>(count)
                                                             : groups.size() * 2);
    count = static_cast<int>(groups.size());
  }
  for (int i = 0; i < count; ++i)
    if (groups[i] != pw.pw_gid) caller.groups.push_back(groups[i]);
  return caller;
}

Status MayCheckpoint(const Caller& caller, const ProcessInfo& target) {
  if (caller.is_root()) return Status::Ok();
  const ProcessCredentials& c = target.creds;
  auto refuse = [&](const std::string& why) {
    return Status::PermissionDenied("uid " + std::to_string(caller.uid) +
                                    " may not checkpoint process " + std::to_string(target.pid) +
                                    " (owner uid " + std::to_string(c.ruid) + ", gid " +
                                    std::to_string(c.rgid) + "): " + why);
  };
  if (c.ruid != caller.uid || c.euid != caller.uid || c.suid != caller.uid) {
    if (c.ruid != caller.uid) return refuse("it belongs to another user");
    return refuse("it runs with other uids (effective " + std::to_string(c.euid) + ", saved " +
                  std::to_string(c.suid) + ")");
  }
  for (uint32_t g : {c.rgid, c.egid, c.sgid}) {
    if (!caller.InGroup(g))
      return refuse("it runs with gid " + std::to_string(g) + ", not one of the caller's groups");
  }
  if (!target.dumpable) {
    return refuse("it is not dumpable (a setuid program, or it changed its ids)");
  }
  if (c.cap_permitted != 0 || c.cap_effective != 0) return refuse("it holds capabilities");
  return Status::Ok();
}

}  // namespace gpuckpt
