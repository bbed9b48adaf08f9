// Status and Result<T>: how every gpuckpt module reports errors.
//
// A Status is a code from a small fixed set plus a message that carries
// context (which snapshot, which file, which chunk). Result<T> holds either a
// value or a non-OK Status. Both are [[nodiscard]]: an ignored error is a bug.
// g++ 12 has no std::expected in C++20, hence this small type.
//
// Errno converts in through StatusFromErrno() and out through
// ErrnoFromStatus(); nothing else maps between the two, so the FUSE layer and
// the command line agree on what each code means.
//
// Thread-safety: values; safe to copy and move between threads.
#ifndef GPUCKPT_STATUS_H_
#define GPUCKPT_STATUS_H_

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gpuckpt {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller passed something wrong (EINVAL)
  kNotFound,          // no such snapshot, file, chunk or source (ENOENT)
  kAlreadyExists,     // a name or destination is taken (EEXIST)
  kPermissionDenied,  // not allowed (EACCES)
  kBusy,              // locked or in use by someone else (EBUSY)
  kAborted,           // gave up because the input changed under us (EAGAIN)
  kCorruption,        // stored data does not match what it claims (EIO)
  kIOError,           // the OS or RocksDB failed (EIO)
  kNoSpace,           // out of disk space (ENOSPC)
  kUnavailable,       // a feature or dependency is not there (ENOTSUP)
  kInternal,          // a bug in gpuckpt
  kNoSuchProcess,     // the process is gone or never was (ESRCH)
  kNoMemory,          // not enough host memory, or a memory cgroup's limit (ENOMEM)
  kTimedOut,          // a remote service (the shared pool) did not answer in time (ETIMEDOUT)
  kCancelled,         // the caller gave up on it (interrupted their write) (EINTR)
};

// Name of a code, e.g. "NotFound".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status Busy(std::string m) { return {StatusCode::kBusy, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status NoSpace(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status NoSuchProcess(std::string m) { return {StatusCode::kNoSuchProcess, std::move(m)}; }
  static Status NoMemory(std::string m) { return {StatusCode::kNoMemory, std::move(m)}; }
  static Status TimedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "NotFound: snapshot 'x' does not exist", or "OK".
  std::string ToString() const;

  // The same status with "context: " put before the message.
  Status WithContext(std::string_view context) const;

  // Marks a status as deliberately ignored (destructors, best-effort cleanup).
  void PermitUnchecked() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Converts an errno value (as left by a failed system call) into a Status
// whose message is "context: strerror(err)".
Status StatusFromErrno(int err, std::string_view context);

// The errno that best describes `status` (0 for OK). FUSE replies and the
// control files use this and nothing else.
int ErrnoFromStatus(const Status& status);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gpuckpt

#define GPUCKPT_CONCAT_INNER_(a, b) a##b
#define GPUCKPT_CONCAT_(a, b) GPUCKPT_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (a Status) is not OK.
#define GPUCKPT_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::gpuckpt::Status gpuckpt_status_ = (expr);        \
    if (!gpuckpt_status_.ok()) return gpuckpt_status_; \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status from the
// current function.
#define GPUCKPT_ASSIGN_OR_RETURN(lhs, expr) \
  GPUCKPT_ASSIGN_OR_RETURN_IMPL_(GPUCKPT_CONCAT_(gpuckpt_result_, __LINE__), lhs, expr)
#define GPUCKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

#endif  // GPUCKPT_STATUS_H_
