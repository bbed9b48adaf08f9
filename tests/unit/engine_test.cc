// The engine's parts and the control-file commands over a real Store, with
// real CRIU where an Engine is needed: metrics text, the operation board,
// the kill journal, every way a command can be wrong, and a checkpoint and
// restore of a small process through the commands gpuckptfs runs.
#include "core/engine/engine.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <latch>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/base/log.h"
#include "core/base/time_text.h"
#include "core/criu/images.h"
#include "core/engine/engine_internal.h"
#include "core/engine/kill_journal.h"
#include "core/engine/metrics.h"
#include "core/engine/operation_board.h"
#include "core/engine/retention.h"
#include "core/manifest/checkpoint_manifest.h"
#include "fs/commands.h"
#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/version.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using namespace std::chrono_literals;
using testing::MakeDirs;
using testing::TempDir;
using testing::WriteFile;

// --- helpers ----------------------------------------------------------------------

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Whether `text` has `line` as one whole line.
bool HasLine(const std::string& text, const std::string& line) {
  return Contains("\n" + text, "\n" + line + "\n");
}

// Parsers for the Prometheus text format (0.0.4). Hand-written: g++ 12's
// <regex> does not build warning-free under the sanitizers.
bool IsNameChar(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

// Consumes a metric name (labels: no ':') from `s` at `*at`.
bool ParseName(const std::string& s, size_t* at, bool label, std::string* name) {
  const size_t begin = *at;
  while (*at < s.size() && IsNameChar(s[*at], *at == begin) && !(label && s[*at] == ':')) ++*at;
  *name = s.substr(begin, *at - begin);
  return *at > begin;
}

bool IsValue(const std::string& v) {
  if (v == "NaN" || v == "+Inf" || v == "-Inf") return true;
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0]))) return false;
  char* end = nullptr;
  std::strtod(v.c_str(), &end);
  return *end == '\0';
}

// `name{label="value",...} value` or `name value`; the name in *name.
bool IsSample(const std::string& line, std::string* name) {
  size_t at = 0;
  if (!ParseName(line, &at, false, name)) return false;
  if (at < line.size() && line[at] == '{') {
    ++at;
    for (bool first = true;; first = false) {
      if (at < line.size() && line[at] == '}' && first) break;
      std::string label;
      if (!ParseName(line, &at, true, &label)) return false;
      if (line.compare(at, 2, "=\"") != 0) return false;
      at += 2;
      while (at < line.size() && line[at] != '"') {
        if (line[at] == '\n') return false;
        at += line[at] == '\\' ? 2 : 1;
      }
      if (at >= line.size()) return false;
      ++at;  // the closing quote
      if (at < line.size() && line[at] == ',') {
        ++at;
        continue;
      }
      if (at < line.size() && line[at] == '}') break;
      return false;
    }
    ++at;  // '}'
  }
  if (at >= line.size() || line[at] != ' ') return false;
  return IsValue(line.substr(at + 1));
}

// `# HELP name text` or `# TYPE name type`: the keyword, name and rest.
bool IsDescriptor(const std::string& line, const std::string& keyword, std::string* name,
                  std::string* rest) {
  const std::string prefix = "# " + keyword + " ";
  if (line.compare(0, prefix.size(), prefix) != 0) return false;
  size_t at = prefix.size();
  if (!ParseName(line, &at, false, name)) return false;
  if (at >= line.size() || line[at] != ' ') return false;
  *rest = line.substr(at + 1);
  return !rest->empty();
}

// Checks `text` against the Prometheus text format (0.0.4): each line is a
// `# HELP name text`, a `# TYPE name type`, another comment, or a sample
// `name{label="value",...} value` / `name value`; each family's HELP and
// TYPE come once, before its samples, and a family's lines are contiguous.
::testing::AssertionResult IsPrometheusText(const std::string& text) {
  static const std::set<std::string> kTypes = {"counter", "gauge", "summary", "histogram",
                                               "untyped"};
  if (text.empty() || text.back() != '\n')
    return ::testing::AssertionFailure() << "does not end with a newline";
  std::map<std::string, std::string> types;  // family -> type
  std::set<std::string> helped, finished;
  std::string current;  // the family whose lines are being read
  auto enter = [&](const std::string& family) -> bool {
    if (family == current) return true;
    if (finished.count(family) != 0) return false;
    if (!current.empty()) finished.insert(current);
    current = family;
    return true;
  };
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    auto fail = [&](const std::string& why) {
      return ::testing::AssertionFailure()
             << "line " << n << " '" << line << "': " << why << "\nwhole text:\n"
             << text;
    };
    std::string name, rest;
    if (line.empty()) continue;
    if (IsDescriptor(line, "HELP", &name, &rest)) {
      if (!helped.insert(name).second) return fail("second HELP");
      if (types.count(name) != 0) return fail("HELP after TYPE");
      if (!enter(name)) return fail("family's lines are not contiguous");
    } else if (IsDescriptor(line, "TYPE", &name, &rest)) {
      if (kTypes.count(rest) == 0) return fail("unknown type");
      if (types.count(name) != 0) return fail("second TYPE");
      types[name] = rest;
      if (!enter(name)) return fail("family's lines are not contiguous");
    } else if (line[0] == '#') {
      if (line.rfind("# HELP", 0) == 0 || line.rfind("# TYPE", 0) == 0)
        return fail("malformed HELP or TYPE");
    } else if (IsSample(line, &name)) {
      std::string family = name;
      if (types.count(family) == 0) {
        // A summary's or histogram's samples carry a suffix.
        for (const std::string suffix : {"_sum", "_count", "_bucket"}) {
          if (family.size() > suffix.size() &&
              family.compare(family.size() - suffix.size(), suffix.size(), suffix) == 0) {
            const std::string base = family.substr(0, family.size() - suffix.size());
            auto it = types.find(base);
            if (it != types.end() && (it->second == "summary" || it->second == "histogram"))
              family = base;
          }
        }
      }
      if (types.count(family) == 0) return fail("sample before its family's TYPE");
      if (helped.count(family) == 0) return fail("sample before its family's HELP");
      if (family != current) return fail("sample outside its family's group of lines");
    } else {
      return fail("neither a comment nor a sample");
    }
  }
  return ::testing::AssertionSuccess();
}

// Root, asking from this process (as a FUSE request's pid says who asks):
// restores go below its cgroups.
Caller Root() { return Caller{0, 0, getpid(), {}}; }

Caller Nobody() {
  Caller c;
  c.uid = 65534;
  c.gid = 65534;
  c.pid = getpid();
  return c;
}

// A process state from /proc ('T' stopped, 'S' sleeping, ...), '?' if gone.
char StateOf(int pid) {
  auto info = ReadProcess(pid, ProcReadOptions{.read_gpu_devices = false});
  return info.ok() ? info->state : '?';
}

// Polls until `pred(state)` holds or `timeout` passes; returns the last state.
template <typename Pred>
char WaitForState(int pid, Pred pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char state = StateOf(pid);
  while (!pred(state) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    state = StateOf(pid);
  }
  return state;
}

// Waits up to `timeout` for `pid` (a child, or an orphan we are the
// subreaper of) to exit; its wait status, or nothing if it did not.
std::optional<int> ReapWithin(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(10ms);
  }
}

// A child running `sleep` in a session of its own (so that CRIU needs no
// --shell-job), stdio on /dev/null. It execs, so that an ASan build's
// shadow mappings are not in what CRIU dumps. Killed and reaped when the
// object goes, unless Release()d.
class Sleeper {
 public:
  Sleeper() {
    pid_ = fork();
    if (pid_ == 0) {
      setsid();
      const int null = open("/dev/null", O_RDWR);
      if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (null > 2) close(null);
      }
      // Nothing inherited beyond stdio: a descriptor of the test runner's
      // (ctest's growing log) would make the restore fail CRIU's file size
      // check, as it did under `ctest -j`.
      close_range(3, ~0U, 0);
      execl("/bin/sleep", "sleep", "1000", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait for the exec, so that nobody looks at the forked copy of us.
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto info = ReadProcess(pid_, ProcReadOptions{.read_gpu_devices = false});
      if (info.ok() && info->comm == "sleep") {
        start_time_ = info->start_time;
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  ~Sleeper() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Sleeper(const Sleeper&) = delete;
  Sleeper& operator=(const Sleeper&) = delete;

  int pid() const { return pid_; }
  bool started() const { return pid_ > 0 && start_time_ != 0; }
  uint64_t start_time() const { return start_time_; }
  // The caller reaps it (or it was reaped).
  void Release() { pid_ = -1; }

 private:
  pid_t pid_ = -1;
  uint64_t start_time_ = 0;
};

// The names in a directory, without . and ..
std::vector<std::string> Entries(const std::string& dir) { return testing::ListDir(dir); }

// --- Metrics ----------------------------------------------------------------------

TEST(MetricsTest, RendersEveryCounterInPrometheusText) {
  Metrics metrics;
  metrics.CountOperation("checkpoint", "ok");
  metrics.CountOperation("checkpoint", "ok");
  metrics.CountOperation("restore", "busy");
  metrics.CountOperation("import", "denied");
  metrics.AddCheckpointBytes(1000, 400, 150);
  metrics.AddCheckpointBytes(24, 1, 2);
  metrics.ObserveStage("checkpoint", "dump", 1.5);
  metrics.ObserveStage("checkpoint", "dump", 0.25);
  metrics.ObserveStage("restore", "restore", 2);
  metrics.ObserveFrozen(0.07);
  metrics.ObserveFrozen(4000);  // beyond the last bucket: only +Inf counts it
  const StoreStats store{.snapshot_count = 3,
                         .logical_bytes = 3000,
                         .chunk_count = 40,
                         .unique_bytes = 2000,
                         .stored_bytes = 900,
                         .disk_bytes = 4096};
  const std::string text = metrics.Render(
      CacheStats{.hits = 5, .misses = 7, .capacity_bytes = 1024}, store, std::nullopt);

  EXPECT_TRUE(IsPrometheusText(text));
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_operations_total{operation="checkpoint",result="ok"} 2)"))
      << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_operations_total{operation="restore",result="busy"} 1)"))
      << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_operations_total{operation="import",result="denied"} 1)"))
      << text;
  // One metric per meaning: the three kinds of bytes are never summed.
  EXPECT_TRUE(HasLine(text, "gpuckpt_checkpoint_logical_bytes_total 1024")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_checkpoint_new_bytes_total 401")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_checkpoint_stored_bytes_total 152")) << text;
  EXPECT_FALSE(Contains(text, "kind=")) << text;
  // Histograms: cumulative buckets, +Inf equal to the count.
  const std::string dump = R"(operation="checkpoint",stage="dump")";
  EXPECT_TRUE(HasLine(text, "gpuckpt_stage_duration_seconds_bucket{" + dump + R"(,le="0.1"} 0)"))
      << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_stage_duration_seconds_bucket{" + dump + R"(,le="0.25"} 1)"))
      << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_stage_duration_seconds_bucket{" + dump + R"(,le="1"} 1)"))
      << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_stage_duration_seconds_bucket{" + dump + R"(,le="2.5"} 2)"))
      << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_stage_duration_seconds_bucket{" + dump + R"(,le="+Inf"} 2)"))
      << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_stage_duration_seconds_sum{" + dump + "} 1.750000")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_stage_duration_seconds_count{" + dump + "} 2")) << text;
  EXPECT_TRUE(HasLine(
      text, R"(gpuckpt_stage_duration_seconds_count{operation="restore",stage="restore"} 1)"))
      << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_checkpoint_frozen_seconds_bucket{le="0.1"} 1)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_checkpoint_frozen_seconds_bucket{le="3600"} 1)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_checkpoint_frozen_seconds_bucket{le="+Inf"} 2)")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_checkpoint_frozen_seconds_count 2")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_checkpoint_frozen_last_seconds 4000.000000")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_checkpoint_frozen_max_seconds 4000.000000")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_store_snapshots 3")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_store_logical_bytes 3000")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_store_chunks 40")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_store_unique_bytes 2000")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_store_stored_bytes 900")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_store_disk_bytes 4096")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_chunk_cache_requests_total{result="hit"} 5)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_chunk_cache_requests_total{result="miss"} 7)")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_chunk_cache_capacity_bytes 1024")) << text;
}

TEST(MetricsTest, ThePoolsCountersAreLabelledWithItsName) {
  Metrics metrics;
  PoolStats pool;
  pool.pool = "ckpt";
  pool.pushes = 3;
  pool.push_failures = 1;
  pool.pulls = 2;
  pool.uploaded_chunks = 10;
  pool.uploaded_bytes = 4096;
  pool.reused_chunks = 7;
  pool.fetched_chunks = 5;
  pool.fetched_bytes = 2048;
  pool.pending = 4;
  const std::string text = metrics.Render(CacheStats{}, std::nullopt, pool);
  EXPECT_TRUE(IsPrometheusText(text)) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_pool_pushes_total{pool="ckpt",result="ok"} 3)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_pool_pushes_total{pool="ckpt",result="failed"} 1)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_pool_pulls_total{pool="ckpt",result="ok"} 2)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_pool_uploaded_bytes_total{pool="ckpt"} 4096)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_pool_reused_chunks_total{pool="ckpt"} 7)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_pool_fetched_bytes_total{pool="ckpt"} 2048)")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_pool_pending_checkpoints{pool="ckpt"} 4)")) << text;
}

TEST(MetricsTest, EveryOperationAndResultIsThereAtZeroFromTheStart) {
  Metrics metrics;
  const std::string text = metrics.Render(CacheStats{}, std::nullopt, std::nullopt);
  EXPECT_TRUE(IsPrometheusText(text));
  // Without a pool, no pool metrics at all (rather than zeros that look
  // like a pool doing nothing).
  EXPECT_FALSE(Contains(text, "gpuckpt_pool_")) << text;
  for (const auto& operation : Metrics::Operations())
    for (const auto& result : Metrics::Results())
      EXPECT_TRUE(HasLine(text, R"(gpuckpt_operations_total{operation=")" + operation +
                                    R"(",result=")" + result + R"("} 0)"))
          << operation << " " << result << "\n"
          << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_checkpoint_logical_bytes_total 0")) << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_checkpoint_frozen_seconds_bucket{le="+Inf"} 0)")) << text;
  EXPECT_TRUE(HasLine(
      text, R"(gpuckpt_stage_duration_seconds_count{operation="checkpoint",stage="commit"} 0)"))
      << text;
  EXPECT_TRUE(HasLine(text, R"(gpuckpt_build_info{version=")" GPUCKPT_VERSION
                            R"(",commit=")" GPUCKPT_COMMIT R"("} 1)"))
      << text;
  // No store totals known: none shown, rather than zeros that look real.
  EXPECT_FALSE(Contains(text, "gpuckpt_store_")) << text;
  EXPECT_TRUE(HasLine(text, "gpuckpt_chunk_cache_capacity_bytes 0")) << text;
}

// The validator itself must reject what Prometheus would.
TEST(MetricsTest, ValidatorRejectsMalformedText) {
  EXPECT_FALSE(IsPrometheusText("foo 1\n"));  // no TYPE
  EXPECT_FALSE(IsPrometheusText("# HELP foo x\n# TYPE foo counter\nfoo{a=b} 1\n"));
  EXPECT_FALSE(IsPrometheusText("# HELP foo x\n# TYPE foo counter\nfoo 1 2 3\n"));
  EXPECT_FALSE(IsPrometheusText("# HELP foo x\n# TYPE foo counter\nfoo 1"));
  EXPECT_FALSE(IsPrometheusText("# HELP foo x\n# TYPE foo counter\nfoo{a=\"b} 1\n"));
  EXPECT_FALSE(IsPrometheusText("# HELP foo x\n# TYPE foo counter\nfoo{a=\"b\"} x\n"));
  EXPECT_FALSE(IsPrometheusText("# HELP foo x\n# TYPE foo kounter\nfoo 1\n"));
  EXPECT_FALSE(IsPrometheusText("# TYPE foo counter\n# HELP foo x\nfoo 1\n"));
  EXPECT_FALSE(IsPrometheusText(
      "# HELP a x\n# TYPE a counter\na 1\n# HELP b x\n# TYPE b counter\nb 1\na 2\n"));
  EXPECT_TRUE(
      IsPrometheusText("# HELP s x\n# TYPE s summary\ns_sum{k=\"v\"} 1.5\ns_count{k=\"v\"} 2\n"));
}

TEST(MetricsTest, ResultLabels) {
  for (StatusCode code :
       {StatusCode::kOk, StatusCode::kBusy, StatusCode::kPermissionDenied, StatusCode::kNotFound,
        StatusCode::kInvalidArgument, StatusCode::kNoSpace, StatusCode::kNoMemory,
        StatusCode::kIOError, StatusCode::kAborted, StatusCode::kUnavailable})
    EXPECT_NE(std::count(Metrics::Results().begin(), Metrics::Results().end(), ResultLabel(code)),
              0)
        << ResultLabel(code);
  EXPECT_EQ(ResultLabel(StatusCode::kOk), "ok");
  EXPECT_EQ(ResultLabel(StatusCode::kBusy), "busy");
  EXPECT_EQ(ResultLabel(StatusCode::kPermissionDenied), "denied");
  EXPECT_EQ(ResultLabel(StatusCode::kNoSuchProcess), "not_found");
  EXPECT_EQ(ResultLabel(StatusCode::kNotFound), "not_found");
  EXPECT_EQ(ResultLabel(StatusCode::kInvalidArgument), "invalid");
  EXPECT_EQ(ResultLabel(StatusCode::kNoSpace), "no_space");
  EXPECT_EQ(ResultLabel(StatusCode::kIOError), "failed");
  EXPECT_EQ(ResultLabel(StatusCode::kCorruption), "failed");
  EXPECT_EQ(ResultLabel(StatusCode::kInternal), "failed");
}

// --- OperationBoard ------------------------------------------------------------------

TEST(OperationBoardTest, OneOperationPerProcess) {
  OperationBoard board;
  EXPECT_EQ(board.InFlight(42), "idle");
  EXPECT_EQ(board.Last(42), "none");
  {
    ASSERT_OK_AND_ASSIGN(auto ticket, board.Begin(42, "checkpoint"));
    auto second = board.Begin(42, "restore");
    ASSERT_CODE(second, StatusCode::kBusy);
    EXPECT_TRUE(Contains(second.status().message(), "checkpoint")) << second.status().message();
    EXPECT_TRUE(Contains(second.status().message(), "42")) << second.status().message();
    // Another process is not affected.
    ASSERT_OK_AND_ASSIGN(auto other, board.Begin(43, "restore"));
    EXPECT_TRUE(Contains(board.InFlight(43), "restore")) << board.InFlight(43);

    ticket->SetStage("dump");
    ticket->SetBytes(1'500'000);
    const std::string shown = board.InFlight(42);
    EXPECT_EQ(shown.rfind("checkpoint (", 0), 0u) << shown;
    EXPECT_TRUE(Contains(shown, "copying memory")) << shown;
    EXPECT_TRUE(Contains(shown, "1.5 MB read")) << shown;
    // With an estimate: the total, the share and the time left.
    ticket->SetExpectedBytes(6'000'000);
    const std::optional<OperationInFlight> op = board.InFlightInfo(42);
    ASSERT_TRUE(op.has_value());
    EXPECT_EQ(op->Percent(), 25);
    ASSERT_TRUE(op->EtaSeconds().has_value());
    EXPECT_NEAR(*op->EtaSeconds(), 3 * op->stage_elapsed_s, 1e-9);
    EXPECT_TRUE(Contains(board.InFlight(42), "1.5 of about 6.0 MB (25%)")) << board.InFlight(42);
    EXPECT_TRUE(Contains(board.InFlight(42), "s left")) << board.InFlight(42);
    ticket->SetResult("checkpoint 42-1 ok");
  }
  EXPECT_EQ(board.InFlight(42), "idle");
  EXPECT_EQ(board.Last(42), "checkpoint 42-1 ok");
  {
    ASSERT_OK_AND_ASSIGN(auto again, board.Begin(42, "restore"));
    EXPECT_TRUE(Contains(board.InFlight(42), "restore (preparing")) << board.InFlight(42);
    // The last result stays until this one sets its own.
    EXPECT_EQ(board.Last(42), "checkpoint 42-1 ok");
    again->SetResult("restore failed: x");
  }
  EXPECT_EQ(board.Last(42), "restore failed: x");
}

// `last:` is one line with the cause; what else a failure says (more lines
// of the error, CRIU's lines) is its detail, and its CRIU log and times are
// kept apart.
TEST(OperationBoardTest, FailureIsOneSummaryLineWithDetailApart) {
  OperationBoard board;
  const int64_t before = UnixNowNs();
  {
    ASSERT_OK_AND_ASSIGN(auto ticket, board.Begin(7, "checkpoint"));
    ticket->AddDetail({"criu line 1\ncriu line 2", ""});
    ticket->SetCriuLog("/state/criu-logs/x/t-checkpoint-7.log");
    ticket->SetFailure(Status::IOError("criu dump of process 7 failed: the cause\nsecond line"));
    // Not shown before the operation ends.
    EXPECT_EQ(board.Last(7), "none");
  }
  EXPECT_EQ(board.Last(7), "checkpoint failed: criu dump of process 7 failed: the cause");
  ASSERT_TRUE(board.LastOutcome(7).has_value());
  const OperationOutcome last = *board.LastOutcome(7);
  EXPECT_FALSE(last.ok);
  EXPECT_EQ(last.operation, "checkpoint");
  EXPECT_EQ(last.detail, (std::vector<std::string>{"second line", "criu line 1", "criu line 2"}));
  EXPECT_EQ(last.criu_log, "/state/criu-logs/x/t-checkpoint-7.log");
  EXPECT_GE(last.started_ns, before);
  EXPECT_GE(last.ended_ns, last.started_ns);
  EXPECT_LE(last.ended_ns, UnixNowNs());
  // An operation that sets no outcome leaves the last one standing.
  { ASSERT_OK_AND_ASSIGN(auto ticket, board.Begin(7, "restore")); }
  EXPECT_EQ(board.LastOutcome(7)->criu_log, "/state/criu-logs/x/t-checkpoint-7.log");
  ASSERT_OK_AND_ASSIGN(auto running, board.Begin(7, "restore"));
  running->SetStage("restore");
  ASSERT_TRUE(board.InFlightInfo(7).has_value());
  EXPECT_EQ(board.InFlightInfo(7)->stage, "restore");
  EXPECT_GE(board.InFlightInfo(7)->started_ns, before);
}

TEST(OperationBoardTest, UnlistedTicketsShowNowhereAndBlockNothing) {
  OperationBoard board;
  auto first = OperationBoard::Unlisted();
  auto second = OperationBoard::Unlisted();  // two at once
  first->SetStage("restore");
  first->SetBytes(10);
  first->SetResult("restore of x ok as pid 1234");
  EXPECT_EQ(board.InFlight(1), "idle");
  EXPECT_EQ(board.Last(1), "none");
  ASSERT_OK_AND_ASSIGN(auto listed, board.Begin(1, "checkpoint"));
  EXPECT_TRUE(Contains(board.InFlight(1), "checkpoint")) << board.InFlight(1);
}

TEST(OperationBoardTest, ConcurrentBeginHasOneWinner) {
  OperationBoard board;
  constexpr int kThreads = 8;
  for (int round = 0; round < 50; ++round) {
    std::latch start(kThreads);
    std::vector<std::optional<Result<std::unique_ptr<OperationBoard::Ticket>>>> results(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        results[i].emplace(board.Begin(7, "checkpoint"));
      });
    }
    for (auto& t : threads) t.join();
    int won = 0, busy = 0;
    for (const auto& r : results) {
      ASSERT_TRUE(r.has_value());
      if (r->ok()) ++won;
      if (!r->ok() && r->status().code() == StatusCode::kBusy) ++busy;
    }
    ASSERT_EQ(won, 1) << "round " << round;
    ASSERT_EQ(busy, kThreads - 1) << "round " << round;
    results.clear();  // drops the winner's ticket
    ASSERT_EQ(board.InFlight(7), "idle") << "round " << round;
  }
}

// --- KillJournal -------------------------------------------------------------------

// A sleeping process with the given real, effective and saved uids (and
// gid `gid`), killed when it goes out of scope.
class ProcessAs {
 public:
  ProcessAs(uid_t ruid, uid_t euid, gid_t gid) {
    int ready[2];
    if (pipe(ready) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      if (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
          setresuid(ruid, euid, euid) != 0)
        _exit(126);
      (void)!write(ready[1], "r", 1);
      close(ready[1]);
      pause();
      _exit(0);
    }
    close(ready[1]);
    char byte;
    if (read(ready[0], &byte, 1) != 1) pid_ = -1;
    close(ready[0]);
  }
  ~ProcessAs() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  ProcessAs(const ProcessAs&) = delete;
  ProcessAs& operator=(const ProcessAs&) = delete;
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
};

// Whose a tree is decides whose checkpoint it is and whom CRIU runs as: a
// tree wholly one ordinary user's is that user's; one that holds root's
// processes, another user's, or a process root in any of its uids (a
// setuid program) is nobody's alone.
TEST(TreeIdentityTest, OnlyATreeWhollyOneOrdinaryUsersIsTheirs) {
  if (geteuid() != 0) GTEST_SKIP() << "making processes of other users needs root";
  ProcessAs user(65534, 65534, 65534);
  ProcessAs other(65533, 65533, 65533);
  ProcessAs setuid_like(65534, 0, 65534);
  ProcessAs root(0, 0, 0);
  for (const ProcessAs* p : {&user, &other, &setuid_like, &root}) ASSERT_GT(p->pid(), 0);
  auto read = [](int pid) {
    auto info = ReadProcess(pid, ProcReadOptions{.read_gpu_devices = false});
    EXPECT_OK(info.status());
    return info.ok() ? *info : ProcessInfo{};
  };
  const TreeIdentity alone = IdentifyTree(read(user.pid()), {user.pid()});
  ASSERT_TRUE(alone.user.has_value());
  EXPECT_EQ(alone.user->uid, 65534u);
  EXPECT_EQ(alone.user->gid, 65534u);
  EXPECT_EQ(alone.start_times.size(), 1u);
  EXPECT_FALSE(IdentifyTree(read(user.pid()), {user.pid(), root.pid()}).user);
  EXPECT_FALSE(IdentifyTree(read(root.pid()), {root.pid(), user.pid()}).user);
  EXPECT_FALSE(IdentifyTree(read(user.pid()), {user.pid(), other.pid()}).user);
  EXPECT_FALSE(IdentifyTree(read(setuid_like.pid()), {setuid_like.pid()}).user);
  EXPECT_FALSE(IdentifyTree(read(root.pid()), {root.pid()}).user);
}

TEST(KillJournalTest, ResumeAllContinuesStoppedProcessesAndClears) {
  TempDir tmp;
  Sleeper child;
  ASSERT_TRUE(child.started());
  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid(), &status, WUNTRACED), child.pid());
  ASSERT_TRUE(WIFSTOPPED(status));
  ASSERT_EQ(StateOf(child.pid()), 'T');

  KillJournal journal(tmp.Sub("stopped"));
  ASSERT_OK(journal.Add({child.pid()}, {child.start_time()}));
  EXPECT_EQ(Entries(tmp.Sub("stopped")).size(), 1u);
  journal.ResumeAll();
  const char state = WaitForState(
      child.pid(), [](char s) { return s != 'T'; }, 2s);
  EXPECT_NE(state, 'T') << "process " << child.pid() << " still stopped";
  EXPECT_NE(state, '?');
  EXPECT_TRUE(Entries(tmp.Sub("stopped")).empty());
}

TEST(KillJournalTest, WrongStartTimeIsNotResumed) {
  TempDir tmp;
  Sleeper child;
  ASSERT_TRUE(child.started());
  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid(), &status, WUNTRACED), child.pid());

  // The pid with another start time: a process that reused the pid.
  KillJournal journal(tmp.Sub("stopped"));
  ASSERT_OK(journal.Add({child.pid()}, {child.start_time() + 1}));
  journal.ResumeAll();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(StateOf(child.pid()), 'T');
  EXPECT_TRUE(Entries(tmp.Sub("stopped")).empty());

  // Remove() forgets an entry without touching the process.
  ASSERT_OK(journal.Add({child.pid()}, {child.start_time()}));
  journal.Remove({child.pid()}, {child.start_time()});
  EXPECT_TRUE(Entries(tmp.Sub("stopped")).empty());
  journal.ResumeAll();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(StateOf(child.pid()), 'T');

  // The right start time resumes it.
  ResumeProcesses({child.pid()}, {child.start_time()});
  EXPECT_NE(WaitForState(
                child.pid(), [](char s) { return s != 'T'; }, 2s),
            'T');
}

// A journal left by a daemon that died mid `checkpoint --kill` is repaired
// by the next Engine.
TEST(KillJournalTest, EngineCreateResumesInterruptedKills) {
  if (geteuid() != 0) GTEST_SKIP() << "the engine needs root";
  if (auto criu = Criu::Find(""); !criu.ok())
    GTEST_SKIP() << "no criu: " << criu.status().message();
  TempDir tmp;
  Sleeper child;
  ASSERT_TRUE(child.started());
  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid(), &status, WUNTRACED), child.pid());
  MakeDirs(tmp.Sub("work"), 0711);
  ASSERT_OK_AND_ASSIGN(auto store, Store::Open(tmp.Sub("store"), testing::TestOptions()));
  const std::string journal = KillJournalDir(tmp.Sub("work"), store->dir());
  ASSERT_OK(KillJournal(journal).Add({child.pid()}, {child.start_time()}));

  EngineOptions options;
  options.work_dir = tmp.Sub("work");
  options.state_dir = tmp.Sub("state");
  options.mountpoint = tmp.Sub("mnt");
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(store.get(), MakeNoGpuBackend(), options));
  EXPECT_NE(WaitForState(
                child.pid(), [](char s) { return s != 'T'; }, 2s),
            'T');
  EXPECT_TRUE(Entries(journal).empty());
}

// --- commands against a real Engine -------------------------------------------------

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "the engine runs as root (CRIU and chown need it)";
    if (auto criu = Criu::Find(""); !criu.ok())
      GTEST_SKIP() << "no criu: " << criu.status().message();
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
    ASSERT_OK_AND_ASSIGN(engine_, Engine::Create(store_.get(), MakeNoGpuBackend(), Options("")));
  }

  // An engine's options in this test's directory; `suffix` keeps a second
  // engine's work and state directories apart from the first's.
  EngineOptions Options(const std::string& suffix) {
    EngineOptions options;
    options.work_dir = tmp_.Sub("work" + suffix);
    options.state_dir = tmp_.Sub("state" + suffix);
    options.mountpoint = mnt_;
    options.all_processes = true;
    options.process_cache_ttl = 0ms;
    return options;
  }

  Status Run(NodeKind file, int pid, const std::string& line, const Caller& caller = Root()) {
    return RunCommand(*engine_, file, pid, line, caller);
  }
  Status Ctl(const std::string& line, const Caller& caller = Root()) {
    return Run(NodeKind::kCtl, 0, line, caller);
  }
  Status Restore(const std::string& line, const Caller& caller = Root()) {
    return Run(NodeKind::kRestore, 0, line, caller);
  }

  // The summary of the last operation in <pid>/status (its "last:" line).
  std::string LastOf(int pid) {
    auto info = ReadProcess(pid);
    if (!info.ok()) return "<cannot read process: " + info.status().message() + ">";
    const ProcessStatusReport report = engine_->ProcessStatus(*info);
    return report.last ? report.last->summary : "<no last operation>";
  }

  std::vector<std::string> SnapshotIds() {
    std::vector<std::string> ids;
    auto list = store_->List();
    EXPECT_OK(list);
    if (list.ok())
      for (const auto& s : *list) ids.push_back(s.id);
    return ids;
  }

  TempDir tmp_;
  const std::string mnt_ = tmp_.Sub("mnt");
  std::unique_ptr<Store> store_;
  std::unique_ptr<Engine> engine_;
};

// Every malformed <pid>/ctl write is kInvalidArgument, and <pid>/status
// says why; nothing is checkpointed.
TEST_F(EngineTest, PidCtlRejectsBadCommandsAndRecordsWhy) {
  Sleeper child;
  ASSERT_TRUE(child.started());
  struct Case {
    std::string line;
    std::string why;  // in the "last:" line
  };
  const std::vector<Case> cases = {
      {"frobnicate", "unknown command 'frobnicate'"},
      {"", "unknown command"},
      {"checkpoint --bogus", "--bogus"},
      {"checkpoint extra", "extra"},
      {"checkpoint --name", "--name"},
      {"checkpoint " + std::string(5000, 'a'), "too long"},
      {std::string("checkpoint\0--kill", 17), "one line"},
      {"checkpoint\n--kill", "one line"},
      {"checkpoint --name \"foo", "quot"},
      {"checkpoint --lock-timeout", "--lock-timeout"},
      {"checkpoint --lock-timeout 0", "--lock-timeout"},
      {"checkpoint --lock-timeout -5", "--lock-timeout"},
      {"checkpoint --lock-timeout soon", "--lock-timeout"},
      {"checkpoint --lock-timeout 99999999999", "--lock-timeout"},
      {"checkpoint --every", "--every"},
      {"checkpoint --every 30", "--every"},  // a unit is required
      {"checkpoint --every 0s", "--every"},
      {"checkpoint --every soon", "--every"},
      {"checkpoint --every 400d", "--every"},
      {"checkpoint --every 10s --kill", "--kill"},
      {"checkpoint --every 10s --name x", "--name"},
      {"checkpoint --every off --keep-last 2", "no other option"},
      {"checkpoint --keep-last 0", "--keep-last"},
      {"checkpoint --keep-last many", "--keep-last"},
      {"checkpoint --keep-within 5", "--keep-within"},
      {"checkpoint --every off --owner-keep-last 2", "no other option"},
      {"checkpoint --owner-keep-last 0", "--owner-keep-last"},
      {"checkpoint --owner-keep-within 1y", "--owner-keep-within"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE("command '" + c.line.substr(0, 60) + "'");
    // A failure recorded before, so that a case that records nothing shows.
    const std::string marker = "marker-" + std::to_string(i);
    EXPECT_CODE(Run(NodeKind::kPidCtl, child.pid(), marker), StatusCode::kInvalidArgument);
    ASSERT_TRUE(Contains(LastOf(child.pid()), marker)) << LastOf(child.pid());

    EXPECT_CODE(Run(NodeKind::kPidCtl, child.pid(), c.line), StatusCode::kInvalidArgument);
    const std::string last = LastOf(child.pid());
    EXPECT_FALSE(Contains(last, marker)) << "not recorded in status: " << last;
    EXPECT_TRUE(Contains(last, "failed")) << last;
    EXPECT_TRUE(Contains(last, c.why)) << last;
  }
  EXPECT_TRUE(SnapshotIds().empty()) << "a malformed command made a checkpoint";
  EXPECT_NE(StateOf(child.pid()), '?');
  const std::string metrics = engine_->MetricsText();
  EXPECT_TRUE(IsPrometheusText(metrics));
  EXPECT_TRUE(
      Contains(metrics, R"(gpuckpt_operations_total{operation="command",result="invalid"})"))
      << metrics;
}

// A command refused before it ran (the caller runs too many already) is
// recorded where a failed one is: <pid>/status's last: line, or restore.
TEST_F(EngineTest, ARefusedCommandSaysWhyWhereTheCallerReadsResults) {
  Sleeper child;
  ASSERT_TRUE(child.started());
  const Status busy = Status::Busy("uid 0 already runs 64 commands, the most one user may run");
  RecordRefusedCommand(*engine_, NodeKind::kPidCtl, child.pid(), busy, Root());
  EXPECT_TRUE(Contains(LastOf(child.pid()), "already runs 64 commands")) << LastOf(child.pid());
  EXPECT_TRUE(Contains(LastOf(child.pid()), "failed")) << LastOf(child.pid());
  RecordRefusedCommand(*engine_, NodeKind::kRestore, 0, busy, Root());
  EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 0), "error: " + busy.message() + "\n");
  // ctl has no result file: nothing else changes.
  RecordRefusedCommand(*engine_, NodeKind::kCtl, 0, Status::Busy("ctl refused"), Root());
  EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 0), "error: " + busy.message() + "\n");
}

// What <pid>/status shows, as the engine reports it: the process as read,
// its GPU as the backend describes it, no operation in flight, and the last
// one's outcome with its times.
TEST_F(EngineTest, StatusReportsTheProcessAndTheLastOutcome) {
  Sleeper child;
  ASSERT_TRUE(child.started());
  ASSERT_OK_AND_ASSIGN(ProcessInfo info, ReadProcess(child.pid()));
  ProcessStatusReport report = engine_->ProcessStatus(info);
  EXPECT_EQ(report.process.pid, child.pid());
  EXPECT_EQ(report.gpu.unavailable_reason, "");
  ASSERT_TRUE(report.gpu.process.has_value());
  EXPECT_EQ(report.gpu.process->state, GpuState::kNone);
  EXPECT_FALSE(report.operation.has_value());
  EXPECT_FALSE(report.last.has_value());
  EXPECT_FALSE(report.pool.has_value());

  const int64_t before = UnixNowNs();
  EXPECT_CODE(Run(NodeKind::kPidCtl, child.pid(), "frobnicate"), StatusCode::kInvalidArgument);
  report = engine_->ProcessStatus(info);
  ASSERT_TRUE(report.last.has_value());
  EXPECT_EQ(report.last->operation, "command");
  EXPECT_FALSE(report.last->ok);
  EXPECT_TRUE(Contains(report.last->summary, "unknown command 'frobnicate'"))
      << report.last->summary;
  EXPECT_EQ(report.last->criu_log, "");
  EXPECT_EQ(report.last->checkpoint, "");
  EXPECT_GE(report.last->started_ns, before);
  EXPECT_GE(report.last->ended_ns, report.last->started_ns);
  EXPECT_FALSE(report.operation.has_value());
}

TEST_F(EngineTest, GlobalCtlRejectsBadCommands) {
  Sleeper child;
  ASSERT_TRUE(child.started());
  for (const std::string& line :
       {std::string("frobnicate"), std::string(""), std::string("gc now"), std::string("track"),
        std::string("track 1 2"), std::string("import"), std::string("import /a b c"),
        std::string("track ") + std::string(5000, '1'), std::string("gc\0", 3),
        std::string("track\n1"), std::string("track abc"), std::string("track 12abc"),
        std::string("track 0"), std::string("track -5"), std::string("track 99999999999"),
        std::string("import relative/dir"), std::string("import ./x name"),
        "track '" + std::to_string(child.pid())}) {
    SCOPED_TRACE("command '" + line.substr(0, 60) + "'");
    EXPECT_CODE(Ctl(line), StatusCode::kInvalidArgument);
  }
  // The same pid, well formed, is tracked: the rejections above were the syntax.
  EXPECT_OK(Ctl("track " + std::to_string(child.pid())));
  EXPECT_OK(Ctl("  track   " + std::to_string(child.pid()) + "  "));
}

TEST_F(EngineTest, TrackOfMissingProcessIsNoSuchProcess) {
  // A pid that was just reaped (and is, almost surely, not reused yet).
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  EXPECT_CODE(Ctl("track " + std::to_string(gone)), StatusCode::kNoSuchProcess);
}

TEST_F(EngineTest, GcIsForRootOnly) {
  EXPECT_CODE(Ctl("gc", Nobody()), StatusCode::kPermissionDenied);
  EXPECT_OK(Ctl("gc", Root()));
}

TEST_F(EngineTest, RestoreRejectsBadPaths) {
  EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 0), "none\n");
  // The plain directory has files, but no pstree.img.
  MakeDirs(tmp_.Sub("plain/sub"));
  WriteFile(tmp_.Sub("plain/core-1.img"), "not an image");
  WriteFile(tmp_.Sub("plain/sub/pstree.img"), "too deep to count");
  const std::vector<std::string> paths = {
      "",
      "relative/path",
      "./" + tmp_.Sub("plain"),
      std::string(5000, '/'),
      tmp_.Sub("plain") + std::string("\0x", 2),
      mnt_ + "/README",
      mnt_ + "/ctl",
      mnt_ + "/checkpoints",
      mnt_ + "/checkpoints/a/images/pstree.img",
      mnt_ + "/123/status",
      mnt_ + "/123/checkpoints/1",  // no checkpoint of 123
      tmp_.Sub("plain"),
      tmp_.Sub("plain/core-1.img"),  // a file, not a directory
  };
  for (const auto& path : paths) {
    SCOPED_TRACE("restore '" + path.substr(0, 60) + "'");
    for (const Caller& caller : {Root(), Nobody()}) {
      // Whose a directory is, is asked before what is in it: root's plain
      // directory is absent to nobody for that, as another's checkpoint is.
      const StatusCode expected = caller.uid != 0 && path == tmp_.Sub("plain")
                                      ? StatusCode::kNotFound
                                      : StatusCode::kInvalidArgument;
      EXPECT_CODE(Restore(path, caller), expected);
      const std::string result = engine_->LastResult(ResultFile::kRestore, caller.uid);
      EXPECT_EQ(result.rfind("error: ", 0), 0u) << result;
      EXPECT_EQ(result.back(), '\n');
    }
  }
  // Options after the path: only --gpu-map, with a value; and this engine
  // has no GPU backend, so a map is refused with the reason.
  for (const std::string& line :
       {tmp_.Sub("plain") + " --bogus", tmp_.Sub("plain") + " --gpu-map",
        tmp_.Sub("plain") + " --gpu-map a=b extra",
        // Appended, not "'" + ...: GCC 12 at -O3 warns falsely (-Wrestrict)
        // about the prepend that operator+ makes of it.
        std::string("'").append(tmp_.Sub("plain")).append(" --gpu-map x=y"),
        std::string(" --gpu-map GPU-1=GPU-2")}) {
    SCOPED_TRACE("restore '" + line + "'");
    EXPECT_CODE(Restore(line), StatusCode::kInvalidArgument);
    EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 0).rfind("error: ", 0), 0u)
        << engine_->LastResult(ResultFile::kRestore, 0);
  }
  // Results are per user.
  EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 1234), "none\n");
  EXPECT_TRUE(SnapshotIds().empty());
}

// Another user's copy is absent to a user (ENOENT), as another user's
// checkpoints are in the mount, without naming its owner.
TEST_F(EngineTest, AnotherUsersCopyIsAbsentToAUser) {
  const std::string dir = tmp_.Sub("roots");
  MakeDirs(dir, 0755);
  WriteFile(dir + "/pstree.img", "root's", 0644);
  for (const Status& s : {Ctl("import " + dir, Nobody()), Restore(dir, Nobody())}) {
    EXPECT_CODE(s, StatusCode::kNotFound);
    EXPECT_EQ(s.message().find("uid"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(SnapshotIds().empty());
}

TEST_F(EngineTest, ImportReadsOnlyTheCallersFiles) {
  const std::string dir = tmp_.Sub("theirs");
  MakeDirs(dir, 0755);
  ASSERT_EQ(chown(dir.c_str(), 65534, 65534), 0);
  WriteFile(dir + "/pstree.img", "root's file, not an image", 0644);  // owned by root
  EXPECT_CODE(Ctl("import " + dir, Nobody()), StatusCode::kPermissionDenied);
  EXPECT_CODE(Ctl("import " + dir + " mine", Nobody()), StatusCode::kPermissionDenied);
  EXPECT_CODE(Restore(dir, Nobody()), StatusCode::kPermissionDenied);
  EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 65534).rfind("error: ", 0), 0u);
  // Made theirs, the same file gets past the owner check and fails as what
  // it is: not an image.
  ASSERT_EQ(chown((dir + "/pstree.img").c_str(), 65534, 65534), 0);
  Status s = Ctl("import " + dir, Nobody());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), StatusCode::kPermissionDenied) << s.message();
  EXPECT_TRUE(SnapshotIds().empty());
}

// A copy made by an older version holds device/ (views of its pages image,
// the device memory a second time). An import leaves it out unread (a file
// there that is not the caller's would otherwise refuse it), so it stores
// the checkpoint's logical size; it keeps the manifest's well-formed device
// ranges, from which the mount shows device/<id> again.
TEST_F(EngineTest, ImportOfACopyLeavesItsDeviceDirectoryOut) {
  const std::string copy = tmp_.Sub("copy");
  MakeDirs(copy + "/images");
  MakeDirs(copy + "/device");
  const std::string pstree = testing::CriuImageBytes(
      kCriuPstreeMagic, {testing::ProtoVarintField(1, 4321) + testing::ProtoVarintField(2, 0) +
                         testing::ProtoVarintField(3, 4321) + testing::ProtoVarintField(4, 4321) +
                         testing::ProtoVarintField(5, 4321)});
  const std::string pages = testing::RandomBytes(8192, 3);
  WriteFile(copy + "/images/pstree.img", pstree, 0600);
  WriteFile(copy + "/images/pages-1.img", pages, 0600);
  const nlohmann::json good = {{"pid", 4321}, {"start", 4096}, {"end", 12288}};
  const nlohmann::json manifest = {{"id", "4321-1"},
                                   {"extra",
                                    {{"gpu_backend", "none"},
                                     {"device",
                                      {{"cuda_host_ranges",
                                        {good,
                                         {{"pid", "x"}, {"start", 0}, {"end", 1}},
                                         {{"pid", 4321}, {"start", 9}, {"end", 5}}}}}}}}};
  WriteFile(copy + "/manifest.json", manifest.dump(), 0600);
  WriteFile(copy + "/device/cuda-4321-1000.bin", std::string(8192, 'x'), 0600);
  WriteFile(copy + "/device/cuda-ranges.json", "{}", 0600);
  // The copy is nobody's, but for one file of its device/ (root's).
  for (const std::string& path :
       {copy, copy + "/images", copy + "/images/pstree.img", copy + "/images/pages-1.img",
        copy + "/manifest.json", copy + "/device", copy + "/device/cuda-4321-1000.bin"})
    ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0) << path;

  ASSERT_OK(Ctl("import " + copy + " old-copy", Nobody()));
  const std::string id = "65534.old-copy";
  ASSERT_EQ(SnapshotIds(), std::vector<std::string>{id});
  ASSERT_OK_AND_ASSIGN(auto files, store_->ListFiles(id));
  std::vector<std::string> paths;
  for (const auto& f : files) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"images", "images/pages-1.img", "images/pstree.img"}));
  ASSERT_OK_AND_ASSIGN(SnapshotInfo info, store_->Get(id));
  EXPECT_EQ(info.logical_bytes, pstree.size() + pages.size());
  auto extra = nlohmann::json::parse(info.extra_json, nullptr, false);
  ASSERT_TRUE(extra.is_object()) << info.extra_json;
  EXPECT_EQ(extra["device"]["cuda_host_ranges"], nlohmann::json::array({good})) << info.extra_json;
}

// A real checkpoint and restore of a small process, through the commands.
// A Store that forwards every call to another, counting List(): what the
// engine reads of the whole store.
class ListCountingStore final : public Store {
 public:
  explicit ListCountingStore(Store* store) : store_(store) {}
  int lists() const { return lists_.load(); }

  using Store::BeginSnapshot;
  Result<std::unique_ptr<SnapshotWriter>> BeginSnapshot(
      const SnapshotSpec& spec, const SnapshotWriterOptions& options) override {
    return store_->BeginSnapshot(spec, options);
  }
  Result<SnapshotInfo> ImportDirectory(const std::string& src_dir, const SnapshotSpec& spec,
                                       const ProgressFn& progress) override {
    return store_->ImportDirectory(src_dir, spec, progress);
  }
  Status Export(const std::string& id, const std::string& dest_dir,
                const ProgressFn& progress) override {
    return store_->Export(id, dest_dir, progress);
  }
  Result<std::vector<SnapshotInfo>> List() override {
    ++lists_;
    return store_->List();
  }
  Result<SnapshotInfo> Get(const std::string& id) override { return store_->Get(id); }
  Result<std::vector<FileEntry>> ListFiles(const std::string& id) override {
    return store_->ListFiles(id);
  }
  Result<std::unique_ptr<FileReader>> OpenFile(const std::string& id,
                                               const std::string& path) override {
    return store_->OpenFile(id, path);
  }
  Result<std::unique_ptr<FileReader>> OpenListedFile(const std::string& id, uint64_t key,
                                                     const FileEntry& entry) override {
    return store_->OpenListedFile(id, key, entry);
  }
  Status Remove(const std::string& id) override { return store_->Remove(id); }
  Result<GcReport> Gc() override { return store_->Gc(); }
  Result<FsckReport> Fsck() override { return store_->Fsck(); }
  Result<StoreStats> Stats() override { return store_->Stats(); }
  Result<uint64_t> HeldBytes(const std::vector<std::string>& ids) override {
    return store_->HeldBytes(ids);
  }
  uint64_t settled_snapshots() const override { return store_->settled_snapshots(); }
  Result<uint64_t> FreeBytes() override { return store_->FreeBytes(); }
  CacheStats cache_stats() const override { return store_->cache_stats(); }
  std::optional<PoolStats> pool_stats() const override { return store_->pool_stats(); }
  const std::string& dir() const override { return store_->dir(); }

 private:
  Store* const store_;
  std::atomic<int> lists_{0};
};

// A checkpoint asks the engine's catalog, not the store, for its name and
// its parent: without a shared pool it never lists the store, however
// many checkpoints the store holds. A checkpoint removed (through the
// mount, which tells the engine) is nobody's parent any more.
TEST_F(EngineTest, CheckpointsNeverListTheStore) {
  ListCountingStore counting(store_.get());
  ASSERT_OK_AND_ASSIGN(auto engine,
                       Engine::Create(&counting, MakeNoGpuBackend(), Options("-counted")));
  EXPECT_EQ(counting.lists(), 1);  // the catalog, loaded once
  Sleeper child;
  ASSERT_TRUE(child.started());
  const std::string p = std::to_string(child.pid());
  CheckpointRequest request;
  request.pid = child.pid();
  request.caller = Root();
  auto parent_of = [&](const std::string& id) {
    auto info = store_->Get(id);
    EXPECT_OK(info.status());
    return info.ok() ? ManifestOrEmpty(info->extra_json).parent : std::nullopt;
  };

  ASSERT_OK_AND_ASSIGN(SnapshotInfo first, engine->Checkpoint(request));
  EXPECT_EQ(first.id, p + "-1");
  EXPECT_EQ(parent_of(first.id), std::nullopt);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo second, engine->Checkpoint(request));
  EXPECT_EQ(second.id, p + "-2");
  EXPECT_EQ(parent_of(second.id), first.id);
  EXPECT_EQ(counting.lists(), 1);

  ASSERT_OK(counting.Remove(second.id));
  engine->NoteRemoved(second.id, second.key);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo third, engine->Checkpoint(request));
  EXPECT_EQ(third.id, p + "-2");  // the highest left is 1
  EXPECT_EQ(parent_of(third.id), first.id);
  EXPECT_EQ(counting.lists(), 1);
}

// `checkpoint --every` takes one now and then one every interval, each
// followed by the retention it was given; named checkpoints stay; status
// shows the schedule and the rule; `--every off` ends it.
TEST_F(EngineTest, ScheduledCheckpointsWithRetention) {
  Sleeper child;
  ASSERT_TRUE(child.started());
  const int pid = child.pid();
  const std::string p = std::to_string(pid);
  auto series = [&] {
    std::vector<std::string> ids;
    for (const std::string& id : SnapshotIds())
      if (IsSeriesName(id, pid)) ids.push_back(id);
    return ids;
  };
  auto schedule = [&] {
    auto info = ReadProcess(pid);
    EXPECT_OK(info.status());
    return info.ok() ? engine_->ProcessStatus(*info) : ProcessStatusReport{};
  };
  ASSERT_OK(Run(NodeKind::kPidCtl, pid, "checkpoint --name kept"));
  EXPECT_CODE(Run(NodeKind::kPidCtl, pid, "checkpoint --every off"), StatusCode::kNotFound);
  ASSERT_OK(Run(NodeKind::kPidCtl, pid, "checkpoint --every 1s --keep-last 2"));
  EXPECT_EQ(series(), std::vector<std::string>{p + "-1"}) << "not one checkpoint at once";
  ProcessStatusReport report = schedule();
  ASSERT_TRUE(report.schedule);
  EXPECT_EQ(report.schedule->every_s, 1);
  EXPECT_EQ(report.retention.keep_last, 2u);

  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (schedule().schedule->runs < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  report = schedule();
  ASSERT_GE(report.schedule->runs, 3u) << LastOf(pid);
  EXPECT_EQ(report.schedule->failures, 0u) << LastOf(pid);

  ASSERT_OK(Run(NodeKind::kPidCtl, pid, "checkpoint --every off"));
  EXPECT_FALSE(schedule().schedule);
  // A run under way when it stopped still ends, its rule applied after its
  // checkpoint (and `last:` is then that checkpoint's): then nothing more.
  std::this_thread::sleep_for(1500ms);
  const std::vector<std::string> all = SnapshotIds();
  std::this_thread::sleep_for(2500ms);
  EXPECT_EQ(SnapshotIds(), all) << "checkpointed after --every off";
  EXPECT_TRUE(Contains(LastOf(pid), "schedule stopped") || Contains(LastOf(pid), " ok "))
      << LastOf(pid);
  // Of at least four, only the newest two of the series are left.
  const std::vector<std::string> left = series();
  ASSERT_EQ(left.size(), 2u);
  uint64_t newest = 0;
  for (const std::string& id : left)
    newest = std::max<uint64_t>(newest, std::stoull(id.substr(p.size() + 1)));
  EXPECT_GE(newest, 4u);
  EXPECT_NE(std::find(left.begin(), left.end(), p + "-" + std::to_string(newest - 1)), left.end());
  EXPECT_NE(std::find(all.begin(), all.end(), "kept"), all.end())
      << "a named checkpoint was removed";
}

// The daemon's rule applies where a checkpoint gives none; a checkpoint's
// own rule wins.
TEST_F(EngineTest, TheDaemonsRetentionAppliesWhereACheckpointSetsNone) {
  engine_.reset();
  EngineOptions options = Options("-kept");
  options.retention.keep_last = 1;
  ASSERT_OK_AND_ASSIGN(engine_, Engine::Create(store_.get(), MakeNoGpuBackend(), options));
  Sleeper child;
  ASSERT_TRUE(child.started());
  const std::string p = std::to_string(child.pid());
  for (int i = 0; i < 3; ++i) ASSERT_OK(Run(NodeKind::kPidCtl, child.pid(), "checkpoint"));
  EXPECT_EQ(SnapshotIds(), std::vector<std::string>{p + "-3"});
  ASSERT_OK(Run(NodeKind::kPidCtl, child.pid(), "checkpoint --keep-last 2"));
  EXPECT_EQ(SnapshotIds(), (std::vector<std::string>{p + "-3", p + "-4"}));
}

// The owner rule counts the owner's checkpoints of every process: the
// newest N of them stay, named ones and the one just made always; a
// checkpoint's own owner rule wins over the daemon's.
TEST_F(EngineTest, TheOwnerRuleKeepsTheNewestOfAllTheOwnersCheckpoints) {
  engine_.reset();
  EngineOptions options = Options("-owner");
  options.owner_retention.keep_last = 2;
  ASSERT_OK_AND_ASSIGN(engine_, Engine::Create(store_.get(), MakeNoGpuBackend(), options));
  Sleeper first, second;
  ASSERT_TRUE(first.started());
  ASSERT_TRUE(second.started());
  const std::string a = std::to_string(first.pid()), b = std::to_string(second.pid());
  ASSERT_OK(Run(NodeKind::kPidCtl, first.pid(), "checkpoint --name kept"));
  ASSERT_OK(Run(NodeKind::kPidCtl, first.pid(), "checkpoint"));
  ASSERT_OK(Run(NodeKind::kPidCtl, first.pid(), "checkpoint"));
  ASSERT_OK(Run(NodeKind::kPidCtl, second.pid(), "checkpoint"));
  // The first process's first numbered checkpoint went for the second's.
  auto ids = SnapshotIds();
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> expected = {a + "-2", b + "-1", "kept"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(ids, expected);
  ASSERT_OK_AND_ASSIGN(ProcessInfo info, ReadProcess(first.pid()));
  EXPECT_EQ(engine_->ProcessStatus(info).owner_retention.keep_last, 2u);
  ASSERT_OK(Run(NodeKind::kPidCtl, second.pid(), "checkpoint --owner-keep-last 1"));
  ids = SnapshotIds();
  std::sort(ids.begin(), ids.end());
  expected = {b + "-2", "kept"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(ids, expected);
}

TEST_F(EngineTest, CheckpointAndRestoreThroughCommands) {
  // The restored process is reparented from CRIU to its nearest subreaper:
  // us, so that we can reap it.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
  Sleeper child;
  ASSERT_TRUE(child.started());
  const int pid = child.pid();
  const std::string p = std::to_string(pid);

  ASSERT_OK(Run(NodeKind::kPidCtl, pid, "checkpoint"));
  const std::string first = p + "-1";
  {
    ASSERT_OK_AND_ASSIGN(SnapshotInfo info, store_->Get(first));
    EXPECT_EQ(OwnerOf(info).pid, pid);
    EXPECT_EQ(OwnerOf(info).uid, 0u);
    ASSERT_OK_AND_ASSIGN(auto reader, store_->OpenFile(first, "images/pstree.img"));
    EXPECT_GT(reader->entry().size, 0u);
  }
  EXPECT_TRUE(Contains(LastOf(pid), "checkpoint " + first + " ok")) << LastOf(pid);
  // Left running.
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0);
  EXPECT_NE(StateOf(pid), 'T');

  ASSERT_OK(Run(NodeKind::kPidCtl, pid, "checkpoint --name foo"));
  ASSERT_OK(store_->Get("foo").status());
  ASSERT_OK(store_->OpenFile("foo", "images/pstree.img").status());

  // Its pid is taken while it runs.
  Status busy = Restore(mnt_ + "/checkpoints/" + first);
  EXPECT_CODE(busy, StatusCode::kBusy);
  EXPECT_TRUE(Contains(busy.message(), "in use")) << busy.message();
  EXPECT_TRUE(Contains(engine_->LastResult(ResultFile::kRestore, 0), "in use"))
      << engine_->LastResult(ResultFile::kRestore, 0);

  ASSERT_OK(Run(NodeKind::kPidCtl, pid, "checkpoint --kill"));
  const std::string second = p + "-2";
  ASSERT_OK(store_->Get(second).status());
  {
    std::optional<int> status = ReapWithin(pid, 5s);
    ASSERT_TRUE(status.has_value()) << "checkpoint --kill left process " << pid << " alive";
    child.Release();
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
  }
  // Kills and reaps a restored process if an assertion below returns early.
  struct Restored {
    int pid;
    ~Restored() {
      if (kill(pid, SIGKILL) == 0) ReapWithin(pid, 5s);
    }
  } restored{pid};
  EXPECT_TRUE(Entries(KillJournalDir(tmp_.Sub("work"), store_->dir())).empty());

  // A GPU map for a checkpoint of a process without a GPU is refused
  // before CRIU runs, saying why.
  const std::string uuid = "GPU-01234567-89ab-cdef-0123-456789abcdef";
  EXPECT_CODE(Restore(mnt_ + "/checkpoints/" + first + " --gpu-map " + uuid + "=" + uuid),
              StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(engine_->LastResult(ResultFile::kRestore, 0), "--gpu-map"))
      << engine_->LastResult(ResultFile::kRestore, 0);
  // Restore from a path in the mount (not mounted: the engine knows it).
  ASSERT_OK(Restore(mnt_ + "/checkpoints/" + first));
  EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 0), "pid " + p + "\n");
  const char state = WaitForState(
      pid, [](char s) { return s == 'S'; }, 1s);
  EXPECT_TRUE(state == 'S' || state == 'R') << "restored process " << pid << " state " << state;
  {
    auto info = ReadProcess(pid, ProcReadOptions{.read_gpu_devices = false});
    ASSERT_OK(info);
    EXPECT_EQ(info->comm, "sleep");
    EXPECT_EQ(info->sid, pid);
  }
  // A second restore while the first runs: its pid is in use.
  busy = Restore(mnt_ + "/checkpoints/" + second + "/images");
  EXPECT_CODE(busy, StatusCode::kBusy);
  EXPECT_TRUE(Contains(busy.message(), "in use")) << busy.message();
  EXPECT_TRUE(Contains(engine_->LastResult(ResultFile::kRestore, 0), "error: "))
      << engine_->LastResult(ResultFile::kRestore, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(ReapWithin(pid, 5s).has_value()) << "restored process " << pid << " not reaped";

  // Again, from the newest (the --kill) checkpoint, named by an untidy
  // path through the process's directory.
  ASSERT_OK(Restore(mnt_ + "//" + p + "/checkpoints/./latest/"));
  EXPECT_EQ(engine_->LastResult(ResultFile::kRestore, 0), "pid " + p + "\n");
  EXPECT_TRUE(Contains(LastOf(pid), "restore of " + second + " ok")) << LastOf(pid);
  EXPECT_NE(StateOf(pid), '?');
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(ReapWithin(pid, 5s).has_value()) << "restored process " << pid << " not reaped";

  const std::string metrics = engine_->MetricsText();
  EXPECT_TRUE(IsPrometheusText(metrics));
  EXPECT_TRUE(HasLine(metrics, R"(gpuckpt_operations_total{operation="checkpoint",result="ok"} 3)"))
      << metrics;
  EXPECT_TRUE(HasLine(metrics, R"(gpuckpt_operations_total{operation="restore",result="ok"} 2)"))
      << metrics;
  EXPECT_TRUE(HasLine(metrics, R"(gpuckpt_operations_total{operation="restore",result="busy"} 2)"))
      << metrics;
  EXPECT_TRUE(HasLine(
      metrics, R"(gpuckpt_stage_duration_seconds_count{operation="checkpoint",stage="dump"} 3)"))
      << metrics;
  // The store's totals: the three checkpoints left.
  EXPECT_TRUE(HasLine(metrics, "gpuckpt_store_snapshots 3")) << metrics;
  const std::vector<std::string> ids = SnapshotIds();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()),
            (std::set<std::string>{first, second, "foo"}));
}

}  // namespace
}  // namespace gpuckpt
