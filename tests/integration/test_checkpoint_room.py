"""Checkpoints that could not fit are refused before anything is frozen.

Through a real mount, with real limits:

- The store lies on a 128 MiB tmpfs and a process holds 256 MiB of memory:
  `echo checkpoint > <pid>/ctl` fails at once with ENOSPC, `last:` says how
  much the disk has and how much the checkpoint may add, nothing was
  written to the disk, no checkpoint appears, and the process runs on (not
  stopped, still making progress). A small process is checkpointed into the
  same store (the check is no blanket refusal), and once the filesystem is
  larger the big one is too; its next checkpoint, which the disk could not
  hold were it all new, is refused again, and goes ahead, adding next to
  nothing, with `checkpoint --no-space-check`.
- gpuckptfs runs in a memory cgroup limited to 200 MiB, with 1 GiB of
  staging memory: a checkpoint of a 256 MiB process, whose staging would
  not fit the daemon's cgroup, fails at once with ENOMEM and `last:` names
  the cgroup and its limit; the process runs on. A small process fits; once
  the limit is raised the big one is checkpointed too. The cgroup is made
  under the test's own memory cgroup (cgroup v1's memory hierarchy, or v2
  where the memory controller can be enabled for it) and removed after;
  where none can be made the test is skipped, saying why.

Run by ctest under wl_reaper, like the other pytest tests (gpuckpt_testing.mount).
Needs root, /dev/fuse and CRIU; skipped, saying why, where one is missing.
"""

import errno
import os
import re
import subprocess
import time

import pytest

from gpuckpt_testing import processes
from gpuckpt_testing.filetools import free_bytes, read, used_bytes
from gpuckpt_testing.mount import (Mount, ctl, mount_in_cgroup, small_tmpfs, status_line,
                                   why_not_runnable)
from gpuckpt_testing.processes import assert_runs_on, wait_for
from gpuckpt_testing.users import Root

MiB = 1 << 20
DISK_MIB = 128
BIG_MIB = 256
SMALL_MIB = 16
DAEMON_LIMIT_MIB = 200
# A refusal reads a few /proc and cgroup files: far below this. A
# checkpoint of the big process that went ahead would take seconds.
AT_ONCE_S = 3.0

pytestmark = pytest.mark.skipif(why_not_runnable("wl_memory") is not None,
                                reason=str(why_not_runnable("wl_memory")))


def refused(mnt, workload, expected_errno):
    """Writes `checkpoint` to the process's ctl in one write(2) (ctl()'s
    buffered file would write again when closed after a failure), which
    must fail with `expected_errno` within AT_ONCE_S; returns the `last:`
    line."""
    start = time.monotonic()
    ok, error = Root().write(f"{mnt}/{workload.pid}/ctl", "checkpoint")
    elapsed = time.monotonic() - start
    assert not ok, "the checkpoint should have been refused"
    assert error == os.strerror(expected_errno), error
    assert elapsed < AT_ONCE_S, f"the refusal took {elapsed:.1f} s: it was not refused at once"
    return status_line(mnt, workload.pid, "last")


def no_checkpoint_of(mnt, workload):
    assert not os.path.exists(os.path.join(mnt, "checkpoints", f"{workload.pid}-1"))
    assert os.listdir(os.path.join(mnt, str(workload.pid), "checkpoints")) == []


def metric(mnt, operation, result):
    pattern = (r'^gpuckpt_operations_total\{operation="%s",result="%s"\} (\d+)$'
               % (operation, result))
    match = re.search(pattern, read(os.path.join(mnt, "metrics")), re.M)
    return int(match.group(1)) if match else 0


# --- A store on a small filesystem -------------------------------------------------


@pytest.fixture
def small_disk():
    with small_tmpfs("gpuckpt-room-disk.", DISK_MIB) as disk:
        yield disk


def test_checkpoint_larger_than_the_store_disk_is_refused_before_freezing(small_disk):
    disk = small_disk
    m = Mount("gpuckpt-room-disk-test.", store=os.path.join(disk, "store"))
    try:
        mnt = m.mnt
        big = m.start("wl_memory", "--mib", str(BIG_MIB))
        free_before = free_bytes(disk)
        used_before = used_bytes(disk)
        assert free_before < BIG_MIB * MiB, "the disk must be smaller than the process's memory"

        last = refused(mnt, big, errno.ENOSPC)
        match = re.fullmatch(
            r"checkpoint failed: the store's disk has ([\d.]+) MB free and a checkpoint of "
            rf"process {big.pid} may add up to ([\d.]+) MB \(its memory and device memory, "
            r"counted as new\): free space, or rm -r some checkpoints and run gc", last)
        assert match, last
        said_free, said_worst = float(match.group(1)) * 1e6, float(match.group(2)) * 1e6
        # What it says is what the disk has, and at least the process's memory.
        assert abs(said_free - free_before) < 2 * MiB, (said_free, free_before)
        assert said_worst >= (BIG_MIB - BIG_MIB // 16) * MiB, said_worst
        # Nothing was written, nothing appears, the process runs on.
        assert abs(used_bytes(disk) - used_before) < MiB, "the refused checkpoint wrote to the disk"
        no_checkpoint_of(mnt, big)
        assert_runs_on(big)
        assert status_line(mnt, big.pid, "operation") == "idle"
        assert metric(mnt, "checkpoint", "no_space") == 1

        # A process that fits is checkpointed into the same store.
        small = m.start("wl_memory", "--mib", str(SMALL_MIB))
        ctl(f"{mnt}/{small.pid}/ctl", "checkpoint")
        assert os.path.isdir(os.path.join(mnt, "checkpoints", f"{small.pid}-1"))
        assert " ok " in status_line(mnt, small.pid, "last") + " "

        # With a larger filesystem the big one is too, nothing restarted,
        # and its state is intact.
        subprocess.run(["mount", "-o", f"remount,size={3 * DISK_MIB}m", disk], check=True)
        ctl(f"{mnt}/{big.pid}/ctl", "checkpoint")
        assert os.path.isdir(os.path.join(mnt, "checkpoints", f"{big.pid}-1"))
        assert " ok " in status_line(mnt, big.pid, "last") + " "
        assert_runs_on(big)

        # Its next checkpoint could, at worst, be all new again, which the
        # disk no longer holds: refused. With --no-space-check it goes
        # ahead and, the memory unchanged, adds next to nothing.
        assert free_bytes(disk) < (BIG_MIB - SMALL_MIB) * MiB
        refused(mnt, big, errno.ENOSPC)
        used_before = used_bytes(disk)
        ctl(f"{mnt}/{big.pid}/ctl", "checkpoint --no-space-check")
        assert os.path.isdir(os.path.join(mnt, "checkpoints", f"{big.pid}-2"))
        assert used_bytes(disk) - used_before < 16 * MiB
        assert_runs_on(big)
        assert big.verdict() == "PASS"
        assert small.verdict() == "PASS"
    finally:
        m.close()


# --- gpuckptfs in a memory cgroup ----------------------------------------------------


def memory_cgroup_of_self():
    """(version, directory of this process's memory cgroup), or a reason
    why there is none to make a child of."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3].split(",")
            point = fields[4].replace("\\040", " ")
            if fields[3] != "/":
                continue  # a mounted subtree: paths would not line up
            if fstype == "cgroup" and "memory" in options:
                mounts.setdefault("v1", point)
            elif fstype == "cgroup2":
                mounts.setdefault("v2", point)
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            ident, controllers, path = line.rstrip("\n").split(":", 2)
            if ident == "0" and controllers == "":
                paths["v2"] = path
            elif "memory" in controllers.split(","):
                paths["v1"] = path
    for version in ("v1", "v2"):
        if version in mounts and version in paths:
            if version == "v2" and not os.path.exists(
                    os.path.join(mounts["v2"], "cgroup.controllers")):
                continue
            return version, mounts[version] + paths[version].rstrip("/")
    return None, (f"no memory cgroup to make one under (mounts {mounts}, "
                  f"this process's cgroups {paths})")


@pytest.fixture
def daemon_cgroup():
    """A memory cgroup limited to DAEMON_LIMIT_MIB under this process's own,
    removed after the test; skips, saying why, where none can be made."""
    version, parent = memory_cgroup_of_self()
    if version is None:
        pytest.skip(parent)
    if version == "v2":
        with open(os.path.join(parent, "cgroup.controllers")) as f:
            if "memory" not in f.read().split():
                pytest.skip(f"cgroup v2: the memory controller is not available in {parent}")
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        except OSError as e:
            pytest.skip(f"cgroup v2: cannot enable the memory controller for the children of "
                        f"{parent} (a cgroup that holds processes may not have any): {e}")
    cgroup = os.path.join(parent, f"gpuckpt-room-{os.getpid()}")
    try:
        os.mkdir(cgroup)
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup under {parent}: {e}")
    limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"

    def set_limit(mib):
        with open(os.path.join(cgroup, limit_file), "w") as f:
            f.write(str(mib * MiB))

    try:
        try:
            set_limit(DAEMON_LIMIT_MIB)
        except OSError as e:
            pytest.skip(f"cannot set {limit_file} of {cgroup}: {e}")
        yield cgroup, set_limit
    finally:
        # The daemon leaves once unmounted; the cgroup can go once empty.
        def members():
            try:
                with open(os.path.join(cgroup, "cgroup.procs")) as f:
                    return [int(p) for p in f.read().split()]
            except OSError:
                return []

        try:
            wait_for(lambda: not members(), 30, f"the processes of {cgroup} to exit")
        finally:
            for pid in members():  # only the daemon this test started can be here
                processes.kill_if_alive(pid)
            wait_for(lambda: not members(), 10, f"{cgroup} to empty")
            os.rmdir(cgroup)


def test_staging_beyond_the_daemons_memory_cgroup_is_refused_before_freezing(
        daemon_cgroup, monkeypatch, tmp_path):
    cgroup, set_limit = daemon_cgroup
    m = mount_in_cgroup(cgroup, monkeypatch, tmp_path, "gpuckpt-room-cgroup-test.",
                                "--staging-memory", "1G")
    try:
        mnt = m.mnt
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            assert f.read().split(), "gpuckptfs should run in the test's cgroup"
        big = m.start("wl_memory", "--mib", str(BIG_MIB))

        last = refused(mnt, big, errno.ENOMEM)
        assert last.startswith("checkpoint failed: not enough memory in the memory cgroup "), last
        # Named as /proc/PID/cgroup names it: the path ends in our cgroup.
        match = re.fullmatch(
            r"checkpoint failed: not enough memory in the memory cgroup (\S+) for a checkpoint "
            rf"of process {big.pid}: it needs ([\d.]+) MB there \(([\d.]+) MB of staging for "
            r"gpuckptfs\) and its limit of ([\d.]+) MB leaves ([\d.]+) MB; lower "
            r"--staging-memory, or raise its limit", last)
        assert match, last
        cgroup_name, needed, staging, limit, left = match.groups()
        assert cgroup_name.endswith("/" + os.path.basename(cgroup)), cgroup_name
        assert float(limit) == round(DAEMON_LIMIT_MIB * MiB / 1e6, 1), limit
        assert float(needed) * 1e6 >= (BIG_MIB - BIG_MIB // 16) * MiB, needed
        assert staging == needed, "gpuckptfs's cgroup is charged the staging alone"
        assert float(left) < float(limit) and float(needed) > float(left), last
        no_checkpoint_of(mnt, big)
        assert_runs_on(big)
        assert metric(mnt, "checkpoint", "no_memory") == 1

        # A small process's staging fits the cgroup.
        small = m.start("wl_memory", "--mib", str(SMALL_MIB))
        ctl(f"{mnt}/{small.pid}/ctl", "checkpoint")
        assert " ok " in status_line(mnt, small.pid, "last") + " "

        # The limit is read at each checkpoint: raised, the big one fits.
        set_limit(4 * 1024)
        ctl(f"{mnt}/{big.pid}/ctl", "checkpoint")
        assert os.path.isdir(os.path.join(mnt, "checkpoints", f"{big.pid}-1"))
        assert " ok " in status_line(mnt, big.pid, "last") + " "
        assert_runs_on(big)
        assert big.verdict() == "PASS"
        assert small.verdict() == "PASS"
    finally:
        m.close()
