#include "core/gpu/device_ranges.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/base/small_file.h"
#include "core/base/unique_fd.h"

namespace gpuckpt {
namespace {

using nlohmann::json;

constexpr int kFormatVersion = 1;
// A CUDA process has thousands of mappings, each well under 200 bytes of
// JSON; anything larger than this is not a file we wrote.
constexpr size_t kMaxFileBytes = 64 << 20;

// Reads all of `fd` (procfs files have no size to stat).
Status ReadAll(int fd, size_t limit, std::string* out, std::string_view what) {
  char buf[64 * 1024];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, fmt::format("read {}", what));
    }
    if (n == 0) return Status::Ok();
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > limit) {
      return Status::Corruption(fmt::format("{}: larger than {} bytes", what, limit));
    }
  }
}

// Splits off the next blank-separated field of a maps line.
std::string_view NextField(std::string_view* line) {
  size_t begin = line->find_first_not_of(' ');
  if (begin == std::string_view::npos) {
    *line = {};
    return {};
  }
  line->remove_prefix(begin);
  size_t end = line->find(' ');
  std::string_view field = line->substr(0, end);
  line->remove_prefix(end == std::string_view::npos ? line->size() : end);
  return field;
}

bool ParseHex(std::string_view s, uint64_t* v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ValidPerms(std::string_view p) {
  return p.size() == 4 && (p[0] == 'r' || p[0] == '-') && (p[1] == 'w' || p[1] == '-') &&
         (p[2] == 'x' || p[2] == '-') && (p[3] == 'p' || p[3] == 's');
}

Mapping Part(const Mapping& m, uint64_t start, uint64_t end) {
  return Mapping{start, end, m.perms, m.offset + (start - m.start), m.path};
}

// Writes `data` to a temporary file next to `path`, fsyncs it and renames it
// over `path`, so a reader sees the old file or the whole new one.
Status WriteFileAtomically(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp.XXXXXX";
  UniqueFd fd(mkstemp(tmp.data()));
  if (fd.get() < 0) {
    return StatusFromErrno(errno, fmt::format("create temporary file for {}", path));
  }
  auto fail = [&](const std::string& what) {
    Status s = StatusFromErrno(errno, what);
    unlink(tmp.c_str());
    return s;
  };
  if (fchmod(fd.get(), 0644) != 0) return fail("chmod " + tmp);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write " + tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd.get()) != 0) return fail("fsync " + tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail("rename " + tmp + " to " + path);
  // The rename is only durable once the directory is.
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  UniqueFd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0 || fsync(dir_fd.get()) != 0) {
    return StatusFromErrno(errno, fmt::format("fsync directory {}", dir));
  }
  return Status::Ok();
}

Status Malformed(const std::string& path, std::string_view what) {
  return Status::Corruption(fmt::format("device ranges file {}: {}", path, what));
}

// A non-negative JSON integer field of `obj`.
bool GetUnsigned(const json& obj, const char* key, uint64_t* v) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_unsigned()) return false;
  *v = it->get<uint64_t>();
  return true;
}

}  // namespace

Result<std::vector<Mapping>> ParseMappings(std::string_view text) {
  std::vector<Mapping> mappings;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (line.empty()) continue;
    auto bad = [&](std::string_view field) {
      return Status::IOError(
          fmt::format("maps line {}: bad {} in '{}'", line_no, field, line.substr(0, 120)));
    };
    std::string_view rest = line;
    std::string_view range = NextField(&rest);
    std::string_view perms = NextField(&rest);
    std::string_view offset = NextField(&rest);
    std::string_view dev = NextField(&rest);
    std::string_view inode = NextField(&rest);
    Mapping m;
    size_t dash = range.find('-');
    if (dash == std::string_view::npos || !ParseHex(range.substr(0, dash), &m.start) ||
        !ParseHex(range.substr(dash + 1), &m.end) || m.start >= m.end) {
      return bad("address range");
    }
    if (!ValidPerms(perms)) return bad("permissions");
    if (!ParseHex(offset, &m.offset)) return bad("offset");
    if (dev.find(':') == std::string_view::npos) return bad("device");
    if (inode.empty() || inode.find_first_not_of("0123456789") != std::string_view::npos) {
      return bad("inode");
    }
    m.perms = std::string(perms);
    // The path is the rest of the line after the padding; it may hold blanks.
    size_t path_begin = rest.find_first_not_of(' ');
    if (path_begin != std::string_view::npos) m.path = std::string(rest.substr(path_begin));
    mappings.push_back(std::move(m));
  }
  return mappings;
}

Result<std::vector<Mapping>> ReadMappings(int pid) {
  std::string file = fmt::format("/proc/{}/maps", pid);
  UniqueFd fd(open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    int err = errno == ENOENT ? ESRCH : errno;
    return StatusFromErrno(err, fmt::format("pid {}: open {}", pid, file));
  }
  std::string text;
  // A process's maps can be large, but not this large.
  // (A process that exits while its maps are read fails with ESRCH:
  // kNoSuchProcess.)
  Status s = ReadAll(fd.get(), size_t{1} << 30, &text, file);
  if (!s.ok()) return s.WithContext(fmt::format("pid {}", pid));
  Result<std::vector<Mapping>> mappings = ParseMappings(text);
  if (!mappings.ok()) return mappings.status().WithContext(file);
  return mappings;
}

std::vector<Mapping> NewMappings(const std::vector<Mapping>& before_in,
                                 const std::vector<Mapping>& after) {
  auto by_start = [](const Mapping& a, const Mapping& b) { return a.start < b.start; };
  // /proc gives them sorted; a caller's list might not be.
  std::vector<Mapping> sorted;
  const std::vector<Mapping>* before = &before_in;
  if (!std::is_sorted(before_in.begin(), before_in.end(), by_start)) {
    sorted = before_in;
    std::sort(sorted.begin(), sorted.end(), by_start);
    before = &sorted;
  }
  std::vector<Mapping> added;
  for (const Mapping& a : after) {
    uint64_t covered_to = a.start;
    // The first mapping of `before` that ends after a.start (ends are sorted
    // too, since the mappings do not overlap).
    auto it = std::partition_point(before->begin(), before->end(),
                                   [&](const Mapping& b) { return b.end <= a.start; });
    for (; it != before->end() && it->start < a.end; ++it) {
      if (it->path != a.path || it->perms != a.perms) continue;
      if (it->start > covered_to) added.push_back(Part(a, covered_to, it->start));
      covered_to = std::max(covered_to, it->end);
    }
    if (covered_to < a.end) added.push_back(Part(a, covered_to, a.end));
  }
  std::sort(added.begin(), added.end(), by_start);
  return added;
}

std::string DeviceRangesFileName(int pid) { return fmt::format("cuda-ranges-{}.json", pid); }

Status WriteDeviceRangesFile(const std::string& path, const DeviceRanges& ranges) {
  json list = json::array();
  for (const Mapping& m : ranges.ranges) {
    list.push_back(json{{"start", m.start},
                        {"end", m.end},
                        {"perms", m.perms},
                        {"offset", m.offset},
                        {"path", m.path}});
  }
  json doc = {{"version", kFormatVersion}, {"pid", ranges.pid}, {"ranges", std::move(list)}};
  std::string text;
  try {
    // Paths from /proc are bytes, not necessarily UTF-8: replace what is not.
    text = doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("device ranges for pid {}: {}", ranges.pid, e.what()));
  }
  return WriteFileAtomically(path, text);
}

Result<DeviceRanges> ReadDeviceRangesFile(const std::string& path) {
  // The directory is writable by the user whose CRIU wrote the file.
  GPUCKPT_ASSIGN_OR_RETURN(std::string text, ReadSmallFileNoFollow(path, kMaxFileBytes));

  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Malformed(path, "not JSON");
  if (!doc.is_object()) return Malformed(path, "not a JSON object");
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) {
    return Malformed(path, "no integer \"version\"");
  }
  if (!version->is_number_unsigned() || version->get<uint64_t>() != kFormatVersion) {
    return Malformed(path, fmt::format("unsupported version {} (this gpuckpt reads {})",
                                       version->dump(), kFormatVersion));
  }
  DeviceRanges out;
  uint64_t pid = 0;
  if (!GetUnsigned(doc, "pid", &pid) || pid == 0 || pid > INT_MAX) {
    return Malformed(path, "\"pid\" is not a positive process id");
  }
  out.pid = static_cast<int>(pid);
  auto ranges = doc.find("ranges");
  if (ranges == doc.end() || !ranges->is_array()) return Malformed(path, "no \"ranges\" array");
  out.ranges.reserve(ranges->size());
  for (size_t i = 0; i < ranges->size(); ++i) {
    const json& r = (*ranges)[i];
    auto bad = [&](std::string_view what) {
      return Malformed(path, fmt::format("ranges[{}]: {}", i, what));
    };
    if (!r.is_object()) return bad("not an object");
    Mapping m;
    if (!GetUnsigned(r, "start", &m.start)) return bad("no unsigned \"start\"");
    if (!GetUnsigned(r, "end", &m.end)) return bad("no unsigned \"end\"");
    if (!GetUnsigned(r, "offset", &m.offset)) return bad("no unsigned \"offset\"");
    if (m.start >= m.end) return bad("start is not below end");
    auto perms = r.find("perms");
    if (perms == r.end() || !perms->is_string() || !ValidPerms(perms->get<std::string>())) {
      return bad("\"perms\" is not like \"rw-p\"");
    }
    m.perms = perms->get<std::string>();
    auto p = r.find("path");
    if (p == r.end() || !p->is_string()) return bad("no string \"path\"");
    m.path = p->get<std::string>();
    if (m.path.find_first_of(std::string_view("\0\n", 2)) != std::string::npos) {
      return bad("\"path\" holds a NUL or newline");
    }
    if (!out.ranges.empty() && m.start < out.ranges.back().end) {
      return bad("overlaps or precedes the range before it");
    }
    out.ranges.push_back(std::move(m));
  }
  return out;
}

}  // namespace gpuckpt
