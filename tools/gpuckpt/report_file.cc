#include "tools/gpuckpt/report_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/base/scope_exit.h"
#include "core/base/unique_fd.h"

namespace gpuckpt {
namespace {

// A page of a huge store is megabytes; anything beyond this is no page of
// ours.
constexpr size_t kMaxReportBytes = size_t{1} << 30;

// The directory of `path` ("." for a bare name) and its last component.
std::pair<std::string, std::string> SplitPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

Status WriteAll(int fd, std::string_view bytes, const std::string& what) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "writing " + what);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace

Status CheckReportPath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("--html needs a file name");
  if (path.back() == '/')
    return Status::InvalidArgument("--html " + path + " names a directory, not a file");
  const auto [dir, name] = SplitPath(path);
  if (name == "." || name == "..")
    return Status::InvalidArgument("--html " + path + " names a directory, not a file");
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0)
    return StatusFromErrno(errno, "--html " + path + ": its directory " + dir);
  if (!S_ISDIR(st.st_mode))
    return Status::InvalidArgument("--html " + path + ": " + dir + " is not a directory");
  if (lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode) ? "a directory" : "not a regular file";
    return Status::InvalidArgument("--html " + path + " is " + what);
  }
  return Status::Ok();
}

Status WriteReportFile(const std::string& path, std::string_view content) {
  GPUCKPT_RETURN_IF_ERROR(CheckReportPath(path));
  const auto [dir, name] = SplitPath(path);
  // A dot file beside FILE: the same filesystem, so the rename is atomic.
  std::string temp = (dir == "/" ? "" : dir) + "/." + name + ".XXXXXX";
  UniqueFd fd(mkostemp(temp.data(), O_CLOEXEC));  // mode 0600
  if (fd.get() < 0) return StatusFromErrno(errno, "creating a new file beside " + path);
  ScopeExit remove_temp([&] { unlink(temp.c_str()); });
  // Replacing a file: it keeps its permissions (stat follows a symlink to
  // what it names, which is what a reader of FILE saw).
  struct stat old {};
  if (stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode) &&
      fchmod(fd.get(), old.st_mode & 07777) != 0)
    return StatusFromErrno(errno, "setting the mode of " + temp);
  GPUCKPT_RETURN_IF_ERROR(WriteAll(fd.get(), content, temp));
  if (fsync(fd.get()) != 0) return StatusFromErrno(errno, "syncing " + temp);
  if (close(fd.release()) != 0) return StatusFromErrno(errno, "closing " + temp);
  if (rename(temp.c_str(), path.c_str()) != 0)
    return StatusFromErrno(errno, "renaming " + temp + " to " + path);
  remove_temp.Dismiss();
  // The rename itself durable; a directory that cannot be synced (some
  // filesystems refuse) still has the whole page under its name.
  if (UniqueFd d(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d.get() >= 0)
    fsync(d.get());
  return Status::Ok();
}

Result<std::string> ReadMountReport(const std::string& mount) {
  const std::string path = mount + "/report.html";
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return Status::NotFound("no report.html in " + mount +
                              " (no gpuckptfs mount there, or an older gpuckptfs)");
    return StatusFromErrno(errno, "opening " + path);
  }
  // A generated file says size 0: read to its end.
  std::string page;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "reading " + path);
    }
    if (n == 0) break;
    page.append(buffer, static_cast<size_t>(n));
    if (page.size() > kMaxReportBytes)
      return Status::InvalidArgument(path + " is larger than any report (over 1 GiB)");
  }
  return page;
}

}  // namespace gpuckpt
