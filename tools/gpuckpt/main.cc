// gpuckpt: the command line of the gpuckpt store.
//
//   gpuckpt [--store DIR] import SRC_DIR [--name N] [--base ID]
//   gpuckpt [--store DIR] export ID DEST_DIR
//   gpuckpt [--store DIR] ls [--json]
//   gpuckpt [--store DIR] rm ID
//   gpuckpt [--store DIR] gc | fsck | stats [--json]
//   gpuckpt [--store DIR] report --html FILE
//
// Exit status: 0 success; 1 the operation failed (one line on stderr);
// 2 bad usage; 3 fsck found problems (listed on stdout).
#include <limits.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/base/time_text.h"
#include "core/base/user_name.h"
#include "core/proc/mount_table.h"
#include "core/report/report_gather.h"
#include "core/report/report_html.h"
#include "gpuckpt/store.h"
#include "gpuckpt/version.h"
#include "tools/common/help_format.h"
#include "tools/common/pool_options.h"
#include "tools/gpuckpt/mount_listing.h"
#include "tools/gpuckpt/progress.h"
#include "tools/gpuckpt/report_file.h"

namespace gpuckpt {
namespace {

using nlohmann::json;

constexpr int kExitFailure = 1;
constexpr int kExitFsckProblems = 3;

// Whether errno's text says what an error of `code` is.
bool HasErrnoWords(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kPermissionDenied:
    case StatusCode::kBusy:
    case StatusCode::kIOError:
    case StatusCode::kNoSpace:
    case StatusCode::kNoSuchProcess:
    case StatusCode::kNoMemory:
    case StatusCode::kTimedOut:
      return true;
    default:  // a damaged store, an unreachable pool: the message says it
      return false;
  }
}

// One line in words: the message, and what the error is as errno's text
// says it ("Permission denied") where that fits and the message does not
// say it already; then `hint`, if any.
int Fail(const Status& s, const std::string& hint = "") {
  std::string line = s.message();
  const std::string words = std::strerror(ErrnoFromStatus(s));
  if (HasErrnoWords(s.code()) && line.find(words) == std::string::npos) line += ": " + words;
  std::fprintf(stderr, "gpuckpt: %s\n", line.c_str());
  if (!hint.empty()) std::fprintf(stderr, "gpuckpt: %s\n", hint.c_str());
  return kExitFailure;
}

// Where a snapshot is, for a store with a shared pool: "local" (not
// published yet), "both", or "pool" (listed from the pool's catalog; its
// files are fetched when it is first read).
const char* PoolPlace(const SnapshotInfo& i) {
  if (i.pool_only) return "pool";
  return i.pool_incarnation != 0 ? "both" : "local";
}

json InfoToJson(const SnapshotInfo& i, bool with_pool) {
  json extra = json::parse(i.extra_json.empty() ? "{}" : i.extra_json, nullptr, false);
  json out{{"id", i.id},
           {"created", Rfc3339Utc(i.created_ns, /*with_nanoseconds=*/true)},
           {"source", i.source},
           {"files", i.file_count},
           {"logical_bytes", i.logical_bytes},
           {"chunks", i.chunk_count},
           {"new_chunks", i.new_chunks},
           {"new_bytes", i.new_bytes},
           {"stored_bytes", i.stored_bytes},
           {"duration_s", i.duration_s},
           {"commit_s", i.commit_s},
           {"sync_s", i.sync_s},
           {"extra", extra.is_discarded() ? json::object() : extra}};
  if (!i.base.empty()) {
    out["base"] = i.base;
    out["base_chunks"] = i.base_chunks;
  }
  if (!i.written_by.empty()) out["written_by"] = i.written_by;
  if (with_pool) out["where"] = PoolPlace(i);
  return out;
}

std::string FormatTime(int64_t ns) {
  const time_t secs = static_cast<time_t>(ns / 1000000000);
  tm t{};
  localtime_r(&secs, &t);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &t);
  return buf;
}

struct Globals {
  std::string store_dir = "/var/lib/gpuckpt";
  int zstd_level = StoreOptions{}.zstd_level;
  unsigned threads = 0;
  std::vector<uint32_t> generic_sizes;
  std::vector<uint32_t> page_sizes;
  bool page_aware = true;
  bool no_sync = false;
  PoolCommandLine pool;
  std::string mount;  // "": the mount serving store_dir (MountOf)
};

// How a command opens the store.
enum class Access {
  kCreate,    // import: makes the store where there is none
  kWrite,     // rm, gc: takes the store's lock (refused while gpuckptfs runs)
  kReadOnly,  // ls, stats, export, fsck, report: beside a running gpuckptfs too
};

Result<std::unique_ptr<Store>> OpenStore(const Globals& g, Access access) {
  StoreOptions o;
  o.create_if_missing = access == Access::kCreate;
  o.read_only = access == Access::kReadOnly;
  o.zstd_level = g.zstd_level;
  o.worker_threads = g.threads;
  if (g.generic_sizes.size() == 3) {
    o.chunking.generic = ChunkSizes{g.generic_sizes[0], g.generic_sizes[1], g.generic_sizes[2]};
  }
  if (g.page_sizes.size() == 3) {
    o.chunking.pages = ChunkSizes{g.page_sizes[0], g.page_sizes[1], g.page_sizes[2]};
  }
  if (!g.page_aware) o.chunking.page_image_globs.clear();
  o.sync_export = !g.no_sync;
  o.pool = PoolOptionsOf(g.pool);
  return Store::Open(g.store_dir, o);
}

// What the subcommands' arguments say.
struct CommandArgs {
  std::string src, name, base, id, dest;
  std::string html;  // report: the page's file
  bool as_json = false;
};

// The subcommands, to tell which one was given.
struct Commands {
  CLI::App* import;
  CLI::App* exp;
  CLI::App* ls;
  CLI::App* rm;
  CLI::App* gc;
  CLI::App* fsck;
  CLI::App* stats;
  CLI::App* report;
};

void DeclareGlobalOptions(CLI::App& app, Globals* g) {
  app.add_option("--store", g->store_dir, "Store directory")->capture_default_str();
  app.add_option("--zstd-level", g->zstd_level,
                 "zstd level for new chunks, -100 to 22 (negative: fast modes)")
      ->capture_default_str()
      ->check(CLI::Range(-100, 22));
  app.add_option("--threads", g->threads, "Worker threads (0: one per CPU)")->capture_default_str();
  app.add_option("--chunk-sizes", g->generic_sizes,
                 "MIN,AVG,MAX bytes of chunks of ordinary files (default 16K,64K,256K)")
      ->delimiter(',')
      ->expected(3);
  app.add_option("--page-chunk-sizes", g->page_sizes,
                 "MIN,AVG,MAX bytes of chunks of page images (default 4K,16K,64K)")
      ->delimiter(',')
      ->expected(3);
  app.add_option("--mount", g->mount,
                 "The gpuckptfs mount that an ordinary user's ls, stats and report read "
                 "(their own checkpoints; the store is root's). Default: the mount serving "
                 "--store")
      ->type_name("DIR");
  app.add_flag("!--no-page-aware", g->page_aware,
               "Chunk page images (pages-*.img) like ordinary files, not at page boundaries");
  DeclarePoolOptions(app,
                     "A Ceph RADOS pool the store shares with gpuckptfs daemons (as gpuckptfs "
                     "--pool): import publishes there too, ls lists the pool's snapshots as well "
                     "and says where each is, rm removes from it",
                     &g->pool);
}

Commands DeclareCommands(CLI::App& app, Globals* g, CommandArgs* args) {
  Commands c;
  c.import =
      app.add_subcommand("import", "Store a directory tree as a new snapshot; prints its id");
  c.import->add_option("SRC_DIR", args->src, "Directory to import")->required();
  c.import->add_option("--name", args->name, "Snapshot id (default: the next free number)");
  c.import->add_option("--base", args->base,
                       "A snapshot the tree probably resembles (an earlier import of it): chunks "
                       "found unchanged at the same place are not hashed again");

  c.exp = app.add_subcommand("export", "Write a snapshot into a new directory");
  c.exp->add_option("ID", args->id, "Snapshot id")->required();
  c.exp->add_option("DEST_DIR", args->dest, "Destination (must not exist, or be empty)")
      ->required();
  c.exp->add_flag("--no-sync", g->no_sync,
                  "Don't sync the destination before renaming it into place (faster; a power "
                  "loss soon after may leave files incomplete)");

  c.ls = app.add_subcommand("ls", "List snapshots");
  c.ls->add_flag("--json", args->as_json, "JSON output");

  c.rm = app.add_subcommand("rm", "Delete a snapshot (its chunks go at the next gc)");
  c.rm->add_option("ID", args->id, "Snapshot id")->required();

  c.gc = app.add_subcommand("gc", "Delete chunks no snapshot uses");
  c.fsck = app.add_subcommand("fsck", "Re-hash every chunk and check every snapshot's index");
  c.stats = app.add_subcommand("stats", "Sizes of the store");
  c.stats->add_flag("--json", args->as_json, "JSON output");
  c.report = app.add_subcommand(
      "report",
      "Draw the checkpoints (each process's over time) and the store's sizes as one HTML page "
      "that needs no network");
  c.report
      ->add_option("--html", args->html,
                   "Write the page to FILE, replaced whole (written beside it, then renamed); "
                   "a new FILE is private (0600)")
      ->type_name("FILE")
      ->required();
  return c;
}

int RunImport(Store& store, const CommandArgs& args) {
  ProgressBar bar("import");
  SnapshotSpec spec;
  spec.name = args.name;
  spec.base = args.base;
  // The store treats a vanished base as none; a base named by hand that
  // does not exist is a typo.
  if (!args.base.empty()) {
    if (auto b = store.Get(args.base); !b.ok()) return Fail(b.status());
  }
  auto info =
      store.ImportDirectory(args.src, spec, [&](uint64_t d, uint64_t t) { bar.Update(d, t); });
  if (!info.ok()) return Fail(info.status());
  std::printf("%s\n", info->id.c_str());
  std::string from_base;
  if (!info->base.empty()) {
    from_base = ", " + std::to_string(info->base_chunks) + " of " +
                std::to_string(info->chunk_count) + " chunks unchanged from " + info->base;
  }
  std::fprintf(stderr, "snapshot %s: %s logical, %s new, %s stored%s, %.2f s\n", info->id.c_str(),
               HumanBytes(info->logical_bytes).c_str(), HumanBytes(info->new_bytes).c_str(),
               HumanBytes(info->stored_bytes).c_str(), from_base.c_str(), info->duration_s);
  return 0;
}

int RunExport(Store& store, const CommandArgs& args) {
  ProgressBar bar("export");
  Status s = store.Export(args.id, args.dest, [&](uint64_t d, uint64_t t) { bar.Update(d, t); });
  if (!s.ok()) return Fail(s);
  return 0;
}

// The owner's name (or uid) of a listed checkpoint: its manifest's
// extra.owner, root's where it names none (a plain import).
std::string OwnerName(const json& entry) {
  uint32_t uid = 0;
  const json* extra = entry.contains("extra") ? &entry["extra"] : nullptr;
  if (extra != nullptr && extra->is_object() && extra->contains("owner") &&
      (*extra)["owner"].is_object() && (*extra)["owner"].value("uid", json()).is_number_unsigned())
    uid = (*extra)["owner"]["uid"].get<uint32_t>();
  return UserNameOrUid(uid);
}

// `ls`'s table, or its JSON, of `entries` (each as InfoToJson or a
// mount's manifest.json): with a WHERE column for a store with a pool, an
// OWNER column for root.
void PrintListing(const std::vector<json>& entries, bool with_pool, bool with_owner, bool as_json) {
  if (as_json) {
    std::cout << json(entries).dump(2) << "\n";
    return;
  }
  // Optional columns have a width of 0, which prints nothing.
  const int where_width = with_pool ? 7 : 0;
  const int owner_width = with_owner ? 10 : 0;
  std::printf("%-24s %-*s%-19s %10s %10s %10s  %-*s%s\n", "ID", owner_width,
              with_owner ? "OWNER" : "", "CREATED", "LOGICAL", "NEW", "STORED", where_width,
              with_pool ? "WHERE" : "", "SOURCE");
  for (const json& e : entries) {
    const auto created = ParseRfc3339Utc(e.value("created", std::string()));
    std::printf("%-24s %-*s%-19s %10s %10s %10s  %-*s%s\n", e.value("id", std::string()).c_str(),
                owner_width, with_owner ? (OwnerName(e) + " ").c_str() : "",
                created ? FormatTime(*created).c_str() : "?",
                HumanBytes(e.value("logical_bytes", uint64_t{0})).c_str(),
                HumanBytes(e.value("new_bytes", uint64_t{0})).c_str(),
                HumanBytes(e.value("stored_bytes", uint64_t{0})).c_str(), where_width,
                e.value("where", std::string()).c_str(), e.value("source", std::string()).c_str());
  }
}

int RunList(Store& store, const CommandArgs& args) {
  auto list = store.List();
  if (!list.ok()) return Fail(list.status());
  const bool with_pool = store.pool_stats().has_value();
  std::vector<json> entries;
  for (const auto& i : *list) entries.push_back(InfoToJson(i, with_pool));
  PrintListing(entries, with_pool, /*with_owner=*/true, args.as_json);
  return 0;
}

// An ordinary user's ls and stats: their own checkpoints, as `mount` shows
// them.
int RunListOfMount(const std::string& mount, const CommandArgs& args) {
  auto entries = CheckpointsInMount(mount);
  if (!entries.ok()) return Fail(entries.status());
  PrintListing(*entries, /*with_pool=*/false, /*with_owner=*/false, args.as_json);
  return 0;
}

int RunStatsOfMount(const std::string& mount, const CommandArgs& args) {
  auto entries = CheckpointsInMount(mount);
  if (!entries.ok()) return Fail(entries.status());
  uint64_t logical = 0, added = 0, stored = 0;
  for (const json& e : *entries) {
    logical += e.value("logical_bytes", uint64_t{0});
    added += e.value("new_bytes", uint64_t{0});
    stored += e.value("stored_bytes", uint64_t{0});
  }
  if (args.as_json) {
    std::cout << json{{"snapshot_count", entries->size()},
                      {"logical_bytes", logical},
                      {"new_bytes", added},
                      {"stored_bytes", stored}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("snapshots     %zu (yours, as %s shows them)\n", entries->size(), mount.c_str());
    std::printf("logical       %s\n", HumanBytes(logical).c_str());
    std::printf("new           %s (what they added to the store when made)\n",
                HumanBytes(added).c_str());
    std::printf("stored        %s (that, compressed)\n", HumanBytes(stored).c_str());
  }
  return 0;
}

int RunRemove(Store& store, const CommandArgs& args) {
  Status s = store.Remove(args.id);
  if (!s.ok()) return Fail(s);
  return 0;
}

int RunGc(Store& store) {
  auto r = store.Gc();
  if (!r.ok()) return Fail(r.status());
  std::printf("kept %llu chunks, deleted %llu chunks (%s), removed %llu unfinished snapshots\n",
              static_cast<unsigned long long>(r->chunks_kept),
              static_cast<unsigned long long>(r->chunks_deleted),
              HumanBytes(r->bytes_deleted).c_str(),
              static_cast<unsigned long long>(r->orphan_records_deleted));
  std::printf(
      "removed %llu pack files (%llu rewritten: %s of live chunks copied), "
      "%s punched out of the packs kept\n",
      static_cast<unsigned long long>(r->packs_removed),
      static_cast<unsigned long long>(r->packs_rewritten), HumanBytes(r->bytes_rewritten).c_str(),
      HumanBytes(r->bytes_punched).c_str());
  if (store.pool_stats()) {
    if (!r->pool_collected) {
      std::printf("pool: another store's collector is running; nothing collected there\n");
    } else {
      std::printf("pool: marked %llu chunks no checkpoint names",
                  static_cast<unsigned long long>(r->pool_marked_chunks));
      if (r->pool_swept) {
        std::printf("; swept %llu chunks and %llu objects (%s)\n",
                    static_cast<unsigned long long>(r->pool_swept_chunks),
                    static_cast<unsigned long long>(r->pool_swept_objects),
                    HumanBytes(r->pool_swept_bytes).c_str());
      } else {
        std::printf("; the next sweep is due in %llu s\n",
                    static_cast<unsigned long long>(r->pool_sweep_due_in_s));
      }
    }
  }
  return 0;
}

int RunFsck(Store& store) {
  auto r = store.Fsck();
  if (!r.ok()) return Fail(r.status());
  for (const auto& p : r->problems) std::printf("%s\n", p.c_str());
  std::string verdict = "clean";
  if (!r->clean()) {
    verdict = std::to_string(r->problems.size()) + " problems (" +
              std::to_string(r->damaged_chunks) + " damaged chunks, " +
              std::to_string(r->damaged_files) + " files that cannot be read back whole)";
  }
  // Spooled files are not chunked yet: only their size could be checked.
  const std::string spooled = r->spooled_files == 0 ? ""
                                                    : ", " + std::to_string(r->spooled_files) +
                                                          " spooled files (size checked only)";
  std::fprintf(stderr, "checked %llu chunks, %llu snapshots, %llu extents%s: %s\n",
               static_cast<unsigned long long>(r->chunks_checked),
               static_cast<unsigned long long>(r->snapshots_checked),
               static_cast<unsigned long long>(r->extents_checked), spooled.c_str(),
               verdict.c_str());
  return r->clean() ? 0 : kExitFsckProblems;
}

// fsck on a store that did not open because it is damaged (a table of its
// index fails its checksums): a problem found, not a failure to look, so
// it is reported as fsck reports problems.
int ReportUnopenableStore(const Status& damage) {
  std::printf("%s\n", damage.message().c_str());
  std::fprintf(stderr, "the store is damaged and was not checked further: 1 problem\n");
  return kExitFsckProblems;
}

int RunStats(Store& store, const CommandArgs& args) {
  auto r = store.Stats();
  if (!r.ok()) return Fail(r.status());
  if (args.as_json) {
    json out = {{"snapshot_count", r->snapshot_count}, {"logical_bytes", r->logical_bytes},
                {"chunk_count", r->chunk_count},       {"unique_bytes", r->unique_bytes},
                {"stored_bytes", r->stored_bytes},     {"disk_bytes", r->disk_bytes},
                {"reserve_bytes", r->reserve_bytes},   {"spooled_bytes", r->spooled_bytes}};
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("snapshots     %llu\n", static_cast<unsigned long long>(r->snapshot_count));
    std::printf("logical       %s\n", HumanBytes(r->logical_bytes).c_str());
    std::printf("chunks        %llu\n", static_cast<unsigned long long>(r->chunk_count));
    std::printf("unique        %s\n", HumanBytes(r->unique_bytes).c_str());
    std::printf("stored        %s\n", HumanBytes(r->stored_bytes).c_str());
    std::printf("on disk       %s\n", HumanBytes(r->disk_bytes).c_str());
    // Counted in "on disk": what an empty store takes is mostly this.
    std::printf("reserve       %s (of on disk: kept free so that rm and gc work on a full disk)\n",
                HumanBytes(r->reserve_bytes).c_str());
    if (r->spooled_bytes != 0) {
      // Durable raw, not yet chunked: counted in "on disk" only.
      std::printf("spooled       %s (not yet deduplicated and compressed)\n",
                  HumanBytes(r->spooled_bytes).c_str());
    }
  }
  return 0;
}

// The report of the whole store, as root reads it.
int RunReport(Store& store, const CommandArgs& args) {
  auto list = store.List();
  if (!list.ok()) return Fail(list.status());
  auto data = GatherReport(store, *list, ReportScope{}, UnixNowNs());
  if (!data.ok()) return Fail(data.status());
  if (Status s = WriteReportFile(args.html, RenderReportHtml(*data)); !s.ok()) return Fail(s);
  return 0;
}

// An ordinary user's report: the mount's report.html, which shows them
// their own checkpoints, as it is.
int RunReportOfMount(const std::string& mount, const CommandArgs& args) {
  auto page = ReadMountReport(mount);
  if (!page.ok()) return Fail(page.status());
  if (Status s = WriteReportFile(args.html, *page); !s.ok()) return Fail(s);
  return 0;
}

int RunCommand(const Commands& c, Store& store, const CommandArgs& args) {
  if (c.import->parsed()) return RunImport(store, args);
  if (c.exp->parsed()) return RunExport(store, args);
  if (c.ls->parsed()) return RunList(store, args);
  if (c.rm->parsed()) return RunRemove(store, args);
  if (c.gc->parsed()) return RunGc(store);
  if (c.fsck->parsed()) return RunFsck(store);
  if (c.stats->parsed()) return RunStats(store, args);
  if (c.report->parsed()) return RunReport(store, args);
  return 2;
}

// The mount point of the gpuckptfs serving `store_dir` (its mount's
// source); nullopt where none does.
std::optional<std::string> MountOf(const std::string& store_dir) {
  char resolved[PATH_MAX];
  const std::string store = realpath(store_dir.c_str(), resolved) != nullptr ? resolved : store_dir;
  if (auto mounts = ReadMountTable(); mounts.ok())
    for (const MountEntry& m : *mounts)
      if (m.type == kGpuckptMountType && m.source == store) return m.mountpoint;
  return std::nullopt;
}

// MountOf, or what to look for, to be shown in a hint.
std::string MountOrPlaceholder(const std::string& store_dir) {
  return MountOf(store_dir).value_or("MOUNTPOINT");
}

// How to do `command` through the mount of the gpuckptfs that holds the
// store; "" for a command that has no such way, or where no gpuckptfs
// mount serves the store (another gpuckpt holds it).
std::string ThroughTheMount(const Commands& c, const Globals& g, const CommandArgs& args) {
  const std::optional<std::string> served_at = MountOf(g.store_dir);
  if (!served_at) return "";
  const std::string& mount = *served_at;
  if (c.rm->parsed())
    return "remove it through the mount: rm -r " + mount + "/checkpoints/" + args.id;
  if (c.gc->parsed()) return "collect through the mount: echo gc > " + mount + "/ctl";
  if (c.import->parsed())
    return "import through the mount: echo 'import " + args.src + "' > " + mount + "/ctl";
  return "";
}

int Main(int argc, char** argv) {
  // What the store logs (its shared pool's pushes, fetches and drops) is
  // the daemon's business; here stdout carries the command's output (ls
  // --json is parsed), so only warnings and errors, on stderr.
  auto log = spdlog::stderr_color_mt("gpuckpt");
  log->set_level(spdlog::level::warn);
  spdlog::set_default_logger(std::move(log));
  CLI::App app{"gpuckpt: the deduplicated checkpoint store of gpuckptfs"};
  app.formatter(PlainHelpFormatter());
  app.set_version_flag("--version", "gpuckpt " GPUCKPT_VERSION_STRING);
  app.require_subcommand(1);
  Globals g;
  CommandArgs args;
  DeclareGlobalOptions(app, &g);
  const Commands commands = DeclareCommands(app, &g, &args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here with 0; bad usage with 2 (CLI11's own
    // codes are not documented for users).
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  // A path that cannot be written is refused before the store is read
  // (whose index is checked whole first: seconds on a large store).
  if (commands.report->parsed()) {
    if (Status s = CheckReportPath(args.html); !s.ok()) return Fail(s);
  }
  // The store is root's: an ordinary user lists their own checkpoints
  // through the mount, as it shows them to them.
  if (geteuid() != 0 &&
      (commands.ls->parsed() || commands.stats->parsed() || commands.report->parsed())) {
    std::optional<std::string> mount = g.mount;
    if (g.mount.empty()) mount = MountOf(g.store_dir);
    if (!mount)
      return Fail(Status::NotFound("no gpuckptfs mount serves the store " + g.store_dir),
                  "your checkpoints are listed through the mount: name it with --mount DIR");
    if (commands.ls->parsed()) return RunListOfMount(*mount, args);
    if (commands.report->parsed()) return RunReportOfMount(*mount, args);
    return RunStatsOfMount(*mount, args);
  }
  // Only import creates a store; everything else on a missing store is an
  // error, not a new empty store. What only reads works while gpuckptfs
  // holds the store.
  const Access access = commands.import->parsed()                        ? Access::kCreate
                        : commands.rm->parsed() || commands.gc->parsed() ? Access::kWrite
                                                                         : Access::kReadOnly;
  auto store_or = OpenStore(g, access);
  // With a pool, export may have to fetch the snapshot into the store
  // first, which needs it writable: it is, unless a gpuckptfs holds it.
  if (commands.exp->parsed() && !g.pool.pool.pool.empty()) {
    auto writable = OpenStore(g, Access::kWrite);
    if (writable.ok() || writable.status().code() != StatusCode::kBusy)
      store_or = std::move(writable);
  }
  if (!store_or.ok()) {
    const Status& why = store_or.status();
    if (commands.fsck->parsed() && why.code() == StatusCode::kCorruption) {
      return ReportUnopenableStore(why);
    }
    // Held by a gpuckptfs: the same is done through its mount.
    if (why.code() == StatusCode::kBusy) return Fail(why, ThroughTheMount(commands, g, args));
    if (why.code() == StatusCode::kPermissionDenied && geteuid() != 0)
      return Fail(why, "the store is root's; your own checkpoints are in the mount: ls " +
                           MountOrPlaceholder(g.store_dir) + "/checkpoints");
    return Fail(why);
  }
  return RunCommand(commands, **store_or, args);
}

}  // namespace
}  // namespace gpuckpt

int main(int argc, char** argv) {
  try {
    return gpuckpt::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuckpt: internal error: %s\n", e.what());
    return 1;
  }
}
