// ScopeExit: runs a callable when the scope it was made in ends, however
// it ends (return, early error return, exception), unless Dismiss()ed
// first. For the one-off undo steps that have no owning type of their own
// (a temporary tree to remove unless an export completes, a claim to give
// back); a file descriptor is a UniqueFd instead.
//
// Not thread-safe; not copyable or movable, so it cannot outlive its scope.
#ifndef GPUCKPT_CORE_BASE_SCOPE_EXIT_H_
#define GPUCKPT_CORE_BASE_SCOPE_EXIT_H_

#include <utility>

namespace gpuckpt {

template <typename Callable>
class [[nodiscard]] ScopeExit {
 public:
  explicit ScopeExit(Callable callable) : callable_(std::move(callable)) {}
  ~ScopeExit() {
    if (armed_) callable_();
  }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

  // The scope succeeded: nothing is undone.
  void Dismiss() { armed_ = false; }

 private:
  Callable callable_;
  bool armed_ = true;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_SCOPE_EXIT_H_
