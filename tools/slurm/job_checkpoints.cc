#include "tools/slurm/job_checkpoints.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <functional>
#include <optional>
#include <string_view>

#include "core/base/small_file.h"
#include "core/base/unique_fd.h"
#include "tools/common/mount_checkpoints.h"

namespace gpuckpt {
namespace {

// What a control file's result may be: a line or two.
constexpr size_t kMaxResultBytes = 64 << 10;

// Writes `line` to the control file `path`: the daemon runs the command
// within the write(2), whose errno is the command's.
Status WriteCommand(const std::string& path, const std::string& line) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) return StatusFromErrno(errno, "opening " + path);
  const std::string text = line + "\n";
  if (write(fd.get(), text.data(), text.size()) < 0) return StatusFromErrno(errno, line);
  return Status::Ok();
}

// The line of `text` that starts with `prefix`, without it; "" if none.
std::string LineAfter(const std::string& text, std::string_view prefix) {
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    if (line.starts_with(prefix)) return std::string(line.substr(prefix.size()));
    at = end + 1;
  }
  return "";
}

// `failed` with the daemon's own words for it, read from `result_file`
// after the line starting with `prefix`, when it has some.
Status Explained(const Status& failed, const std::string& result_file, std::string_view prefix) {
  auto result = ReadSmallFileNoFollow(result_file, kMaxResultBytes);
  std::string why = result.ok() ? LineAfter(*result, prefix) : "";
  if (why.empty()) return failed;
  return Status(failed.code(), why);
}

// The number n of "<digits>", n > 0 without leading zeros; nullopt else.
std::optional<int> NumberOf(std::string_view digits) {
  int number = 0;
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
  if (error != std::errc() || end != digits.data() + digits.size() || number <= 0 ||
      digits.front() == '0')
    return std::nullopt;
  return number;
}

// What the daemon puts before a name of the caller's: "<uid>." for a
// non-root user.
std::string CallersIdPrefix() {
  const uid_t uid = geteuid();
  return uid == 0 ? "" : std::to_string(uid) + ".";
}

// The checkpoints under <mount>/checkpoints/ whose id `accept` maps to a
// number.
Result<std::vector<JobCheckpoint>> ListMatching(
    const std::string& mount, const std::function<std::optional<int>(std::string_view)>& accept) {
  GPUCKPT_ASSIGN_OR_RETURN(const std::vector<std::string> ids, CheckpointIdsInMount(mount));
  std::vector<JobCheckpoint> found;
  for (const std::string& id : ids)
    if (auto number = accept(id)) found.push_back({id, *number});
  std::sort(found.begin(), found.end(),
            [](const JobCheckpoint& a, const JobCheckpoint& b) { return a.number < b.number; });
  return found;
}

}  // namespace

std::string BatchSeries(uint32_t job_id) { return "slurm-" + std::to_string(job_id); }

std::string StepSeries(uint32_t job_id, uint32_t step, uint32_t rank) {
  return BatchSeries(job_id) + "." + std::to_string(step) + "." + std::to_string(rank);
}

std::string JobCheckpoints::NameOf(int number) const {
  return series_ + "-" + std::to_string(number);
}

std::string JobCheckpoints::IdOf(int number) const { return CallersIdPrefix() + NameOf(number); }

Result<std::vector<JobCheckpoint>> JobCheckpoints::List() const {
  const std::string prefix = CallersIdPrefix() + series_ + "-";
  return ListMatching(mount_, [&](std::string_view name) -> std::optional<int> {
    if (!name.starts_with(prefix)) return std::nullopt;
    return NumberOf(name.substr(prefix.size()));
  });
}

Result<std::vector<JobCheckpoint>> JobCheckpoints::ListSteps(const std::string& mount,
                                                             uint32_t job_id) {
  // <prefix>slurm-<job>.<step>.<rank>-<n>
  const std::string prefix = CallersIdPrefix() + BatchSeries(job_id) + ".";
  return ListMatching(mount, [&](std::string_view name) -> std::optional<int> {
    if (!name.starts_with(prefix)) return std::nullopt;
    name.remove_prefix(prefix.size());
    const size_t first_dot = name.find('.');
    const size_t dash = name.rfind('-');
    if (first_dot == std::string_view::npos || dash == std::string_view::npos || dash < first_dot)
      return std::nullopt;
    if (!NumberOf(name.substr(0, first_dot)) && name.substr(0, first_dot) != "0")
      return std::nullopt;
    return NumberOf(name.substr(dash + 1));
  });
}

Result<JobCheckpoint> JobCheckpoints::Take(int pid, int number, bool kill) const {
  const std::string dir = mount_ + "/" + std::to_string(pid);
  std::string command = "checkpoint --name " + NameOf(number);
  if (kill) command += " --kill";
  Status done = WriteCommand(dir + "/ctl", command);
  // A failed checkpoint leaves the tree running, and its reason on the
  // process's `last:` line.
  if (!done.ok()) return Explained(done, dir + "/status", "last: ");
  return JobCheckpoint{IdOf(number), number};
}

Result<int> JobCheckpoints::Restore(const JobCheckpoint& checkpoint) const {
  const std::string result_file = mount_ + "/restore";
  Status done =
      WriteCommand(result_file, mount_ + "/checkpoints/" + checkpoint.id + " --join-cgroup");
  if (!done.ok()) return Explained(done, result_file, "error: ");
  GPUCKPT_ASSIGN_OR_RETURN(std::string result, ReadSmallFileNoFollow(result_file, kMaxResultBytes));
  const std::string pid_text = LineAfter(result, "pid ");
  int pid = 0;
  auto [end, error] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
  if (error != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0)
    return Status::Internal("the daemon's answer to the restore is not a pid: " + result);
  return pid;
}

Status JobCheckpoints::RemoveFrom(const std::string& mount, const JobCheckpoint& checkpoint) {
  const std::string path = mount + "/checkpoints/" + checkpoint.id;
  if (rmdir(path.c_str()) != 0) return StatusFromErrno(errno, "removing " + path);
  return Status::Ok();
}

}  // namespace gpuckpt
