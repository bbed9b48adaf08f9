"""A real gpuckptfs mount of a fresh store for the integration tests
(Mount), and what the tests do through one: control files, status lines,
one filesystem call as a user (probe), the store's CLI.

The tests run under ctest, inside wl_reaper (restored processes are
orphans), with GPUCKPTFS and WORKLOAD_BIN naming the built gpuckptfs and the
directory of the workloads (gpuckpt_testing.build). They need root,
/dev/fuse and CRIU; a module skips, saying why, where one of them is missing
(`why_not_runnable`). The benchmarks (tests/bench/checkpoint_bench,
pool_bench) use it too, without pytest: pytest is imported only where a
test is skipped.
"""

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time

from gpuckpt_testing import build
from gpuckpt_testing.build import PYTHON
from gpuckpt_testing.filetools import read
from gpuckpt_testing.processes import kill_if_alive, wait_for
from gpuckpt_testing.users import Root
from gpuckpt_testing.workloads import Workload


def why_not_runnable(workload="wl_memory"):
    """None when the tests can run here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (CRIU checkpoints and restores as root)"
    if not os.access("/dev/fuse", os.W_OK):
        return "/dev/fuse is not usable here, so no real mount can be tested"
    if subprocess.run([build.CRIU, "--version"], capture_output=True).returncode != 0:
        return f"no usable criu at {build.CRIU}"
    if not os.access(build.GPUCKPTFS, os.X_OK):
        return f"GPUCKPTFS={build.GPUCKPTFS!r} is not an executable gpuckptfs"
    if not os.access(os.path.join(build.WORKLOAD_BIN, workload), os.X_OK):
        return f"WORKLOAD_BIN={build.WORKLOAD_BIN!r} holds no {workload}"
    return None


class Mount:
    """gpuckptfs on a fresh store in a fresh work dir; `close()` unmounts.
    `env`: the daemon's environment (default: this process's). With
    `mounted=False` the daemon is started later, by `start_daemon()` (after
    the store was filled through the CLI, say). `work`: this work dir
    instead of a fresh one; `own_dirs=False`: the daemon keeps its state and
    CRIU's files where it does by default, as when installed (what a
    benchmark measures), not in the work dir. `all_processes=False`: the
    daemon shows GPU processes and those tracked or named only, as it does
    by default."""

    def __init__(self, prefix, *options, store=None, env=None, mounted=True, work=None,
                 own_dirs=True, all_processes=True):
        if work is None:
            work = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
        self.work = work
        os.makedirs(self.work, exist_ok=True)
        # Workloads run from here, also as the test users.
        os.chmod(self.work, 0o755)
        self.mnt = os.path.join(self.work, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        self.store = store or os.path.join(self.work, "store")
        self.run_dir = os.path.join(self.work, "run")
        # The daemon's state (its log, kept CRIU logs) stays with this mount.
        self.state_dir = os.path.join(self.work, "state")
        self.log_path = os.path.join(self.work, "daemon.log")
        self.own_dirs = own_dirs
        self.all_processes = all_processes
        self.options = options
        self.env = env
        self.workloads = []
        if mounted:
            self.start_daemon()

    def start_daemon(self):
        """Mounts: gpuckptfs returns once the mount is up (its daemon runs
        on in the background)."""
        dirs = ["--work-dir", self.run_dir, "--state-dir", self.state_dir] if self.own_dirs else []
        with open(self.log_path, "a") as log:
            shown = ["--all-processes"] if self.all_processes else []
            subprocess.run([build.GPUCKPTFS, "--store", self.store, *shown, *dirs,
                            *self.options, self.mnt],
                           stdout=log, stderr=log, check=True, timeout=120, env=self.env)
        assert os.path.ismount(self.mnt), "not mounted after gpuckptfs returned"

    def daemon_pids(self):
        """The pids of gpuckptfs processes serving this mount's store."""
        r = subprocess.run(["pgrep", "-f", f"gpuckptfs --store {self.store} "],
                           capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def unmount(self, seconds=5):
        """Unmounts; the daemon must then exit within `seconds` (it closes
        the store first)."""
        subprocess.run(["fusermount3", "-u", self.mnt], check=True)
        wait_for(lambda: not self.daemon_pids(), seconds, "the daemon to exit after the unmount")

    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def ids(self, user=None):
        """The checkpoint ids the mount lists to `user` (default root),
        sorted."""
        if user is None:
            return sorted(os.listdir(self.path("checkpoints")))
        return listdir_as(user, self.path("checkpoints"))

    def checkpoint(self, pid, options="", user=None):
        """`checkpoint OPTIONS` written to <pid>/ctl as `user` (default
        root): the write must succeed (else the error and the `last:` line
        say why) and exactly one checkpoint must appear: its id."""
        user = user or Root()
        before = set(self.ids())
        command = f"checkpoint {options}".strip()
        ok, err = user.write(self.path(str(pid), "ctl"), command)
        assert ok, f"{command} of pid {pid} as {user.name}: {err}; {self.last(pid)}"
        new = sorted(set(self.ids()) - before)
        assert len(new) == 1, f"{command} of pid {pid} added ids {new}"
        return new[0]

    def checkpoint_named(self, pid, name, user=None):
        """`checkpoint --name NAME` written to <pid>/ctl as `user` (default
        root): the write must succeed and `last:` must report it ok under
        that name. Returns the checkpoint's path, whose directory must
        exist; its id is the one `last:` gives (the engine may qualify a
        user's name)."""
        user = user or Root()
        command = f"checkpoint --name {name}"
        ok, err = user.write(self.path(str(pid), "ctl"), command)
        assert ok, f"{command} of pid {pid} as {user.name}: {err}; {self.last(pid)}"
        last = status_line(self.mnt, pid, "last")
        assert last.startswith("checkpoint ") and " ok " in last and name in last, last
        path = self.path("checkpoints", last.split()[1])
        assert os.path.isdir(path), f"{path} is not a directory after {last}"
        return path

    def last(self, pid):
        """The `last:` line of <pid>/status, or why it cannot be read (for
        messages)."""
        ok, text = Root().read(self.path(str(pid), "status"))
        if not ok:
            return f"{pid}/status: {text}"
        return next((line for line in text.splitlines() if line.startswith("last:")),
                    f"no last: line in {pid}/status")

    def try_restore(self, source, user=None, timeout=120):
        """Writes `source` into the restore file as `user` (default root),
        asserting nothing: (whether the write succeeded, its error in words,
        what the restore file then tells that user)."""
        user = user or Root()
        ok, err = user.write(self.path("restore"), source, timeout=timeout)
        said = user.read(self.path("restore"))[1].strip()
        return ok, err, said

    def restore(self, source, pid, user=None):
        """Restores from `source` through the restore file as `user`
        (default root); the process must come back with its pid, as the
        restore file tells that user (each reads their own last restore),
        followed, for a copy from outside the mount, by the checkpoint it
        was imported as. Returns that id, or None."""
        ok, err, said = self.try_restore(source, user)
        assert ok, f"restore of {source}: {err}; {said}"
        lines = said.splitlines()
        assert lines and lines[0] == f"pid {pid}", \
            f"restore of {source}: the restore file says {said!r}, expected 'pid {pid}'"
        inside = os.path.realpath(source).startswith(os.path.realpath(self.mnt) + os.sep)
        if inside:
            assert len(lines) == 1, f"restore of {source} from the mount imported: {said!r}"
            return None
        assert len(lines) == 2 and lines[1].startswith("imported: "), \
            f"restore of the copy {source}: the restore file says {said!r}"
        return lines[1][len("imported: "):]

    def assert_complete(self, ckpt_id, pid=None):
        """The checkpoint has a manifest with its id (and pid), a CRIU image
        set, and a logical size that covers its images."""
        ckpt = self.path("checkpoints", ckpt_id)
        manifest = json.loads(read(os.path.join(ckpt, "manifest.json")))
        assert manifest["id"] == ckpt_id, ("id", manifest["id"])
        images = os.path.join(ckpt, "images")
        names = os.listdir(images)
        for name in ("inventory.img", "pstree.img"):
            assert name in names, (name, "missing from", names)
        assert any(n.startswith("pages-") for n in names), ("no pages", names)
        size = sum(os.path.getsize(os.path.join(images, n)) for n in names)
        assert manifest["logical_bytes"] >= size, ("logical_bytes", manifest["logical_bytes"],
                                                   "images", size)
        if pid is not None:
            assert manifest["extra"]["pid"] == pid, ("extra.pid", manifest["extra"])

    def diagnostics(self):
        """What explains a failure: the status of each workload, the restore
        file, the daemon's log and the newest CRIU logs."""
        out = []

        def section(title, text):
            out.append(f"--- {title}\n{text.rstrip()}")

        if os.path.ismount(self.mnt):
            for w in self.workloads:
                status = self.path(str(w.pid), "status")
                if os.path.isfile(status):
                    section(status, Root().read(status)[1])
            section(self.path("restore"), Root().read(self.path("restore"))[1])
        for log in (self.log_path, os.path.join(self.state_dir, "gpuckptfs.log")):
            if os.path.isfile(log):
                section(f"last lines of {log}", "\n".join(read(log).splitlines()[-20:]))
        criu_logs = []
        for root, dirs, files in os.walk(self.work):
            # Not into the mount: its checkpoints are no logs of this run.
            dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(root, d))]
            for f in files:
                if f.endswith(".log") and ("dump" in f or "restore" in f or f.startswith("criu")):
                    full = os.path.join(root, f)
                    criu_logs.append((os.path.getmtime(full), full))
        for _, log in sorted(criu_logs, reverse=True)[:3]:
            section(f"last lines of {log}", "\n".join(read(log).splitlines()[-15:]))
        return "\n".join(out)

    def start(self, name, *args, user=None, env=None):
        """Starts a workload (in `env`, default this process's environment),
        waits for its directory to appear, keeps it to kill."""
        wl = Workload(self.work, name, *args, user=user, env=env)
        self.workloads.append(wl)
        wait_for(lambda: os.path.isdir(self.path(str(wl.pid))), 10,
                 f"{self.path(str(wl.pid))} to appear")
        return wl

    def close(self, keep=False):
        """Kills the workloads, unmounts and removes the work dir (`keep`:
        leaves it, to look into after a failure)."""
        for w in self.workloads:
            subprocess.run(["pkill", "-KILL", "-s", str(w.pid)], capture_output=True)
            kill_if_alive(w.pid)
        fusermount = shutil.which("fusermount3")
        # Also by the mount table: os.path.ismount says no to a mount whose
        # daemon was killed (stat fails there), which would be left behind.
        mounted = mounted_at(os.path.realpath(self.mnt)) or os.path.ismount(self.mnt)
        if mounted and (
                fusermount is None or subprocess.run([fusermount, "-u", self.mnt]).returncode != 0):
            subprocess.run(["umount", "-l", self.mnt])
        # The daemon closes its store after the unmount returns: removed
        # before, the store would come back as a stray directory.
        deadline = time.monotonic() + 10
        while self.daemon_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        if keep:
            print(f"work dir kept: {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)


def mount_in_cgroup(cgroup, monkeypatch, tmp_path, prefix, *options):
    """A Mount whose gpuckptfs starts in the cgroup directory `cgroup`, as
    a service manager starts a daemon: through a wrapper that joins it, then
    runs the real one (which forks into the background from there)."""
    wrapper = tmp_path / "gpuckptfs-in-cgroup"
    wrapper.write_text("#!/bin/sh\n"
                       f"echo $$ > '{cgroup}/cgroup.procs' || exit 1\n"
                       f"exec '{build.GPUCKPTFS}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(build, "GPUCKPTFS", str(wrapper))
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
        # Imported only here: the benchmarks use this module without pytest.
        import pytest  # pylint: disable=import-outside-toplevel
        os.rmdir(disk)
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", disk])
        shutil.rmtree(disk, ignore_errors=True)


def mounted_at(mnt):
    """Whether something is mounted on exactly `mnt` (by the mount table,
    without touching the mount point, which may hang or fail)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


def ctl(path, command):
    """Writes `command` and a newline into `path` in one write(2); OSError
    when it fails. (A buffered file would write again when closed after a
    failed write, and the command would run twice.)"""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, os.fsencode(command) + b"\n")
    finally:
        os.close(fd)


def status_line(mnt, pid, key):
    """The `key:` line of <pid>/status, without the key."""
    for line in read(os.path.join(mnt, str(pid), "status")).splitlines():
        if line.startswith(key + ":"):
            return line[len(key) + 1:].strip()
    raise AssertionError(f"no {key}: line in {pid}/status")


def listdir_as(user, path):
    """Sorted names of `path` as `user` lists them."""
    r = user.run([PYTHON, "-c", "import json, os, sys; print(json.dumps(os.listdir(sys.argv[1])))",
                  path])
    assert r.returncode == 0, r.stderr
    return sorted(json.loads(r.stdout))


# One filesystem call, made by whoever runs it: prints OK or the errno's
# name (ENOENT, EROFS, ...), so that a test states the exact errno a user
# gets without parsing the messages of coreutils.
PROBE = r"""
import errno, os, sys
op, args = sys.argv[1], sys.argv[2:]
calls = {
    "stat": lambda p: os.stat(p),
    "lstat": lambda p: os.lstat(p),
    "listdir": lambda p: os.listdir(p),
    "read": lambda p: open(p, "rb").read(),
    "unlink": os.unlink,
    "rmdir": os.rmdir,
    "mkdir": os.mkdir,
    "create": lambda p: os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)),
    "mknod": lambda p: os.mknod(p, 0o600),
    "rename": os.rename,
    "link": os.link,
    "symlink": os.symlink,
    "utime": lambda p: os.utime(p),
    "chmod": lambda p: os.chmod(p, 0o644),
    "chown": lambda p: os.chown(p, os.getuid(), os.getgid()),
    "truncate": lambda p: os.truncate(p, 0),
}
try:
    calls[op](*args)
    print("OK")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"""


def probe(op, *args, user=None):
    """The errno name (or OK) of one call, as root or as `user`."""
    argv = [PYTHON, "-c", PROBE, op, *args]
    r = user.run(argv) if user else subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def cli(store, *args, timeout=300):
    """The gpuckpt command line on `store`: its CompletedProcess, text
    output. Skips the test, saying why, where the CLI was not built."""
    if not os.access(build.GPUCKPT_CLI, os.X_OK):
        # Imported only here: the benchmarks use this module without pytest.
        import pytest  # pylint: disable=import-outside-toplevel
        pytest.skip(f"no gpuckpt CLI at {build.GPUCKPT_CLI}")
    return subprocess.run([build.GPUCKPT_CLI, "--store", store, *args],
                          capture_output=True, text=True, timeout=timeout)
