"""Who runs a command: the integration tests' ordinary users (User, made
when absent) and root through the same interface (Root); the GPU tests'
workloads' user (RunAs: made for the run and removed after, own HOME, no
capabilities)."""

import os
import pwd
import re
import subprocess

from gpuckpt_testing.build import PYTHON
from gpuckpt_testing.messages import fail

USER_NAME_RE = re.compile(r"[a-z_][a-z0-9_-]*")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]

# One write(2) of argv[2] + "\n" into argv[1]; on failure, strerror on stderr.
_WRITE_ONE = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, os.fsencode(sys.argv[2]) + b"\\n")
    finally:
        os.close(fd)
except OSError as e:
    sys.exit(os.strerror(e.errno))
"""

# Ordinary users the tests act as; made (system users, no home) when absent.
USERS = ("gpuckpt-test-a", "gpuckpt-test-b")


class User:
    """An ordinary user: uid, gid, and commands run with their credentials."""

    def __init__(self, name):
        if subprocess.run(["id", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-r", "-M", "-s", "/usr/sbin/nologin", name], check=True)
        entry = pwd.getpwnam(name)
        self.name = name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid

    def prefix(self):
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups"]

    def run(self, args, timeout=60, **kwargs):
        """Runs `args` as this user; a CompletedProcess with text output."""
        return subprocess.run(self.prefix() + list(args), capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def write(self, path, text, timeout=120):
        """Writes `text` and a newline into `path` as this user, in one
        write: (ok, the error in words: strerror of the errno). Not through
        a shell: dash says "I/O error" for every failed write."""
        r = self.run([PYTHON, "-c", _WRITE_ONE, path, text], timeout=timeout)
        return r.returncode == 0, r.stderr.strip()

    def read(self, path, timeout=60):
        """Reads `path` as this user: (ok, its text or the error in words)."""
        r = self.run(["cat", path], timeout=timeout)
        return r.returncode == 0, (r.stdout if r.returncode == 0 else r.stderr.strip())


class Root(User):
    """Root, through the same interface as an ordinary User."""

    def __init__(self):  # pylint: disable=super-init-not-called
        self.name = "root"
        self.uid = 0
        self.gid = 0

    def prefix(self):
        return []


class RunAs:
    """Who the workloads belong to: an ordinary user (made when there is no
    such user, removed by `cleanup`), with their own groups, HOME and no
    capabilities, or root (`name` "root")."""

    def __init__(self, name, home):
        self.name = name
        self.created = False
        self.uid = self.gid = 0
        self.prefix = []
        if name == "root":
            return
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            made = subprocess.run(["useradd", "--system", "--user-group", "--home-dir", home,
                                   "--shell", "/usr/sbin/nologin", name],
                                  capture_output=True, text=True)
            if made.returncode != 0:
                fail(f"cannot make user {name} (useradd failed: {made.stderr.strip()})")
            self.created = True
        self.uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True,
                                      check=True).stdout)
        self.gid = int(subprocess.run(["id", "-g", name], capture_output=True, text=True,
                                      check=True).stdout)
        os.makedirs(home, exist_ok=True)
        os.chown(home, self.uid, self.gid)
        self.prefix = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
                       "--inh-caps=-all", "env", f"HOME={home}", f"USER={name}", f"LOGNAME={name}"]

    def cleanup(self):
        if self.created:
            subprocess.run(["userdel", self.name], capture_output=True)
            self.created = False

    def give(self, *dirs):
        """The directories (made if missing) belong to the workloads' user."""
        for d in dirs:
            os.makedirs(d, exist_ok=True)
            if self.uid != 0:
                os.chown(d, self.uid, self.gid)

    def run(self, argv, timeout=60):
        """argv as this user; stdout and stderr together, as text."""
        try:
            out = subprocess.run(self.prefix + argv, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace",
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, f"no answer within {timeout} s"
        return out.returncode, out.stdout

    def cat(self, path):
        """What `cat path` prints as this user (errors too), trailing newlines
        dropped."""
        return self.run(["cat", path])[1].rstrip("\n")

    def write(self, path, text, seconds):
        """Writes text + newline into a control file as this user, waiting at
        most `seconds`. Returns (exit status, what the shell said)."""
        argv = ["timeout", "-k", "5", str(seconds)] + self.prefix + [
            "bash", "-c", 'printf "%s\\n" "$2" >"$1"', "_", path, text]
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace")
        said = out.stdout.rstrip("\n")
        if out.returncode in (124, 137):
            said = f"no answer within {seconds} s (write of '{text}' to {path})"
        return out.returncode, said


ROOT = None  # RunAs("root"), made on first use by as_root()


def as_root():
    global ROOT
    if ROOT is None:
        ROOT = RunAs("root", "/root")
    return ROOT
