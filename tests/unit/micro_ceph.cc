#include "tests/unit/micro_ceph.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "tests/unit/test_util.h"

namespace gpuckpt::testing {

namespace {

std::string cluster_dir;
std::string cluster_conf;
std::string why_not;

const char* Script() { return GPUCKPT_SOURCE_DIR "/tools/micro-ceph"; }

// A process that stops the cluster once this one is gone, however it ended
// (a crash or a fatal signal included): it waits for the end of a pipe
// whose other end only this process holds.
void StartClusterGuard(const std::string& dir) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[0], STDIN_FILENO);
    const int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, STDOUT_FILENO);
    dup2(null_fd, STDERR_FILENO);
    setsid();  // out of the test's process group: a ^C reaches us only as EOF
    execl("/bin/sh", "sh", "-c", "cat >/dev/null; exec \"$0\" stop \"$1\"", Script(), dir.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[0]);
  // fds[1] stays open, unused, until this process exits.
}

}  // namespace

int RunMicroCeph(const std::vector<std::string>& args) {
  std::vector<std::string> argv_strings = {Script()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const std::string& MicroCephEnvironment::dir() { return cluster_dir; }
const std::string& MicroCephEnvironment::conf() { return cluster_conf; }
const std::string& MicroCephEnvironment::skip_reason() { return why_not; }

void MicroCephEnvironment::SetUp() {
  if (geteuid() != 0) {
    why_not = "needs root to run a Ceph cluster (tools/micro-ceph)";
    return;
  }
  if (access("/usr/bin/ceph-osd", X_OK) != 0 || access("/usr/bin/ceph-mon", X_OK) != 0) {
    why_not = "Ceph is not installed (ceph-mon, ceph-osd: tools/setup installs them)";
    return;
  }
  char dir_template[] = "/tmp/micro-ceph.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  cluster_dir = dir_template;
  // The daemons fork into the background; as our orphans rather than
  // PID 1's they are reaped once stopped, also where PID 1 reaps nothing.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  StartClusterGuard(cluster_dir);
  std::vector<std::string> args = {"start", cluster_dir};
  for (const std::string& pool : pools_) {
    args.push_back("--pool");
    args.push_back(pool);
  }
  const int rc = RunMicroCeph(args);
  if (rc != 0) {
    why_not = "the cluster did not start";
    FAIL() << "micro-ceph start " << cluster_dir << " exited with " << rc << "; logs in "
           << cluster_dir << "/log/";
  }
  cluster_conf = cluster_dir + "/ceph.conf";
}

void MicroCephEnvironment::TearDown() {
  if (cluster_dir.empty()) return;
  EXPECT_EQ(RunMicroCeph({"stop", cluster_dir}), 0);
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  if (::testing::UnitTest::GetInstance()->Passed()) {
    RemoveTree(cluster_dir);
  } else {
    std::fprintf(stderr, "the cluster's files and logs are kept in %s\n", cluster_dir.c_str());
  }
  cluster_dir.clear();
  cluster_conf.clear();
}

}  // namespace gpuckpt::testing
