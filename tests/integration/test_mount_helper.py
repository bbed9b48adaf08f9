"""gpuckptfs as mount(8) runs it, for fstab lines and systemd .mount units.

mount(8) runs mount.fuse3 (Debian's fuse3), which runs
`gpuckptfs STORE MOUNTPOINT -o OPTIONS`. Through the real tools:

- `mount -t fuse GPUCKPTFS#STORE MNT -o ...` (mount(8) runs its helpers
  with a PATH of its own, which the built gpuckptfs is not on; the
  `PROGRAM#SOURCE` form names it, and mount.fuse3 runs it exactly as for
  `-t fuse.gpuckptfs`) of a fresh store with gpuckptfs's own options and
  the generic ones fstab lines and systemd pass: the mount serves (its
  README reads, a process is checkpointed and restored through it, PASS),
  the options took effect (all_processes lists a process without a GPU,
  staging_memory is in the manifest, work_dir holds the work), and
  `umount` ends it and the daemon exits;
- `mount.fuse3 STORE MNT -t fuse.gpuckptfs -o ...` finds gpuckptfs on PATH;
- a bad option (unknown, ro, a missing mount point) fails at once with one
  line on stderr saying which, mounts nothing and leaves no store; the
  command line form without -o works as before.

Run by ctest under wl_reaper, like the other pytest tests (gpuckpt_testing.mount).
Needs root, /dev/fuse, CRIU and mount.fuse3; skipped, saying why, where
one is missing.
"""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from gpuckpt_testing import build, processes
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import ctl, mounted_at, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.workloads import Workload

MOUNT_FUSE3 = shutil.which("mount.fuse3") or "/sbin/mount.fuse3"

pytestmark = [
    pytest.mark.skipif(why_not_runnable("wl_memory") is not None,
                       reason=str(why_not_runnable("wl_memory"))),
    pytest.mark.skipif(not os.path.exists(MOUNT_FUSE3),
                       reason="no mount.fuse3 (Debian package fuse3)"),
]

# What an fstab line or a .mount unit passes besides gpuckptfs's own options.
GENERIC = "rw,nosuid,nodev,noauto,_netdev,nofail,x-systemd.automount,comment=x"



def daemons_of(mnt):
    """Pids of gpuckptfs processes serving `mnt` (by their arguments)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"gpuckptfs" and os.fsencode(mnt) in argv:
            out.append(int(pid))
    return out


@pytest.fixture
def place():
    """A fresh directory with mnt/ in it; anything left mounted there is
    unmounted afterwards."""
    work = tempfile.mkdtemp(prefix="gpuckpt-mount-helper.", dir="/var/tmp")
    os.chmod(work, 0o755)
    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)
    try:
        yield work, mnt
    finally:
        if mounted_at(mnt):
            subprocess.run(["umount", "-l", mnt])
        shutil.rmtree(work, ignore_errors=True)


def test_mount_with_options_serves_and_umount_ends_it(place):
    work, mnt = place
    store, work_dir = os.path.join(work, "store"), os.path.join(work, "run")
    r = subprocess.run(
        ["mount", "-t", "fuse", f"{build.GPUCKPTFS}#{store}", mnt, "-o",
         f"{GENERIC},all_processes,staging_memory=32M,lock_timeout=20000,"
         f"work_dir={work_dir},quota=1G"],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert mounted_at(mnt)
    daemons = daemons_of(mnt)
    assert len(daemons) == 1, daemons

    assert read(os.path.join(mnt, "README")).strip()
    # all_processes: a process without a GPU is listed.
    wl = Workload(work, "wl_memory", "--mib", "16")
    try:
        wait_for(lambda: os.path.isdir(os.path.join(mnt, str(wl.pid))), 10,
                 f"{wl.pid} to appear in the mount")
        ctl(os.path.join(mnt, str(wl.pid), "ctl"), "checkpoint --kill")
        wait_for(lambda: not wl.alive(), 10, "the process to be killed")
        checkpoint = os.path.join(mnt, "checkpoints", f"{wl.pid}-1")
        extra = json.loads(read(os.path.join(checkpoint, "manifest.json")))["extra"]
        assert extra["staging_memory_bytes"] == 32 << 20
        # work_dir: CRIU's work is there (the engine's empty plugin dir).
        assert os.path.isdir(os.path.join(work_dir, "no-plugins"))
        ctl(os.path.join(mnt, "restore"), checkpoint)
        assert read(os.path.join(mnt, "restore")).strip() == f"pid {wl.pid}"
        assert wl.verdict() == "PASS"
    finally:
        processes.kill_if_alive(wl.pid)

    r = subprocess.run(["umount", mnt], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not mounted_at(mnt)
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in daemons), 30,
             "the daemon to exit after umount")


def test_mount_fuse3_finds_gpuckptfs_by_type(place):
    work, mnt = place
    store = os.path.join(work, "store")
    env = dict(os.environ, PATH=os.path.dirname(build.GPUCKPTFS) + ":" + os.environ["PATH"])
    r = subprocess.run([MOUNT_FUSE3, store, mnt, "-t", "fuse.gpuckptfs", "-o",
                        f"{GENERIC},no_gpu,work_dir={os.path.join(work, 'run')}"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert mounted_at(mnt)
    assert "checkpoints" in os.listdir(mnt)
    daemons = daemons_of(mnt)
    assert subprocess.run(["umount", mnt], timeout=60).returncode == 0
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in daemons), 30,
             "the daemon to exit after umount")


@pytest.mark.parametrize("options, says", [
    ("all_processes,bogus_option=3", "unknown mount option bogus_option"),
    ("ro", "cannot be read-only"),
    ("store=/elsewhere", "unknown mount option store"),
    ("lock_timeout=0", "lock-timeout"),
    ("lock_timeout", "lock-timeout"),
])
def test_bad_mount_option_fails_cleanly(place, options, says):
    work, mnt = place
    store = os.path.join(work, "store")
    # As mount(8) runs it, and gpuckptfs alone.
    for command in (["mount", "-t", "fuse", f"{build.GPUCKPTFS}#{store}", mnt, "-o", options],
                    [build.GPUCKPTFS, store, mnt, "-o", options]):
        r = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert says in r.stderr, r.stderr
        assert not mounted_at(mnt)
        assert not os.path.exists(store), "nothing is made for a refused mount"
    r = subprocess.run([build.GPUCKPTFS, store, mnt, "-o", options], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_mount_form_needs_store_and_mountpoint(place):
    work, mnt = place
    r = subprocess.run([build.GPUCKPTFS, mnt, "-o", "all_processes"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("gpuckptfs: with -o, give the store and the mount point: "
                                "gpuckptfs STORE MOUNTPOINT -o OPTIONS"), r.stderr
    assert not mounted_at(mnt)
