#include "tools/slurm/exit_keeper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "core/base/small_file.h"
#include "core/base/unique_fd.h"

namespace gpuckpt {
namespace {

// The program's pid, for the forwarding handler.
volatile sig_atomic_t g_program = 0;

void Forward(int signal) {
  if (g_program > 0) kill(g_program, signal);
}

// The signals a batch shell's script would get from the job: passed on.
constexpr int kForwarded[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM, SIGUSR1,
                              SIGUSR2, SIGALRM, SIGCONT, SIGWINCH};

}  // namespace

Status WriteFileWhole(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  UniqueFd fd(open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return StatusFromErrno(errno, "writing " + partial);
  if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      fsync(fd.get()) != 0)
    return StatusFromErrno(errno, "writing " + partial);
  if (rename(partial.c_str(), path.c_str()) != 0)
    return StatusFromErrno(errno, "renaming " + partial);
  return Status::Ok();
}

Status WriteKeptStatus(const std::string& status_file, int code) {
  return WriteFileWhole(status_file, std::to_string(code) + "\n");
}

int RunKeeper(const std::string& status_file, const std::vector<std::string>& command) {
  struct sigaction forward {};
  forward.sa_handler = Forward;
  forward.sa_flags = SA_RESTART;
  sigemptyset(&forward.sa_mask);
  for (int signal : kForwarded) sigaction(signal, &forward, nullptr);

  const pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "gpuckpt-slurm: cannot start %s: %s\n", command[0].c_str(),
                 std::strerror(errno));
    return 127;
  }
  if (child == 0) {
    for (int signal : kForwarded) ::signal(signal, SIG_DFL);
    std::vector<char*> argv;
    for (const std::string& word : command) argv.push_back(const_cast<char*>(word.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());  // a step's program may be a bare name
    std::fprintf(stderr, "gpuckpt-slurm: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  g_program = child;
  int wait_status = 0;
  while (waitpid(child, &wait_status, 0) < 0)
    if (errno != EINTR) return 1;
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  Status written = WriteKeptStatus(status_file, code);
  if (!written.ok())
    std::fprintf(stderr, "gpuckpt-slurm: the job's exit status is lost: %s\n",
                 written.message().c_str());
  return code;
}

Result<int> ReadKeptStatus(const std::string& status_file) {
  auto text = ReadSmallFileNoFollow(status_file, 64);
  if (!text.ok()) return text.status();
  int code = -1;
  auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), code);
  if (error != std::errc() || code < 0 || code > 255 ||
      (end != text->data() + text->size() && *end != '\n'))
    return Status::Corruption(status_file + " holds no exit status");
  return code;
}

}  // namespace gpuckpt
