"""Processes in namespaces of their own, checkpointed through a real mount
(docs/gpuckptfs.md, "Containers"): a workload made the init of new mount,
pid, net, uts and ipc namespaces by `unshare` is checkpointed through
`<pid>/ctl` (the daemon's own FUSE mount, which the new mount namespace
copied, left out of the dump) and restored through `restore` into new
namespaces of the same kinds, with a new pid outside and pid 1 inside, its
host name and its memory intact.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_namespaces.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
directory of the workloads. Needs root, /dev/fuse, CRIU and unshare; the
tests are skipped, saying why, where one of them is missing.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile

import pytest

from gpuckpt_testing.build import WORKLOAD_BIN
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import ctl, status_line, why_not_runnable
from gpuckpt_testing.processes import kill_if_alive, wait_for
from gpuckpt_testing.users import Root

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))

NAMESPACES = ("mnt", "pid", "net", "uts", "ipc")
HOSTNAME = "gpuckpt-ns-test"


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def namespace_pids(pid):
    """NSpid of /proc/PID/status: the pid in each namespace, outermost first."""
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("NSpid:"):
            return [int(p) for p in line.split()[1:]]
    raise AssertionError(f"no NSpid: line for pid {pid}")


def namespace_ids(pid):
    return {ns: os.readlink(f"/proc/{pid}/ns/{ns}") for ns in NAMESPACES}


class NamespacedWorkload:
    """wl_memory as the init of new mount, pid, net, uts and ipc namespaces,
    its standard files opened inside them (CRIU cannot dump a descriptor
    of a mount the namespace does not have)."""

    def __init__(self, mount):
        self.dir = tempfile.mkdtemp(prefix="wl_ns-", dir=mount.work)
        self.result = os.path.join(self.dir, "result")
        binary = os.path.join(mount.work, "wl_memory")
        if not os.path.exists(binary):
            shutil.copy(os.path.join(WORKLOAD_BIN, "wl_memory"), binary)
        inner = f'hostname {HOSTNAME} && exec "$0" "$1" --mib 8 </dev/null >/dev/null 2>&1'
        self.unshare = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--net", "--uts",
             "--ipc", "--propagation", "private", "setsid", "sh", "-c", inner, binary,
             self.result],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        wait_for(lambda: os.path.exists(self.result + ".ready"), 60, "wl_memory to get ready")
        (self.pid,) = children(self.unshare.pid)

    def close(self):
        if self.unshare.poll() is None:
            self.unshare.kill()
        self.unshare.wait()


def verdict(pid, result):
    """The workload's own check of its memory (workload.h), asked by signal:
    pid 1 of a namespace takes SIGUSR1 from outside since it handles it."""
    os.kill(pid, signal.SIGUSR1)
    wait_for(lambda: os.path.exists(result), 60, "the workload's verdict")
    return read(result).strip()


def test_unshare_namespaces_checkpoint_and_restore_through_the_mount(mount):
    wl = NamespacedWorkload(mount)
    restored = None
    try:
        assert namespace_pids(wl.pid) == [wl.pid, 1]
        wait_for(lambda: os.path.isdir(mount.path(str(wl.pid))), 10, "its directory")
        # Its mount namespace holds a copy of the daemon's FUSE mount.
        assert any(line.split(" - ")[1].startswith("fuse.gpuckptfs ")
                   for line in read(f"/proc/{wl.pid}/mountinfo").splitlines())
        try:
            ctl(mount.path(str(wl.pid), "ctl"), "checkpoint --kill")
        except OSError as e:
            raise AssertionError(status_line(mount.mnt, wl.pid, "last")) from e
        wait_for(lambda: wl.unshare.poll() is not None, 10, "the namespace's init to go")
        ckpt = mount.path("checkpoints", f"{wl.pid}-1")
        manifest = json.loads(read(os.path.join(ckpt, "manifest.json")))
        assert manifest["extra"]["mount_namespace"] == {"root": "/"}

        # A root directory that is not there: refused before CRIU runs.
        with pytest.raises(OSError) as refused:
            ctl(mount.path("restore"), f"{ckpt} --root /nonexistent-gpuckpt-root")
        assert refused.value.errno == errno.ENOENT
        assert "/nonexistent-gpuckpt-root" in read(mount.path("restore"))

        try:
            ctl(mount.path("restore"), ckpt)
        except OSError as e:
            raise AssertionError(read(mount.path("restore"))) from e
        answer = read(mount.path("restore")).strip()
        assert answer.startswith("pid "), answer
        restored = int(answer.split()[1])
        assert restored != wl.pid
        assert namespace_pids(restored) == [restored, 1]
        ours, theirs = namespace_ids(os.getpid()), namespace_ids(restored)
        for ns in NAMESPACES:
            assert theirs[ns] != ours[ns], f"restored in this {ns} namespace"
        r = subprocess.run(["nsenter", "-t", str(restored), "--uts", "hostname"],
                           capture_output=True, text=True, check=True)
        assert r.stdout.strip() == HOSTNAME
        # The daemon's mount was left out: nothing of gpuckpt is mounted in
        # the new namespace.
        assert not any(" fuse.gpuckptfs " in line
                       for line in read(f"/proc/{restored}/mountinfo").splitlines())
        assert verdict(restored, wl.result) == "PASS"
    finally:
        if restored is not None:
            kill_if_alive(restored)
        wl.close()


def test_restore_root_is_roots_alone(mount, users):
    user = users[0]
    wl = mount.start("wl_memory", "--mib", "4", user=user)
    ok, err = user.write(mount.path(str(wl.pid), "ctl"), "checkpoint --kill")
    assert ok, err
    ckpt = mount.path("checkpoints", f"{wl.pid}-1")
    ok, err = user.write(mount.path("restore"), f"{ckpt} --root /")
    assert not ok
    ok, text = user.read(mount.path("restore"))
    assert ok and "--root is root's" in text, text
    # Without it, the same user's restore goes on as before.
    ok, err = user.write(mount.path("restore"), ckpt)
    assert ok, err
    assert wl.verdict() == "PASS"
    # Root's --root must be absolute, and names a directory that only a
    # CRIU running as root could mount: not for a checkpoint a user made.
    ok, err = Root().write(mount.path("restore"), f"{ckpt} --root relative/dir")
    assert not ok
    assert "is not absolute" in read(mount.path("restore"))
    wl.kill()
    ok, err = Root().write(mount.path("restore"), f"{ckpt} --root /")
    assert not ok and "Permission denied" in err, err
    assert "only a checkpoint root made" in read(mount.path("restore"))
