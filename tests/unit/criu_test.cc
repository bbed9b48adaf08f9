// The CRIU module with the real CRIU: finding it, a streamed dump and
// restore of a live process whose memory must survive, stop_fd, and a
// restore as an unprivileged user. Skips (saying why) without CRIU or root.
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "core/criu/breakpoint_probe.h"
#include "core/criu/criu_runner.h"
#include "core/criu/image_streamer.h"
#include "core/criu/images.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::ReadFile;
using ::gpuckpt::testing::TempDir;

constexpr const char* kWorkload = GPUCKPT_CRIU_WORKLOAD_PATH;
constexpr const char* kTestUser = "gpuckpt-test";

// Whether this process has `cap` in its effective set.
bool HasCapability(int cap) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> cap) & 1;
  }
  return false;
}

// Whether the bounding set in `creds` holds every capability this kernel has.
bool FullBoundingSet(const CriuCreds& creds) {
  for (int cap = 0; cap <= CAP_LAST_CAP; ++cap) {
    const size_t word = static_cast<size_t>(cap / 32);
    if (word >= creds.cap_bnd.size() || !((creds.cap_bnd[word] >> (cap % 32)) & 1)) return false;
  }
  return true;
}

bool ProcessExists(pid_t pid) {
  return access(("/proc/" + std::to_string(pid)).c_str(), F_OK) == 0;
}

// Reads `path` until it holds `want` (or FAIL), for up to 20 s.
std::string WaitForStatus(const std::string& path, const std::string& want) {
  std::string text;
  for (int i = 0; i < 2000; ++i) {
    std::ifstream in(path);
    std::getline(in, text);
    if (text == want || text == "FAIL") return text;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return text;
}

// A workload process, killed and reaped when the object goes.
class Workload {
 public:
  Workload(const std::string& status_file, std::optional<passwd> user) {
    pid_ = fork();
    if (pid_ != 0) return;
    setsid();  // its own session and no terminal: CRIU needs no --shell-job
    const int null_fd = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) dup2(null_fd, fd);
    close_range(3, ~0U, 0);
    if (user &&
        (setgroups(0, nullptr) != 0 || setresgid(user->pw_gid, user->pw_gid, user->pw_gid) != 0 ||
         setresuid(user->pw_uid, user->pw_uid, user->pw_uid) != 0)) {
      _exit(126);
    }
    execl(kWorkload, kWorkload, status_file.c_str(), "64", nullptr);
    _exit(127);
  }
  ~Workload() { Kill(); }
  pid_t pid() const { return pid_; }
  // Kills it and waits until its pid is free. The test is a subreaper, so a
  // restored copy (reparented when CRIU exits) is reaped here too.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    for (int i = 0; i < 500 && ProcessExists(pid_); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  pid_t pid_ = -1;
};

class CriuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    if (geteuid() != 0) GTEST_SKIP() << "CRIU dumps and restores need root";
    auto criu = Criu::Find();
    if (!criu.ok()) GTEST_SKIP() << "no usable CRIU: " << criu.status().ToString();
    criu_.emplace(*criu);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  // `criu dump --stream --leave-running` of `pid`, its image files written
  // into `files_dir`.
  Status Dump(pid_t pid, const std::string& images_dir, const std::string& files_dir,
              std::optional<CriuCredentials> run_as = std::nullopt) {
    GPUCKPT_ASSIGN_OR_RETURN(auto server, ImageCaptureServer::Listen(images_dir));
    CriuCommand command;
    command.args = {"dump",     "--stream", "--leave-running", "-t", std::to_string(pid), "-D",
                    images_dir, "-o",       "dump.log",        "-W", images_dir};
    if (run_as) {
      command.args.push_back("--unprivileged");
      if (chown(server->socket_path().c_str(), run_as->uid, run_as->gid) != 0) {
        return StatusFromErrno(errno, "chown socket");
      }
    }
    command.work_dir = images_dir;
    command.run_as = run_as;
    GPUCKPT_ASSIGN_OR_RETURN(CriuProcess criu, criu_->Start(command));
    Status served = server->Serve(
        [&](const std::string& name, int fd) { return CopyToFile(fd, files_dir + "/" + name); },
        criu.pidfd(), criu.pid());
    GPUCKPT_ASSIGN_OR_RETURN(int code, criu.Wait());
    if (code != 0) {
      return Status::Internal("criu dump exited " + std::to_string(code) + ": " +
                              SummarizeCriuLog(images_dir + "/dump.log"));
    }
    return served;
  }

  // `criu restore --stream -d` from the files in `files_dir`.
  Status Restore(const std::string& images_dir, const std::string& files_dir,
                 std::optional<CriuCredentials> run_as = std::nullopt) {
    GPUCKPT_ASSIGN_OR_RETURN(auto server, ImageServeServer::Listen(images_dir));
    CriuCommand command;
    command.args = {"restore", "--stream",    "-d", "-D",      images_dir,
                    "-o",      "restore.log", "-W", images_dir};
    if (run_as) {
      command.args.push_back("--unprivileged");
      if (chown(server->socket_path().c_str(), run_as->uid, run_as->gid) != 0) {
        return StatusFromErrno(errno, "chown socket");
      }
    }
    command.work_dir = images_dir;
    command.run_as = run_as;
    GPUCKPT_ASSIGN_OR_RETURN(CriuProcess criu, criu_->Start(command));
    std::mutex mu;
    Status served = server->Serve(
        [&](const std::string& name) {
          std::lock_guard<std::mutex> lock(mu);
          requested_.insert(name);
          return access((files_dir + "/" + name).c_str(), F_OK) == 0;
        },
        [&](const std::string& name, int fd) { return CopyFromFile(files_dir + "/" + name, fd); },
        criu.pidfd(), criu.pid());
    GPUCKPT_ASSIGN_OR_RETURN(int code, criu.Wait());
    if (code != 0) {
      return Status::Internal("criu restore exited " + std::to_string(code) + ": " +
                              SummarizeCriuLog(images_dir + "/restore.log"));
    }
    return served;
  }

  static Status CopyToFile(int fd, const std::string& path) {
    const int out = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) return StatusFromErrno(errno, "create " + path);
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
      if (write(out, buf, n) != n) break;
    }
    const int err = errno;
    close(out);
    return n == 0 ? Status::Ok() : StatusFromErrno(err, "copy into " + path);
  }

  static Status CopyFromFile(const std::string& path, int fd) {
    const int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return StatusFromErrno(errno, "open " + path);
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0) {
      if (write(fd, buf, n) != n) break;
    }
    const int err = errno;
    close(in);
    return n == 0 ? Status::Ok() : StatusFromErrno(err, "serve " + path);
  }

  std::optional<Criu> criu_;
  std::set<std::string> requested_;
};

TEST_F(CriuTest, FindReportsVersion41) {
  EXPECT_EQ(criu_->version().rfind("4.1", 0), 0u) << criu_->version();
  EXPECT_EQ(criu_->path(), "/usr/local/sbin/criu");
  EXPECT_EQ(ParseCriuVersion("Version: 4.1.1\nGitID: v4.1.1\n"), "4.1.1");
  EXPECT_EQ(Criu::Find("/bin/true").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Criu::Find("/nonexistent/criu").status().code(), StatusCode::kNotFound);
}

// The plugins are looked for beside the criu found, under whatever prefix
// installed it (tools/setup's /usr/local, the package's /usr), through
// symlinks to the binary.
TEST(CriuPluginDirTest, IsLibCriuBesideTheBinarysPrefix) {
  TempDir tmp("gpuckpt-criu-prefix");
  const std::string prefix = tmp.Sub("prefix");
  ASSERT_EQ(mkdir(prefix.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((prefix + "/sbin").c_str(), 0755), 0);
  const std::string binary = prefix + "/sbin/criu";
  testing::WriteFile(binary, "#!/bin/sh\necho Version: 4.1.1\n");
  ASSERT_EQ(chmod(binary.c_str(), 0755), 0);
  ASSERT_OK_AND_ASSIGN(Criu criu, Criu::Find(binary));
  EXPECT_EQ(criu.plugin_dir(), "") << "no lib/criu under the prefix yet";
  ASSERT_EQ(mkdir((prefix + "/lib").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((prefix + "/lib/criu").c_str(), 0755), 0);
  EXPECT_EQ(criu.plugin_dir(), prefix + "/lib/criu");
  const std::string link = tmp.Sub("criu-link");
  ASSERT_EQ(symlink(binary.c_str(), link.c_str()), 0);
  ASSERT_OK_AND_ASSIGN(Criu linked, Criu::Find(link));
  EXPECT_EQ(linked.plugin_dir(), prefix + "/lib/criu");
}

TEST_F(CriuTest, StreamedDumpAndRestoreKeepMemory) {
  TempDir dir("criu-test");
  const std::string status_file = dir.Sub("status");
  for (const char* sub : {"dump", "files", "restore"})
    ASSERT_EQ(mkdir(dir.Sub(sub).c_str(), 0700), 0);
  Workload workload(status_file, std::nullopt);
  ASSERT_EQ(WaitForStatus(status_file, "READY"), "READY");
  ASSERT_OK(Dump(workload.pid(), dir.Sub("dump"), dir.Sub("files")));

  const std::string pid = std::to_string(workload.pid());
  auto tasks = ParsePstreeImage(ReadFile(dir.Sub("files/pstree.img")));
  ASSERT_TRUE(tasks.ok()) << tasks.status().ToString();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].pid, static_cast<uint32_t>(workload.pid()));
  auto creds = ParseCoreCreds(ReadFile(dir.Sub("files/core-" + pid + ".img")));
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  EXPECT_EQ(creds->uid, 0u);
  EXPECT_EQ(creds->euid, 0u);
  EXPECT_TRUE(LooksLikeCriuImage(ReadFile(dir.Sub("files/inventory.img"))));

  workload.Kill();
  ASSERT_FALSE(ProcessExists(workload.pid()));
  ASSERT_OK(Restore(dir.Sub("restore"), dir.Sub("files")));
  EXPECT_TRUE(requested_.count("pstree.img")) << "CRIU never asked for pstree.img";
  ASSERT_TRUE(ProcessExists(workload.pid()));
  ASSERT_EQ(kill(workload.pid(), SIGUSR1), 0);
  EXPECT_EQ(WaitForStatus(status_file, "PASS"), "PASS");
}

TEST_F(CriuTest, ServeGivesUpWhenCriuExitsWithoutConnecting) {
  TempDir dir("criu-test");
  ASSERT_EQ(mkdir(dir.Sub("images").c_str(), 0700), 0);
  ASSERT_EQ(mkdir(dir.Sub("elsewhere").c_str(), 0700), 0);
  auto server = ImageCaptureServer::Listen(dir.Sub("images"));
  ASSERT_OK(server.status());
  // CRIU looks for the socket in another directory, fails and exits.
  CriuCommand command;
  command.args = {"dump", "--stream", "-t", "1", "-D", dir.Sub("elsewhere"), "-o", "dump.log"};
  command.work_dir = dir.path();
  // CRIU connects before it opens its log: the reason is on stderr only.
  const int err_fd = open(dir.Sub("stderr").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(err_fd, 0);
  command.stderr_fd = err_fd;
  auto criu = criu_->Start(command);
  close(err_fd);
  ASSERT_OK(criu.status());
  Status served = (*server)->Serve([](const std::string&, int) { return Status::Ok(); },
                                   criu->pidfd(), criu->pid());
  EXPECT_EQ(served.code(), StatusCode::kAborted) << served.ToString();
  auto code = criu->Wait();
  ASSERT_OK(code.status());
  EXPECT_NE(*code, 0);
  EXPECT_NE(SummarizeCriuLog(dir.Sub("stderr")).find("Unable to connect to image streamer"),
            std::string::npos)
      << ReadFile(dir.Sub("stderr"));
}

// The cause of a failed dump is CRIU's first error that is not one of its
// harmless lines (the lines of a real CRIU 4.1.1 log of a traced process).
TEST(CriuFailureCauseTest, PicksTheFirstErrorThatSaysWhy) {
  const std::string summary =
      "(00.382219) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self: "
      "Operation not permitted\n"
      "(00.392344) Error (compel/src/lib/infect.c:418): Unable to detach from 10994: No such "
      "process\n"
      "(00.392386) Error (criu/cr-dump.c:2111): Dumping FAILED.";
  EXPECT_EQ(CriuFailureCause(summary), "Unable to detach from 10994: No such process");
  // Only harmless errors: the last line, as it is.
  EXPECT_EQ(CriuFailureCause("(00.1) Error (criu/util.c:1533): rlimit: RLIMIT_NOFILE\n"
                             "(00.2) Error (criu/cr-restore.c:2460): Restoring FAILED."),
            "Restoring FAILED.");
  // No error line (stderr of a CRIU that never opened its log).
  EXPECT_EQ(CriuFailureCause("Warn: something\nUnable to connect to image streamer\n\n"),
            "Unable to connect to image streamer");
  EXPECT_EQ(CriuFailureCause(""), "");
}

// The failures gpuckpt answers with an errno of its own, from the log lines
// CRIU writes for them (the texts of CRIU 4.1's dump and restore).
TEST(CriuFailureCauseTest, ClassifiesTheFailuresGpuckptAnswers) {
  EXPECT_EQ(ClassifyCriuFailure("(00.2) Error (criu/image.c:234): Unable to write: No space left "
                                "on device\nDumping FAILED."),
            CriuFailureKind::kNoSpace);
  EXPECT_EQ(ClassifyCriuFailure("(00.4) 4242: Error (criu/sk-inet.c:803): Can't bind inet "
                                "socket (id 12): Address already in use\nRestoring FAILED."),
            CriuFailureKind::kAddressInUse);
  EXPECT_EQ(ClassifyCriuFailure("(00.1) Error (criu/cr-dump.c:1200): Dump failed\n"),
            CriuFailureKind::kOther);
  EXPECT_EQ(ClassifyCriuFailure(""), CriuFailureKind::kOther);
}

// The probe must agree with CRIU itself: where it says breakpoints fire, a
// plain dump (hardware breakpoints on) ends; where it says they do not,
// that dump hangs, which is why gpuckpt then turns them off.
TEST_F(CriuTest, BreakpointProbeAgreesWithAPlainDump) {
  const auto start = std::chrono::steady_clock::now();
  const bool fire = HardwareBreakpointsFire();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  TempDir dir;
  const pid_t sleeper = fork();
  ASSERT_GE(sleeper, 0);
  if (sleeper == 0) {
    setsid();
    execl("/bin/sleep", "sleep", "600", nullptr);
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // CRIU_FAULT unset: CRIU as it runs by default. A hung dump is ended by
  // timeout(1) after 20 s, far beyond the second a dump of sleep takes.
  const std::string command = "env -u CRIU_FAULT timeout -s KILL 20 " + criu_->path() +
                              " dump --leave-running -t " + std::to_string(sleeper) + " -D " +
                              dir.path() + " -o dump.log >/dev/null 2>&1";
  const int rc = std::system(command.c_str());
  kill(sleeper, SIGKILL);
  waitpid(sleeper, nullptr, 0);
  ASSERT_TRUE(WIFEXITED(rc)) << rc;
  if (fire) {
    EXPECT_EQ(WEXITSTATUS(rc), 0) << "breakpoints fire here, yet a plain dump failed";
  } else {
    EXPECT_EQ(WEXITSTATUS(rc), 128 + SIGKILL) << "the probe says breakpoints do not fire here, "
                                                 "yet a plain dump did not hang";
  }
}

TEST_F(CriuTest, StartRejectsBadCommands) {
  CriuCommand command;
  command.args = {"--version"};
  command.keep_fds = {1};
  EXPECT_EQ(criu_->Start(command).status().code(), StatusCode::kInvalidArgument);
  command.keep_fds = {};
  command.work_dir = "/nonexistent";
  EXPECT_EQ(criu_->Start(command).status().code(), StatusCode::kNotFound);
}

// The finding of interest: can CRIU 4.1.1 restore a non-root user's process
// as that user (`--unprivileged`, only CAP_CHECKPOINT_RESTORE)?
TEST_F(CriuTest, UnprivilegedRestoreAsOwner) {
  if (getpwnam(kTestUser) == nullptr) {
    ASSERT_EQ(system("useradd -r -M -s /usr/sbin/nologin gpuckpt-test"), 0);
  }
  const passwd* pw = getpwnam(kTestUser);
  ASSERT_NE(pw, nullptr);
  const passwd user = *pw;
  TempDir dir("criu-test");
  for (const char* sub : {"dump", "files", "restore", "user"}) {
    ASSERT_EQ(mkdir(dir.Sub(sub).c_str(), 0700), 0);
  }
  // What the user's process and the user's CRIU may touch.
  for (const char* sub : {"restore", "user"}) {
    ASSERT_EQ(chown(dir.Sub(sub).c_str(), user.pw_uid, user.pw_gid), 0);
  }
  const std::string status_file = dir.Sub("user/status");
  Workload workload(status_file, user);
  ASSERT_EQ(WaitForStatus(status_file, "READY"), "READY");
  // Root without CAP_SYS_RESOURCE (some containers) may not prlimit() another
  // user's process, which CRIU's dump needs; CRIU then dumps as the owner.
  std::optional<CriuCredentials> dump_as;
  if (!HasCapability(CAP_SYS_RESOURCE)) {
    dump_as = CriuCredentials{user.pw_uid, user.pw_gid, {}, /*keep_sys_ptrace=*/true};
    ASSERT_EQ(chown(dir.Sub("dump").c_str(), user.pw_uid, user.pw_gid), 0);
  }
  ASSERT_OK(Dump(workload.pid(), dir.Sub("dump"), dir.Sub("files"), dump_as));
  auto creds =
      ParseCoreCreds(ReadFile(dir.Sub("files/core-" + std::to_string(workload.pid()) + ".img")));
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  EXPECT_EQ(creds->uid, user.pw_uid);

  workload.Kill();
  ASSERT_FALSE(ProcessExists(workload.pid()));
  CriuCredentials run_as;
  run_as.uid = user.pw_uid;
  run_as.gid = user.pw_gid;
  // A bounding set with holes (this process's, if it runs in a container
  // that drops capabilities) makes CRIU's restorer drop them: CAP_SETPCAP.
  run_as.keep_setpcap = !FullBoundingSet(*creds);
  ASSERT_OK(Restore(dir.Sub("restore"), dir.Sub("files"), run_as));
  ASSERT_TRUE(ProcessExists(workload.pid()));
  struct stat st;
  ASSERT_EQ(stat(("/proc/" + std::to_string(workload.pid())).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, user.pw_uid);
  ASSERT_EQ(kill(workload.pid(), SIGUSR1), 0);
  EXPECT_EQ(WaitForStatus(status_file, "PASS"), "PASS");
}

}  // namespace
}  // namespace gpuckpt
