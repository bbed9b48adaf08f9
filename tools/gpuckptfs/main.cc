// gpuckptfs: mounts the gpuckpt filesystem.
//
//   gpuckptfs [--store DIR] [--all-processes] [--lock-timeout MS] [--foreground] [MOUNTPOINT]
//   gpuckptfs STORE MOUNTPOINT -o OPTIONS      (as mount(8) runs it through mount.fuse3)
//
// Without --foreground it returns once the filesystem is mounted (exit 0),
// or with exit 1 and one line on stderr when it could not be (store in use,
// no such mount point, something already mounted there, ...); the daemon
// then runs in the background until `fusermount3 -u MOUNTPOINT`, SIGTERM or
// SIGINT. Under systemd (Type=notify) it says READY=1 once mounted and
// STOPPING=1 once unmounted.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/base/log.h"
#include "core/criu/criu_runner.h"
#include "core/engine/engine.h"
#include "core/gpu/system_gpu_backend.h"
#include "fs/duration_option.h"
#include "fs/filesystem.h"
#include "gpuckpt/gpu_backend.h"
#include "gpuckpt/store.h"
#include "gpuckpt/version.h"
#include "tools/common/help_format.h"
#include "tools/common/pool_options.h"

namespace gpuckpt {
namespace {

Status CheckMountpoint(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return StatusFromErrno(errno, "mount point " + path);
  if (!S_ISDIR(st.st_mode))
    return Status::InvalidArgument("mount point " + path + " is not a directory");
  return Status::Ok();
}

struct GpuSettings {
  bool off = false;
  std::string criu_plugin_dir;      // "": next to the criu binary
  std::string cuda_checkpoint_dir;  // "": next to this binary
};

// `path` made absolute against the current directory ("" stays "").
std::string Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool IsFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// gpuckpt's cuda-checkpoint: installed in <prefix>/libexec/gpuckpt beside
// <prefix>/bin/gpuckptfs, or in <build>/libexec/gpuckpt of a build tree.
std::string FindCudaCheckpointDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  exe[n] = '\0';
  const std::string dir = DirOf(exe);
  for (const std::string& candidate :
       {dir + "/../libexec/gpuckpt", dir + "/../../libexec/gpuckpt", dir}) {
    if (IsFile(candidate + "/cuda-checkpoint")) {
      char* real = realpath(candidate.c_str(), nullptr);
      std::string out = real ? real : candidate;
      free(real);
      return out;
    }
  }
  return "";
}

// CRIU's plugins: <prefix>/lib/criu beside the criu the engine runs (the
// same lookup: --criu, else /usr/local/sbin/criu, else PATH); "" without
// one, and the engine then says that CRIU is missing.
std::string FindCriuPluginDir(const std::string& criu_path) {
  Result<Criu> criu = Criu::Find(criu_path);
  return criu.ok() ? criu->plugin_dir() : "";
}

// Generic mount options that mount(8), mount.fuse3 and systemd pass to
// every filesystem, with nothing for gpuckptfs to do: the mount is always
// read-write, nosuid and nodev (libfuse mounts it so), and nothing in it is
// executable, so suid, dev, exec and noexec change nothing.
bool IsIgnoredMountOption(const std::string& name) {
  static const char* const kIgnored[] = {
      "rw",       "defaults",   "auto",       "noauto",      "user",
      "nouser",   "users",      "owner",      "group",       "nofail",
      "_netdev",  "suid",       "nosuid",     "dev",         "nodev",
      "exec",     "noexec",     "async",      "sync",        "atime",
      "noatime",  "relatime",   "norelatime", "strictatime", "nostrictatime",
      "lazytime", "nolazytime", "diratime",   "nodiratime",  "loud",
      "silent",   "comment"};
  for (const char* ignored : kIgnored)
    if (name == ignored) return true;
  // x-systemd.automount, x-mount.mkdir, ...: for mount(8) and systemd.
  return name.compare(0, 2, "x-") == 0;
}

// mount(8) runs `mount.fuse3 STORE MOUNTPOINT -o OPTIONS`, which runs
// `gpuckptfs STORE MOUNTPOINT -o OPTIONS`: whether `args` (without the
// program name) has that form, i.e. an -o.
bool IsMountForm(const std::vector<std::string>& args) {
  for (const std::string& arg : args)
    if (arg.compare(0, 2, "-o") == 0) return true;
  return false;
}

// The mount form rewritten as the command line form: STORE becomes
// --store STORE, each option NAME=VALUE --NAME=VALUE and NAME --NAME, with
// '_' in NAME read as '-' (lock_timeout=500 is --lock-timeout=500), and the
// generic mount options left out. An option that is none of `app`'s, `ro`,
// or a form without exactly STORE and MOUNTPOINT is an error, in words.
Result<std::vector<std::string>> FromMountForm(CLI::App& app,
                                               const std::vector<std::string>& args) {
  std::vector<std::string> out, positional;
  std::vector<std::string> option_lists;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-o") {
      if (i + 1 == args.size()) return Status::InvalidArgument("-o needs a list of options");
      option_lists.push_back(args[++i]);
    } else if (args[i].compare(0, 2, "-o") == 0) {
      option_lists.push_back(args[i].substr(2));
    } else if (!args[i].empty() && args[i][0] == '-') {
      out.push_back(args[i]);  // -f, -d, --help: as in the command line form
    } else {
      positional.push_back(args[i]);
    }
  }
  if (positional.size() != 2)
    return Status::InvalidArgument(
        "with -o, give the store and the mount point: "
        "gpuckptfs STORE MOUNTPOINT -o OPTIONS");
  // The mount point first: an option missing its value must not take it.
  out.push_back("--store=" + positional[0]);
  out.push_back(positional[1]);
  for (const std::string& list : option_lists) {
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      const std::string option = list.substr(start, end - start);
      start = end + 1;
      if (option.empty()) continue;
      const size_t eq = option.find('=');
      std::string name = option.substr(0, eq);
      if (name == "ro")
        return Status::InvalidArgument(
            "the mount cannot be read-only (option ro): its control files take commands");
      if (IsIgnoredMountOption(name)) continue;
      for (char& c : name)
        if (c == '_') c = '-';
      const CLI::Option* known = app.get_option_no_throw("--" + name);
      if (known == nullptr || name == "store" || name == "help" || name == "version")
        return Status::InvalidArgument("unknown mount option " + option.substr(0, eq) +
                                       " (see gpuckptfs --help: its --long-options, with _ "
                                       "for -, as NAME or NAME=VALUE)");
      out.push_back("--" + name + (eq == std::string::npos ? "" : option.substr(eq)));
    }
  }
  return out;
}

// Opens the store and serves; `ready` gets "" once mounted, or the error.
int Serve(const std::string& store_dir, const StoreOptions& options, EngineOptions engine_options,
          const MountOptions& mount, const GpuSettings& gpu_settings,
          const std::function<void(const std::string&)>& ready) {
  // A CRIU that closes an image pipe early must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);
  auto store = Store::Open(store_dir, options);
  if (!store.ok()) {
    ready(store.status().ToString());
    return 1;
  }
  engine_options.mountpoint = mount.mountpoint;
  engine_options.mount_serves_images = true;
  // The GPU drivers are loaded here, in the daemon, after the fork.
  std::unique_ptr<GpuBackend> gpu;
  if (gpu_settings.off) {
    gpu = MakeNoGpuBackend();
  } else {
    SystemGpuBackendOptions gpu_options;
    gpu_options.criu_plugin_dir = gpu_settings.criu_plugin_dir.empty()
                                      ? FindCriuPluginDir(engine_options.criu_path)
                                      : gpu_settings.criu_plugin_dir;
    gpu_options.cuda_checkpoint_dir = gpu_settings.cuda_checkpoint_dir.empty()
                                          ? FindCudaCheckpointDir()
                                          : gpu_settings.cuda_checkpoint_dir;
    gpu_options.work_dir = engine_options.work_dir;
    gpu = MakeSystemGpuBackend(gpu_options);
  }
  auto engine = Engine::Create(store->get(), std::move(gpu), engine_options);
  if (!engine.ok()) {
    ready(engine.status().ToString());
    return 1;
  }
  bool reported = false;
  Status s = ServeFilesystem(store->get(), engine->get(), mount, [&] {
    reported = true;
    ready("");
  });
  if (!s.ok()) {
    if (!reported)
      ready(s.ToString());
    else
      spdlog::error("serving the mount failed: {}", LogValue(s.ToString()));
    return 1;
  }
  return 0;
}

// What the command line says.
struct Settings {
  std::string store_dir = "/var/lib/gpuckpt";
  PoolCommandLine pool;
  MountOptions mount;
  EngineOptions engine_options;
  GpuSettings gpu;
  bool foreground = false;
  bool direct_reads = false;
  std::string log_level = "info";
};

// The options are declared in the order --help lists them, in three parts.
void DeclareDaemonOptions(CLI::App& app, Settings* settings) {
  EngineOptions& engine_options = settings->engine_options;
  app.add_option("--store", settings->store_dir, "Store directory (created if missing)")
      ->capture_default_str();
  app.add_flag("--all-processes", engine_options.all_processes,
               "Show every process you may checkpoint, not only GPU processes");
  app.add_option("--criu", engine_options.criu_path,
                 "The criu binary (default: /usr/local/sbin/criu, else PATH)");
  app.add_option("--work-dir", engine_options.work_dir,
                 "Private directory for CRIU's sockets and logs")
      ->capture_default_str();
  app.add_flag("--lazy-restore", engine_options.lazy_restore,
               "Restore lazily where a restore does not say (--lazy, --eager): the tree runs at "
               "once, and its memory follows from the store");
  app.add_option("--lazy-read-ahead-threads", settings->mount.lazy_read_ahead_threads,
                 "Threads that read ahead of a lazy restore's server (default: half the CPUs, 4 "
                 "to 8, along the strides its tree faults at, and on 4 CPUs or more also ahead "
                 "of its background pass; a count reads ahead of both on any machine; 0: none)")
      ->check(CLI::Range(0, 64));
  app.add_option("--lazy-copy-batch-mib", engine_options.lazy_copy_batch_mib,
                 "How much of a lazy restore's background pass its server asks the daemon to "
                 "copy in at once, read and copied side by side, once the tree has gone 100 ms "
                 "without a page fault (less before; 0: one range at a time; default: 32 on "
                 "machines of 4 CPUs or more, else 0)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_flag("--direct-reads", settings->direct_reads,
               "Read the store's records past the page cache (direct I/O) where they are not in "
               "it: restores take less CPU and memory, but wait for the disk without the "
               "kernel's read-ahead (faster on a busy machine with a fast disk, slower on a "
               "disk slow to answer)");
  app.add_flag("--keep-logs", engine_options.keep_logs,
               "Keep every operation's work dir (CRIU's log and files) in the work dir, the "
               "newest 16");
  app.add_option("--state-dir", engine_options.state_dir,
                 "Private directory (0700, made if missing) for what outlives the daemon: the "
                 "CRIU logs of failed operations (criu-logs/, the newest 32 per store), and the "
                 "log (gpuckptfs.log) when the daemon runs in the background outside systemd")
      ->capture_default_str();
  app.add_option("--log-level", settings->log_level,
                 "The least severe lines logged: debug, info (every operation), warning "
                 "(refusals and recoveries), error. The log goes to the systemd journal under "
                 "systemd, else to stderr with --foreground, else to STATE_DIR/gpuckptfs.log")
      ->check([](const std::string& name) {
        auto level = ParseLogLevel(name);
        return level.ok() ? std::string() : level.status().message();
      })
      ->capture_default_str();
}

void DeclareCheckpointOptions(CLI::App& app, EngineOptions* engine_options) {
  app.add_option("--lock-timeout", engine_options->lock_timeout_ms,
                 "Milliseconds the GPU driver may take to lock a process for a checkpoint "
                 "(checkpoint --lock-timeout overrides it)")
      ->check(CLI::Range(1u, 3600u * 1000u))
      ->capture_default_str();
  const std::string default_staging =
      std::to_string(DefaultStagingMemory() >> 20) + " MiB: a quarter of this machine's memory";
  app.add_option("--staging-memory", engine_options->staging_memory_bytes,
                 "Memory that checkpoints in flight may hold for CRIU's images before they are "
                 "stored, so that CRIU and the frozen process never wait on hashing, "
                 "compression or the disk while there is room (e.g. 8G, 512M; units of 1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Validator(
          [](const std::string& bytes) -> std::string {
            return std::stoull(bytes) >= (16u << 20) ? "" : "at least 16M";
          },
          ""))
      ->type_name("SIZE")
      ->default_str(default_staging);
  app.add_flag("--shared-dedup", engine_options->shared_dedup,
               "Deduplicate chunks across all owners, not only among each owner's checkpoints: "
               "less space where users run the same code and data, but what a checkpoint "
               "reports as new then tells its user whether others' checkpoints hold the same "
               "bytes");
  const std::map<std::string, EngineOptions::Spool> spool_modes{
      {"auto", EngineOptions::Spool::kAuto},
      {"always", EngineOptions::Spool::kAlways},
      {"never", EngineOptions::Spool::kNever}};
  app.add_option("--spool", engine_options->spool,
                 "Make a checkpoint's images durable raw as CRIU writes them, and deduplicate "
                 "and compress them afterwards on idle CPU: always, never, or auto (when this "
                 "machine has fewer than " +
                     std::to_string(EngineOptions::kSpoolBelowCpus) +
                     " CPUs, where hashing cannot keep pace with a disk). Ignored with --pool")
      ->transform(CLI::CheckedTransformer(spool_modes, CLI::ignore_case))
      ->default_str("auto");
  app.add_option("--keep-last", engine_options->retention.keep_last,
                 "After each checkpoint of a process, keep only the newest N of its "
                 "checkpoints (and those --keep-within keeps); checkpoints given a --name are "
                 "always kept. A checkpoint's own --keep-last/--keep-within override both. "
                 "Default: all")
      ->check(CLI::Range(1u, 1000000u))
      ->type_name("N");
  app.add_option_function<uint64_t>(
         "--keep-within",
         [engine_options](uint64_t seconds) {
           engine_options->retention.keep_within = std::chrono::seconds(seconds);
         },
         "After each checkpoint of a process, keep only its checkpoints made within DURATION "
         "(30s, 15m, 2h, 1d; and those --keep-last keeps). Default: all")
      ->transform(DurationUnits())
      ->check(CLI::Range(uint64_t{1}, uint64_t{100} * 366 * 86400))
      ->type_name("DURATION");
  app.add_option("--owner-keep-last", engine_options->owner_retention.keep_last,
                 "After each checkpoint, keep only the newest N of all its owner's checkpoints, "
                 "of every process (and those --owner-keep-within keeps); the one just made and "
                 "those given a --name are always kept. A checkpoint's own --owner-keep-last/"
                 "--owner-keep-within override both. Default: all")
      ->check(CLI::Range(1u, 1000000u))
      ->type_name("N");
  app.add_option_function<uint64_t>(
         "--owner-keep-within",
         [engine_options](uint64_t seconds) {
           engine_options->owner_retention.keep_within = std::chrono::seconds(seconds);
         },
         "After each checkpoint, keep only those of all its owner's checkpoints made within "
         "DURATION (and those --owner-keep-last keeps). Default: all")
      ->transform(DurationUnits())
      ->check(CLI::Range(uint64_t{1}, uint64_t{100} * 366 * 86400))
      ->type_name("DURATION");
  app.add_option("--quota", engine_options->user_quota_bytes,
                 "The most of the store each user's checkpoints may hold (e.g. 100G; units of "
                 "1024), each chunk counted once; a checkpoint or import that could go beyond it, "
                 "with the user's others in flight, is refused (ENOSPC). Root's requests are "
                 "not limited. Default: none")
      ->transform(CLI::AsSizeValue(false))
      ->type_name("SIZE");
}

void DeclareDaemonPoolOptions(CLI::App& app, Settings* settings) {
  DeclarePoolOptions(app,
                     "A Ceph RADOS pool shared with the gpuckptfs of other machines: every "
                     "checkpoint is published there too, the pool's checkpoints are listed here "
                     "and restored from it (fetching only the chunks this store lacks); the store "
                     "is then this machine's index and cache of the pool",
                     &settings->pool);
  app.add_flag("--pool-background", settings->pool.pool.background,
               "A checkpoint returns once it is durable in this store, and is published in "
               "the pool in the background, in order, retried while the pool is away (its "
               "state in status and metrics). Default: a checkpoint returns once it is "
               "durable in the pool, and fails when the pool cannot be reached");
}

void DeclareGpuAndMountOptions(CLI::App& app, Settings* settings) {
  app.add_option("--criu-plugin-dir", settings->gpu.criu_plugin_dir,
                 "Where CRIU's cuda_plugin.so and amdgpu_plugin.so are (default: lib/criu "
                 "beside the criu binary's sbin/)");
  app.add_option("--cuda-checkpoint-dir", settings->gpu.cuda_checkpoint_dir,
                 "The directory of gpuckpt's cuda-checkpoint (default: libexec/gpuckpt beside "
                 "this binary)");
  app.add_flag("--no-gpu", settings->gpu.off,
               "Do not load any GPU driver; GPU processes cannot be checkpointed");
  app.add_flag("-f,--foreground", settings->foreground, "Stay in the foreground");
  app.add_flag("-d,--debug", settings->mount.debug,
               "Log every FUSE request (implies --foreground)");
  app.add_option("MOUNTPOINT", settings->mount.mountpoint, "Where to mount")->capture_default_str();
  app.footer(
      "As mount(8) runs it (mount -t fuse.gpuckptfs, fstab, systemd .mount units):\n"
      "  gpuckptfs STORE MOUNTPOINT -o OPTIONS\n"
      "OPTIONS are the long options above with _ for -, as NAME or NAME=VALUE (e.g.\n"
      "all_processes,lock_timeout=20000,quota=100G); rw, nosuid, nodev, noauto, _netdev,\n"
      "x-systemd.* and the other generic mount options are accepted and change nothing.");
}

// Parses either form of the command line into what `app` declared; the
// exit status when the program ends here (--help, --version, bad usage).
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool mount_form = IsMountForm(args);
  if (mount_form) {
    auto rewritten = FromMountForm(app, args);
    if (!rewritten.ok()) {
      std::fprintf(stderr, "gpuckptfs: %s\n", rewritten.status().message().c_str());
      return 2;
    }
    args = std::move(*rewritten);
  }
  try {
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // mount(8) shows what its helper says: one line.
    if (mount_form && e.get_exit_code() != 0) {
      std::fprintf(stderr, "gpuckptfs: %s\n", e.what());
      return 2;
    }
    // --help and --version end here with 0; bad usage with 2 (CLI11's own
    // codes are not documented for users).
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return std::nullopt;
}

// The daemon leaves this directory: paths given relative to it are made
// absolute now (the mount point is resolved by ResolveMountpoint).
void MakePathsAbsolute(Settings* settings) {
  EngineOptions& engine_options = settings->engine_options;
  for (std::string* path :
       {&settings->store_dir, &settings->pool.pool.ceph_conf, &engine_options.criu_path,
        &engine_options.work_dir, &engine_options.state_dir, &settings->gpu.criu_plugin_dir,
        &settings->gpu.cuda_checkpoint_dir}) {
    *path = Absolute(*path);
  }
  // findmnt and /proc/self/mountinfo show the store as the mount's source.
  settings->mount.source = settings->store_dir;
}

// The log is set up before the fork (it holds no threads), so that the
// daemon's first lines, and a journal recovery's, are kept.
Status StartLogging(const Settings& settings) {
  const std::string& state_dir = settings.engine_options.state_dir;
  LogOptions log;
  log.sink = ChooseLogSink(settings.foreground);
  log.file = state_dir + "/gpuckptfs.log";
  log.level = ParseLogLevel(settings.log_level).value();
  Status s = log.sink == LogSink::kFile ? PrepareStateDir(state_dir) : Status::Ok();
  if (s.ok()) s = SetUpLogging(log);
  if (!s.ok()) return s;
  spdlog::info("gpuckptfs {} starting: store={} mountpoint={} state_dir={}", GPUCKPT_VERSION,
               LogValue(settings.store_dir), LogValue(settings.mount.mountpoint),
               LogValue(state_dir));
  return Status::Ok();
}

Status ResolveMountpoint(MountOptions* mount) {
  GPUCKPT_RETURN_IF_ERROR(CheckMountpoint(mount->mountpoint));
  // Restore recognises paths inside the mount by this prefix.
  if (char* real = realpath(mount->mountpoint.c_str(), nullptr)) {
    mount->mountpoint = real;
    free(real);
  }
  // A mount over a mount (a running gpuckptfs, say) would hide it: refused
  // here, before the store is opened or anything resumed from its journal
  // (ServeFilesystem checks again, just before mounting).
  return CheckNothingMountedAt(mount->mountpoint);
}

// The store's options, from the command line.
StoreOptions StoreOptionsOf(const Settings& settings) {
  StoreOptions options;
  options.pool = PoolOptionsOf(settings.pool);
  options.direct_reads = settings.direct_reads;
  return options;
}

int ServeInForeground(const Settings& settings) {
  const int rc = Serve(settings.store_dir, StoreOptionsOf(settings), settings.engine_options,
                       settings.mount, settings.gpu, [](const std::string& error) {
                         if (!error.empty()) {
                           std::fprintf(stderr, "gpuckptfs: %s\n", error.c_str());
                           return;
                         }
                         // systemd's Type=notify: the mount is up. Nothing
                         // happens where NOTIFY_SOCKET is not set (not
                         // started by systemd).
                         sd_notify(0, "READY=1");
                       });
  sd_notify(0, "STOPPING=1");
  return rc;
}

// The parent's side of ServeInBackground: waits for the daemon `pid` to
// report the mount up ("ok") or why it failed on `report_fd`.
int WaitForDaemon(pid_t pid, int report_fd) {
  std::string message;
  char buf[512];
  ssize_t n;
  while ((n = read(report_fd, buf, sizeof(buf))) > 0) message.append(buf, static_cast<size_t>(n));
  if (message == "ok") return 0;
  if (message.empty()) message = "the daemon exited before mounting";
  std::fprintf(stderr, "gpuckptfs: %s\n", message.c_str());
  int status = 0;
  waitpid(pid, &status, 0);
  return 1;
}

// Forks before opening the store (RocksDB's threads don't survive fork),
// and keeps the parent until the child reports the mount up or failed.
int ServeInBackground(const Settings& settings) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    std::perror("gpuckptfs: pipe");
    return 1;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("gpuckptfs: fork");
    return 1;
  }
  if (pid > 0) {
    close(pipe_fds[1]);
    return WaitForDaemon(pid, pipe_fds[0]);
  }
  close(pipe_fds[0]);
  setsid();
  if (chdir("/") != 0) _exit(1);
  const int report_fd = pipe_fds[1];
  return Serve(settings.store_dir, StoreOptionsOf(settings), settings.engine_options,
               settings.mount, settings.gpu, [report_fd](const std::string& error) {
                 const std::string message = error.empty() ? "ok" : error;
                 if (write(report_fd, message.data(), message.size()) < 0) {
                   // The parent is gone; nothing to tell.
                 }
                 close(report_fd);
                 if (error.empty()) {
                   // Detach from the terminal only once nothing more needs saying.
                   const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
                   if (null_fd >= 0) {
                     dup2(null_fd, STDIN_FILENO);
                     dup2(null_fd, STDOUT_FILENO);
                     dup2(null_fd, STDERR_FILENO);
                     close(null_fd);
                   }
                 }
               });
}

int Fail(const Status& s) {
  std::fprintf(stderr, "gpuckptfs: %s\n", s.ToString().c_str());
  return 1;
}

int Main(int argc, char** argv) {
  CLI::App app{"gpuckptfs: checkpoints of processes as files"};
  app.formatter(PlainHelpFormatter());
  app.set_version_flag("--version", "gpuckptfs " GPUCKPT_VERSION_STRING);
  Settings settings;
  DeclareDaemonOptions(app, &settings);
  DeclareCheckpointOptions(app, &settings.engine_options);
  DeclareDaemonPoolOptions(app, &settings);
  DeclareGpuAndMountOptions(app, &settings);
  if (const std::optional<int> rc = ParseCommandLine(app, argc, argv)) return *rc;
  if (settings.mount.debug) settings.foreground = true;
  MakePathsAbsolute(&settings);
  if (Status s = StartLogging(settings); !s.ok()) return Fail(s);
  if (Status s = ResolveMountpoint(&settings.mount); !s.ok()) return Fail(s);
  return settings.foreground ? ServeInForeground(settings) : ServeInBackground(settings);
}

}  // namespace
}  // namespace gpuckpt

int main(int argc, char** argv) {
  try {
    return gpuckpt::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuckptfs: internal error: %s\n", e.what());
    return 1;
  }
}
