#include "core/gpu/lock_events.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string_view>

#include "core/base/small_file.h"

namespace gpuckpt {
namespace {

constexpr std::string_view kLockPrefix = "gpu-lock-";
constexpr std::string_view kUnlockPrefix = "gpu-unlock-";
constexpr std::string_view kTimeoutPrefix = "gpu-lock-timeout-";
constexpr size_t kMaxFileBytes = 64;

bool AllDigits(std::string_view s) {
  return !s.empty() && s.size() <= 10 &&
         s.find_first_not_of("0123456789") == std::string_view::npos;
}

std::optional<int64_t> ParseNs(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < 0) return std::nullopt;
  return v;
}

}  // namespace

Status RecordLockEvent(const std::string& dir, LockEvent event, int pid) {
  const std::string_view prefix = event == LockEvent::kLock     ? kLockPrefix
                                  : event == LockEvent::kUnlock ? kUnlockPrefix
                                                                : kTimeoutPrefix;
  const std::string name = std::string(prefix) + std::to_string(pid);
  const std::string path = dir + "/" + name;
  const std::string tmp = path + ".tmp";
  const std::string text = std::to_string(MonotonicNowNs()) + "\n";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return StatusFromErrno(errno, "create " + tmp);
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int write_errno = errno;
  close(fd);
  if (!written) {
    unlink(tmp.c_str());
    return StatusFromErrno(write_errno == 0 ? EIO : write_errno, "write " + tmp);
  }
  // No fsync: the daemon reads it right after, on the same machine; a
  // crash loses the checkpoint anyway.
  if (rename(tmp.c_str(), path.c_str()) != 0) return StatusFromErrno(errno, "rename " + tmp);
  return Status::Ok();
}

GpuBackend::LockSpan ReadLockSpan(const std::string& dir) {
  GpuBackend::LockSpan span;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return span;
  while (dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    const bool lock = name.substr(0, kLockPrefix.size()) == kLockPrefix &&
                      AllDigits(name.substr(kLockPrefix.size()));
    const bool unlock = name.substr(0, kUnlockPrefix.size()) == kUnlockPrefix &&
                        AllDigits(name.substr(kUnlockPrefix.size()));
    const bool timeout = name.substr(0, kTimeoutPrefix.size()) == kTimeoutPrefix &&
                         AllDigits(name.substr(kTimeoutPrefix.size()));
    if (!lock && !unlock && !timeout) continue;
    auto text = ReadSmallFileNoFollow(dir + "/" + std::string(name), kMaxFileBytes);
    if (!text.ok()) continue;
    const std::optional<int64_t> ns = ParseNs(*text);
    if (!ns) continue;
    if (lock) span.first_lock_ns = std::min(span.first_lock_ns.value_or(*ns), *ns);
    if (unlock) span.last_unlock_ns = std::max(span.last_unlock_ns.value_or(*ns), *ns);
    if (timeout) span.lock_timed_out = true;
  }
  closedir(d);
  return span;
}

}  // namespace gpuckpt
