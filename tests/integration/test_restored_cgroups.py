"""Restored process trees live in cgroups of their own, not the daemon's.

CRIU is gpuckptfs's child, so what it restores would start in the daemon's
cgroups; systemd stops (or restarts) a service by killing every process of
its cgroup, and would kill the restored jobs with it. Through a real mount
and real CRIU, with gpuckptfs started in a cgroup of its own (as systemd
starts a service: in the v2 hierarchy where there is one, else in a v1
one):

- a process restored through the mount, by root and by an ordinary user,
  is in none of the daemon's cgroups: in every hierarchy its cgroup is
  <root>/gpuckpt/restore-<pid>-<n>, and it is not among the members of
  the daemon's cgroup;
- every process of the daemon's cgroup is killed (SIGKILL, what systemd's
  stop ends with): the daemon is gone, the restored processes run on and
  check their memory (PASS);
- a tree's cgroups are removed once it has exited, at the next restore.

Run by ctest under wl_reaper, like the other pytest tests (harness.py).
Needs root, /dev/fuse, CRIU and a writable cgroup hierarchy; skipped,
saying why, where one is missing.
"""

import os

import pytest

import harness
from harness import Mount, Root, ctl, read, wait_for, why_not_runnable

pytestmark = pytest.mark.skipif(why_not_runnable("wl_memory") is not None,
                                reason=str(why_not_runnable("wl_memory")))


def cgroups_of(pid):
    """{hierarchy: path} of /proc/PID/cgroup ("0::/a" gives {"0": "/a"}),
    the hierarchy named by its number."""
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            number, _controllers, path = line.rstrip("\n").split(":", 2)
            out[number] = path
    return out


def cgroup_mounts():
    """[(fstype, mount point, super options)] of the cgroup hierarchies'
    roots mounted read-write."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, after = line.split(" - ")
            fields, (fstype, super_options) = before.split(), after.split()[0::2]
            if fstype in ("cgroup", "cgroup2") and fields[3] == "/" and \
                    fields[5].split(",")[0] == "rw":
                out.append((fstype, fields[4], super_options))
    return out


def cgroup_dir(fstype, mountpoint, super_options, pid):
    """The directory of PID's cgroup in that hierarchy."""
    for line in read(f"/proc/{pid}/cgroup").splitlines():
        number, controllers, path = line.split(":", 2)
        if fstype == "cgroup2" and number == "0":
            return mountpoint + path
        names = set(controllers.split(",")) if controllers else set()
        if fstype == "cgroup" and names and names <= set(super_options.split(",")):
            return mountpoint + path
    return None


def members(cgroup):
    with open(os.path.join(cgroup, "cgroup.procs")) as f:
        return [int(p) for p in f.read().split()]


@pytest.fixture
def daemon_cgroup():
    """A cgroup for gpuckptfs, as systemd makes one for a service, under
    this process's own: in the v2 hierarchy where one is mounted, else in
    the first v1 one. Removed after the test, once its processes are gone."""
    mounts = cgroup_mounts()
    if not mounts:
        pytest.skip("no cgroup hierarchy is mounted read-write here")
    fstype, mountpoint, super_options = sorted(mounts, key=lambda m: m[0] != "cgroup2")[0]
    parent = cgroup_dir(fstype, mountpoint, super_options, os.getpid())
    if parent is None:
        pytest.skip(f"this process is in no cgroup of {mountpoint}")
    cgroup = os.path.join(parent, f"gpuckptfs-daemon-{os.getpid()}")
    try:
        os.mkdir(cgroup)
    except OSError as e:
        pytest.skip(f"cannot create a cgroup under {parent}: {e}")
    if os.path.exists(os.path.join(cgroup, "cpuset.cpus")):
        for name in ("cpuset.cpus", "cpuset.mems"):
            with open(os.path.join(cgroup, name), "w") as f:
                f.write(read(os.path.join(parent, name)))
    try:
        yield cgroup
    finally:
        for pid in members(cgroup):
            harness.kill_if_alive(pid)
        wait_for(lambda: not members(cgroup), 30, f"the processes of {cgroup} to exit")

        def removed():  # EBUSY until the last one is reaped
            try:
                os.rmdir(cgroup)
                return True
            except OSError:
                return False
        wait_for(removed, 10, f"{cgroup} to be removed")


def daemon_in(cgroup, monkeypatch, tmp_path):
    """gpuckptfs started in `cgroup`, as systemd starts a service."""
    return harness.mount_in_cgroup(cgroup, monkeypatch, tmp_path, "gpuckpt-cgroups-test.")


def restored_cgroup_dirs(pid):
    """The directories of PID's cgroups in every placeable hierarchy."""
    return [cgroup_dir(*m, pid) for m in cgroup_mounts()]


def test_restored_trees_survive_the_daemons_cgroup_being_killed(daemon_cgroup, users,
                                                                monkeypatch, tmp_path):
    m = daemon_in(daemon_cgroup, monkeypatch, tmp_path)
    try:
        daemons = members(daemon_cgroup)
        assert daemons, "gpuckptfs should run in its cgroup"
        daemon = daemons[0]
        daemon_cgroups = cgroups_of(daemon)

        restored = []
        for who in (Root(), users[0]):
            wl = m.start("wl_memory", "--mib", "16", user=None if who.uid == 0 else who)
            restore = m.path("restore")
            assert who.write(m.path(str(wl.pid), "ctl"), "checkpoint --kill") == (True, "")
            wait_for(lambda: not wl.alive(), 10, "the process to be killed")
            assert who.write(restore, m.path("checkpoints", f"{wl.pid}-1")) == (True, "")
            assert who.read(restore) == (True, f"pid {wl.pid}\n")
            restored.append(wl)

        for wl in restored:
            # In no cgroup of the daemon's, in any hierarchy.
            theirs = cgroups_of(wl.pid)
            assert theirs.keys() == daemon_cgroups.keys()
            for hierarchy, path in theirs.items():
                assert path != daemon_cgroups[hierarchy], (hierarchy, path)
                assert f"/gpuckpt/restore-{wl.pid}-" in path, (hierarchy, path)
            assert wl.pid not in members(daemon_cgroup)
        places = [d for wl in restored for d in restored_cgroup_dirs(wl.pid)]
        assert all(d and os.path.isdir(d) for d in places), places

        # What systemd's stop ends with: SIGKILL to every process of the
        # service's cgroup, until it is empty.
        def kill_all():
            for pid in members(daemon_cgroup):
                harness.kill_if_alive(pid)
            return not members(daemon_cgroup)
        wait_for(kill_all, 30, f"every process of {daemon_cgroup} to be killed")
        # Gone, once the subreaper has reaped it.
        wait_for(lambda: not os.path.exists(f"/proc/{daemon}"), 10, "the daemon to be reaped")

        for wl in restored:
            assert wl.alive()
            assert wl.verdict() == "PASS"

        # The workloads exit once they have said PASS: their cgroups go at
        # the next restore.
        for wl in restored:
            wl.kill()
    finally:
        m.close()
    # A new daemon (the old one's mount is gone) restores once more.
    m2 = Mount("gpuckpt-cgroups-test.")
    try:
        wl = m2.start("wl_memory", "--mib", "4")
        ctl(m2.path(str(wl.pid), "ctl"), "checkpoint --kill")
        wait_for(lambda: not wl.alive(), 10, "the process to be killed")
        m2.restore(m2.path("checkpoints", f"{wl.pid}-1"), wl.pid)
        assert not any(os.path.exists(d) for d in places), places
        mine = restored_cgroup_dirs(wl.pid)
        wl.kill()
    finally:
        m2.close()
    # Not left behind by the test: empty once the tree is gone.
    for d in mine:
        wait_for(lambda d=d: not os.path.exists(d) or not members(d), 10, f"{d} to empty")
        if os.path.exists(d):
            os.rmdir(d)

