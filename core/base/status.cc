#include "gpuckpt/status.h"

#include <cerrno>
#include <cstring>

namespace gpuckpt {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kBusy:
      return "Busy";
    case StatusCode::kAborted:
      return "Aborted";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kIOError:
      return "IOError";
    case StatusCode::kNoSpace:
      return "NoSpace";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kNoSuchProcess:
      return "NoSuchProcess";
    case StatusCode::kNoMemory:
      return "NoMemory";
    case StatusCode::kTimedOut:
      return "TimedOut";
    case StatusCode::kCancelled:
      return "Cancelled";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

Status StatusFromErrno(int err, std::string_view context) {
  std::string m(context);
  m += ": ";
  m += std::strerror(err);
  switch (err) {
    case 0:
      return Status::Internal(m + " (errno 0)");
    case ENOENT:
    case ENOTDIR:
      return Status::NotFound(std::move(m));
    case ESRCH:
      return Status::NoSuchProcess(std::move(m));
    case EEXIST:
    case ENOTEMPTY:
      return Status::AlreadyExists(std::move(m));
    case EACCES:
    case EPERM:
    case EROFS:
      return Status::PermissionDenied(std::move(m));
    case EBUSY:
    case EWOULDBLOCK:
      return Status::Busy(std::move(m));
    case ENOSPC:
    case EDQUOT:
      return Status::NoSpace(std::move(m));
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
    case EISDIR:
      return Status::InvalidArgument(std::move(m));
    case ENOTSUP:
      return Status::Unavailable(std::move(m));
    case ENOMEM:
      return Status::NoMemory(std::move(m));
    case ETIMEDOUT:
      return Status::TimedOut(std::move(m));
    case EINTR:
      return Status::Cancelled(std::move(m));
    default:
      return Status::IOError(std::move(m));
  }
}

int ErrnoFromStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidArgument:
      return EINVAL;
    case StatusCode::kNotFound:
      return ENOENT;
    case StatusCode::kAlreadyExists:
      return EEXIST;
    case StatusCode::kPermissionDenied:
      return EACCES;
    case StatusCode::kBusy:
      return EBUSY;
    case StatusCode::kAborted:
      return EAGAIN;
    case StatusCode::kCorruption:
      return EIO;
    case StatusCode::kIOError:
      return EIO;
    case StatusCode::kNoSpace:
      return ENOSPC;
    case StatusCode::kUnavailable:
      return ENOTSUP;
    case StatusCode::kInternal:
      return EIO;
    case StatusCode::kNoSuchProcess:
      return ESRCH;
    case StatusCode::kNoMemory:
      return ENOMEM;
    case StatusCode::kTimedOut:
      return ETIMEDOUT;
    case StatusCode::kCancelled:
      return EINTR;
  }
  return EIO;
}

}  // namespace gpuckpt
