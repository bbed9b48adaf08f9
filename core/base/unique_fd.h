// UniqueFd: owns one file descriptor and closes it when destroyed. Movable,
// not copyable; -1 means none. Not thread-safe (like the int it wraps).
#ifndef GPUCKPT_CORE_BASE_UNIQUE_FD_H_
#define GPUCKPT_CORE_BASE_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace gpuckpt {

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }
  // Gives up ownership: the caller closes the descriptor.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_UNIQUE_FD_H_
