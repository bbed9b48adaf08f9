// wl_tree: a process tree connected by pipes.
//
//   root (role 0) ── child 1 ── grandchild 4
//                 ├─ child 2
//                 └─ child 3
// Each member holds 8 MiB of memory with a pattern seeded by its role (and
// the copy-on-write copies of its ancestors' memory, checked too), and
// one link to its parent: commands down, verdict lines up. The links are
// pipe pairs, except child 3's: an established TCP connection over
// loopback (CRIU must dump and restore it, as it does for the ranks of a
// multi-GPU job talking through NCCL's sockets). A member
// reports "R" up once it and its subtree are set up; the root announces
// ready only then. On SIGUSR1 the root sends "C" down; each member checks
// its memory, that its pid, parent pid and session are those of setup,
// forwards "C" to its children, gathers their verdicts and sends one line
// up ("PASS" or "FAIL: role N: ..."). The root passes only if all do and
// every child exits 0. Members exit when their parent's pipe closes
// (and by PR_SET_PDEATHSIG), so killing the root ends the tree.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/workloads/workload.h"

namespace wl = gpuckpt::workload;

namespace {

constexpr std::size_t kMemberBytes = 8 << 20;
constexpr int kVerdictTimeoutMs = 60 * 1000;

struct Link {
  int role;
  pid_t pid;
  int cmd_write;     // Parent to child.
  int verdict_read;  // Child to parent (the same fd as cmd_write for a TCP link).
};

constexpr int kTcpRole = 3;  // the child whose link is a TCP connection

void CloseLink(const Link& l) {
  close(l.cmd_write);
  if (l.verdict_read != l.cmd_write) close(l.verdict_read);
}

// A listening TCP socket on 127.0.0.1, any port; *port gets it.
int ListenLoopback(uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 1) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

int ConnectLoopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Pattern memory mapped by this member or, before fork, by its ancestors.
struct Region {
  const unsigned char* data;
  int role;
};
std::vector<Region> regions;

// What a member knows about itself at setup.
struct Member {
  int role;
  pid_t pid;
  pid_t parent;
  pid_t session;
  unsigned char* memory;
  std::vector<Link> children;
  wl::Heartbeat heartbeat;
};

std::vector<int> ChildRoles(int role) {
  if (role == 0) return {1, 2, 3};
  if (role == 1) return {4};
  return {};
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "wl_tree: %s\n", what.c_str());
  std::_Exit(2);
}

void RunChild(int role, pid_t parent, int cmd_read, int verdict_write);

// Forks the children of `self`. `inherited` are fds the new children must
// not keep (the member's own link upward).
void SpawnChildren(Member* self, const std::vector<int>& inherited) {
  for (int role : ChildRoles(self->role)) {
    if (role == kTcpRole) {
      uint16_t port = 0;
      const int listener = ListenLoopback(&port);
      if (listener < 0) Die(wl::ErrnoText("listen on 127.0.0.1"));
      pid_t pid = fork();
      if (pid < 0) Die(wl::ErrnoText("fork"));
      if (pid == 0) {
        close(listener);
        for (int fd : inherited) close(fd);
        for (const Link& l : self->children) CloseLink(l);
        const int conn = ConnectLoopback(port);
        if (conn < 0) Die(wl::ErrnoText("connect to 127.0.0.1"));
        RunChild(role, self->pid, conn, conn);
      }
      const int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) Die(wl::ErrnoText("accept"));
      close(listener);  // only the established connection is left
      self->children.push_back({role, pid, conn, conn});
      continue;
    }
    int cmd[2], verdict[2];
    if (pipe(cmd) != 0 || pipe(verdict) != 0) Die(wl::ErrnoText("pipe"));
    pid_t pid = fork();
    if (pid < 0) Die(wl::ErrnoText("fork"));
    if (pid == 0) {
      for (int fd : inherited) close(fd);
      for (const Link& l : self->children) CloseLink(l);
      close(cmd[1]);
      close(verdict[0]);
      RunChild(role, self->pid, cmd[0], verdict[1]);
    }
    close(cmd[0]);
    close(verdict[1]);
    self->children.push_back({role, pid, cmd[1], verdict[0]});
  }
  // Wait until every child reports its subtree set up.
  for (const Link& l : self->children) {
    std::string line;
    if (!wl::ReadLine(l.verdict_read, &line, kVerdictTimeoutMs) || line != "R") {
      Die("child " + std::to_string(l.role) + " did not get ready");
    }
  }
}

void Setup(Member* self, const std::vector<int>& upward) {
  self->pid = getpid();
  self->session = getsid(0);
  self->memory = static_cast<unsigned char*>(wl::MapAnonymous(kMemberBytes));
  wl::FillPattern(self->memory, kMemberBytes, 100 + self->role);
  regions.push_back({self->memory, self->role});
  SpawnChildren(self, upward);
}

// Checks this member, then asks its children and gathers their verdicts.
std::string CheckSubtree(Member* self) {
  wl::Verdict verdict;
  std::string me = "role " + std::to_string(self->role) + ": ";
  for (const Region& r : regions) {
    std::size_t bad = wl::FirstPatternMismatch(r.data, kMemberBytes, 100 + r.role);
    if (bad != kMemberBytes) {
      verdict.Fail(me + "memory of role " + std::to_string(r.role) + " differs at byte " +
                   std::to_string(bad));
    }
  }
  if (getpid() != self->pid) verdict.Fail(me + "pid " + std::to_string(getpid()));
  if (self->role != 0 && getppid() != self->parent) {
    verdict.Fail(me + "parent is " + std::to_string(getppid()) + ", not " +
                 std::to_string(self->parent));
  }
  if (getsid(0) != self->session) {
    verdict.Fail(me + "session " + std::to_string(getsid(0)));
  }
  if (!self->heartbeat.Consistent()) verdict.Fail(me + "heartbeat torn");
  for (const Link& l : self->children) {
    if (!wl::WriteAll(l.cmd_write, "C\n", 2)) {
      verdict.Fail(me + "cannot reach child " + std::to_string(l.role));
    }
  }
  for (const Link& l : self->children) {
    std::string line;
    std::string child = "role " + std::to_string(l.role) + ": ";
    if (!wl::ReadLine(l.verdict_read, &line, kVerdictTimeoutMs)) {
      verdict.Fail(child + "no verdict");
    } else if (line != "PASS") {
      verdict.Fail(line.rfind("FAIL: ", 0) == 0 ? line.substr(6) : child + line);
    }
    int status = 0;
    if (waitpid(l.pid, &status, 0) != l.pid) {
      verdict.Fail(child + "cannot wait for pid " + std::to_string(l.pid));
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      verdict.Fail(child + "exited with status " + std::to_string(status));
    }
  }
  return verdict.Text();
}

void RunChild(int role, pid_t parent, int cmd_read, int verdict_write) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) std::_Exit(3);  // The parent died before prctl.
  Member self{};
  self.role = role;
  self.parent = parent;
  Setup(&self, {cmd_read, verdict_write});
  if (!wl::WriteAll(verdict_write, "R\n", 2)) std::_Exit(3);
  for (;;) {
    pollfd pfd{cmd_read, POLLIN, 0};
    int r = poll(&pfd, 1, 100);
    if (r == 0 || (r < 0 && errno == EINTR)) {
      self.heartbeat.Beat();
      continue;
    }
    char c = 0;
    if (r < 0 || read(cmd_read, &c, 1) != 1) std::_Exit(3);  // The parent is gone.
    if (c != 'C') continue;
    std::string failure = CheckSubtree(&self);
    std::string line = failure.empty() ? "PASS\n" : "FAIL: " + failure + "\n";
    wl::WriteAll(verdict_write, line.data(), line.size());
    std::_Exit(failure.empty() ? 0 : 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  wl::Options options = wl::ParseOptions(argc, argv, 0);
  wl::BlockCheckSignal();  // Inherited by the whole tree.
  signal(SIGPIPE, SIG_IGN);
  Member root{};
  root.role = 0;
  root.parent = getppid();
  Setup(&root, {});
  wl::AnnounceReady(options);
  wl::WaitForCheck([&] { root.heartbeat.Beat(); }, 50);
  wl::Finish(options, CheckSubtree(&root));
}
