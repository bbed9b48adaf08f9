// ActingAs: the calling thread opens files with a user's rights for a while.
//
// gpuckptfs runs as root, but a path a user writes into a control file must
// be resolved as that user would resolve it: with root's rights a user
// could learn what exists in root-only directories from the error, or get
// a root-only directory opened for them. The kernel checks file access
// against a thread's fsuid, fsgid and supplementary groups, and all three
// are per thread (the raw system calls; glibc's setgroups() would change
// every thread of the daemon). Changing the fsuid away from 0 also drops
// the thread's file capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
// CAP_FOWNER, ...) from its effective set until it is set back.
//
// Keep the scope to the opens: anything the daemon writes for itself (the
// store) must be done as root again, and a thread started meanwhile would
// start with the user's ids (the kernel copies the creating thread's).
//
// Thread-safety: affects only the thread that made it, which must also be
// the one that destroys it; not movable.
#ifndef GPUCKPT_CORE_PROC_ACTING_AS_H_
#define GPUCKPT_CORE_PROC_ACTING_AS_H_

#include <sys/types.h>

#include <memory>
#include <vector>

#include "core/proc/caller.h"
#include "gpuckpt/status.h"

namespace gpuckpt {

class ActingAs {
 public:
  // The calling thread takes `caller`'s uid, gid and groups for file access.
  // A root caller changes nothing. Fails (and changes nothing) when the
  // kernel refuses.
  static Result<std::unique_ptr<ActingAs>> Begin(const Caller& caller);
  // Restores root's file access; aborts if the kernel refuses, since the
  // thread would otherwise serve later requests with a user's rights.
  ~ActingAs();
  ActingAs(const ActingAs&) = delete;
  ActingAs& operator=(const ActingAs&) = delete;

 private:
  ActingAs(bool changed, uid_t uid, gid_t gid, std::vector<gid_t> groups)
      : changed_(changed), old_uid_(uid), old_gid_(gid), old_groups_(std::move(groups)) {}
  bool changed_;
  uid_t old_uid_;
  gid_t old_gid_;
  std::vector<gid_t> old_groups_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_PROC_ACTING_AS_H_
