"""What the pytest integration tests share: a real gpuckptfs mount of a fresh
store, self-checking workloads (tests/workloads/workload.h) started as root
or as an ordinary test user, and commands run as such a user.

The tests run under ctest, inside wl_reaper (restored processes are
orphans), with GPUCKPTFS and WORKLOAD_BIN naming the built gpuckptfs and the
directory of the workloads. They need root, /dev/fuse and CRIU; a module
skips, saying why, where one of them is missing (`why_not_runnable`).
"""

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

GPUCKPTFS = os.environ.get("GPUCKPTFS", "")
WORKLOAD_BIN = os.environ.get("WORKLOAD_BIN", "")
CRIU = shutil.which("criu") or "/usr/local/sbin/criu"

PYTHON = "/usr/bin/python3"
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


def why_not_runnable(workload="wl_memory"):
    """None when the tests can run here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (CRIU checkpoints and restores as root)"
    if not os.access("/dev/fuse", os.W_OK):
        return "/dev/fuse is not usable here, so no real mount can be tested"
    if subprocess.run([CRIU, "--version"], capture_output=True).returncode != 0:
        return f"no usable criu at {CRIU}"
    if not os.access(GPUCKPTFS, os.X_OK):
        return f"GPUCKPTFS={GPUCKPTFS!r} is not an executable gpuckptfs"
    if not os.access(os.path.join(WORKLOAD_BIN, workload), os.X_OK):
        return f"WORKLOAD_BIN={WORKLOAD_BIN!r} holds no {workload}"
    return None


def wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


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


class Workload:
    """A self-checking workload in its own session, as root or as `user`."""

    def __init__(self, work, name, *args, user=None, env=None):
        self.dir = tempfile.mkdtemp(prefix=name + "-", dir=work)
        self.result = os.path.join(self.dir, "result")
        self.user = user
        binary = os.path.join(work, name)
        if not os.path.exists(binary):
            shutil.copy(os.path.join(WORKLOAD_BIN, name), binary)
            os.chmod(binary, 0o755)
        log = os.path.join(self.dir, "out.log")
        open(log, "w").close()
        run_as = []
        if user is not None:
            # The workload's files are the user's own, as if they had
            # started it: a restore run as the user reopens them.
            os.chown(self.dir, user.uid, user.gid)
            os.chown(log, user.uid, user.gid)
            run_as = user.prefix()
        # Started through a shell that exits at once: the workload is then
        # an orphan that the subreaper (wl_reaper) reaps when it is killed,
        # so its pid is free again for the restore.
        subprocess.run(["sh", "-c", 'log=$1; shift; setsid "$@" </dev/null >"$log" 2>&1 &', "sh",
                        log, *run_as, binary, self.result, *args], check=True, env=env)
        ready = self.result + ".ready"
        wait_for(lambda: os.path.exists(ready), 120, f"{name} to get ready")
        with open(ready) as f:
            self.pid = int(f.read())

    def alive(self):
        return os.path.exists(f"/proc/{self.pid}")

    def kill(self):
        kill_if_alive(self.pid)
        wait_for(lambda: not self.alive(), 10, f"pid {self.pid} to go")

    def verdict(self):
        if os.path.exists(self.result):
            os.unlink(self.result)
        os.kill(self.pid, signal.SIGUSR1)
        wait_for(lambda: os.path.exists(self.result), 120, "the workload's verdict")
        with open(self.result) as f:
            return f.read().strip()


def kill_if_alive(pid):
    """SIGKILL to `pid` unless it is gone. A check of /proc/<pid> first
    would race: a process that exits (or a zombie the subreaper reaps)
    between the check and the kill raises ProcessLookupError."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Mount:
    """gpuckptfs on a fresh store in a fresh work dir; `close()` unmounts.
    `env`: the daemon's environment (default: this process's)."""

    def __init__(self, prefix, *options, store=None, env=None):
        self.work = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
        # Workloads run from here, also as the test users.
        os.chmod(self.work, 0o755)
        self.mnt = os.path.join(self.work, "mnt")
        os.mkdir(self.mnt)
        self.store = store or os.path.join(self.work, "store")
        self.run_dir = os.path.join(self.work, "run")
        # The daemon's state (its log, kept CRIU logs) stays with this mount.
        self.state_dir = os.path.join(self.work, "state")
        self.log_path = os.path.join(self.work, "daemon.log")
        self.workloads = []
        with open(self.log_path, "w") as log:
            subprocess.run([GPUCKPTFS, "--store", self.store, "--all-processes",
                            "--work-dir", self.run_dir, "--state-dir", self.state_dir,
                            *options, self.mnt],
                           stdout=log, stderr=log, check=True, timeout=120, env=env)

    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def start(self, name, *args, user=None, env=None):
        """Starts a workload (in `env`, default this process's environment),
        waits for its directory to appear, keeps it to kill."""
        wl = Workload(self.work, name, *args, user=user, env=env)
        self.workloads.append(wl)
        wait_for(lambda: os.path.isdir(self.path(str(wl.pid))), 10,
                 f"{self.path(str(wl.pid))} to appear")
        return wl

    def close(self):
        for w in self.workloads:
            kill_if_alive(w.pid)
        fusermount = shutil.which("fusermount3")
        if fusermount is None or subprocess.run([fusermount, "-u", self.mnt]).returncode != 0:
            subprocess.run(["umount", "-l", self.mnt])
        shutil.rmtree(self.work, ignore_errors=True)


def mount_in_cgroup(cgroup, monkeypatch, tmp_path, prefix, *options):
    """A Mount whose gpuckptfs starts in the cgroup directory `cgroup`, as
    a service manager starts a daemon: through a wrapper that joins it, then
    runs the real one (which forks into the background from there)."""
    wrapper = tmp_path / "gpuckptfs-in-cgroup"
    wrapper.write_text("#!/bin/sh\n"
                       f"echo $$ > '{cgroup}/cgroup.procs' || exit 1\n"
                       f"exec '{GPUCKPTFS}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(f"{__name__}.GPUCKPTFS", str(wrapper))
    return Mount(prefix, *options)


@contextlib.contextmanager
def small_tmpfs(prefix, mib):
    """A tmpfs of `mib` MiB on a fresh directory under /var/tmp (its path),
    unmounted and removed afterwards; skips the test, saying why, where
    none can be mounted."""
    disk = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", disk],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(disk)
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", disk])
        shutil.rmtree(disk, ignore_errors=True)


def ctl(path, command):
    """Writes `command` and a newline into `path` in one write(2); OSError
    when it fails. (A buffered file would write again when closed after a
    failed write, and the command would run twice.)"""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, os.fsencode(command) + b"\n")
    finally:
        os.close(fd)


def read(path):
    with open(path) as f:
        return f.read()


def listdir_as(user, path):
    """Sorted names of `path` as `user` lists them."""
    r = user.run([PYTHON, "-c", "import json, os, sys; print(json.dumps(os.listdir(sys.argv[1])))",
                  path])
    assert r.returncode == 0, r.stderr
    return sorted(json.loads(r.stdout))


def status_line(mnt, pid, key):
    """The `key:` line of <pid>/status, without the key."""
    for line in read(os.path.join(mnt, str(pid), "status")).splitlines():
        if line.startswith(key + ":"):
            return line[len(key) + 1:].strip()
    raise AssertionError(f"no {key}: line in {pid}/status")
