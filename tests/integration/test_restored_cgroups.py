"""Restored process trees live in cgroups below the restorer's own, not
the daemon's.

CRIU is gpuckptfs's child, so what it restores would start in the daemon's
cgroups; systemd stops (or restarts) a service by killing every process of
its cgroup, and would kill the restored jobs with it. Placed beside the
daemon's instead, a tree would escape the limits (memory, tasks, CPU) of
whoever restored it. Through a real mount and real CRIU:

- with gpuckptfs started in a cgroup of its own (as systemd starts a
  service: in the v2 hierarchy where there is one, else in a v1 one), a
  process restored through the mount, by root and by an ordinary user, is
  in none of the daemon's cgroups: in every hierarchy its cgroup is
  <the writer's cgroup>/gpuckpt-restore-<pid>-<n>, and it is not among the
  members of the daemon's cgroup;
- every process of the daemon's cgroup is killed (SIGKILL, what systemd's
  stop ends with): the daemon is gone, the restored processes run on and
  check their memory (PASS);
- a tree's cgroups are removed once it has exited, at the next restore;
- a restore written by a process confined to a cgroup limited to 64 MiB of
  memory and 5 tasks (v1 memory and pids, and v2's where its controllers
  can be used), by root and by an ordinary user, comes back in a cgroup
  below that one in every hierarchy, under its memory limit; a tree of 9
  tasks is not restored there at all (the task limit stops it), and is
  once the limit allows it;
- with `restore PATH --join-cgroup` the tree is in the writer's own cgroup
  in every hierarchy instead, and no cgroup is made for it.

Run by ctest under wl_reaper, like the other pytest tests (gpuckpt_testing.mount).
Needs root, /dev/fuse, CRIU and a writable cgroup hierarchy; skipped,
saying why, where one is missing.
"""

import os
import shlex

import pytest

from gpuckpt_testing import processes
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, ctl, mount_in_cgroup, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.users import Root, User

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
            processes.kill_if_alive(pid)
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
    return mount_in_cgroup(cgroup, monkeypatch, tmp_path, "gpuckpt-cgroups-test.")


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
        writers = cgroups_of(os.getpid())

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
                # Below the writer's (this process's child: its cgroups).
                parent, name = path.rsplit("/", 1)
                assert (parent or "/") == writers[hierarchy], (hierarchy, path)
                assert name.startswith(f"gpuckpt-restore-{wl.pid}-"), (hierarchy, path)
            assert wl.pid not in members(daemon_cgroup)
        places = [d for wl in restored for d in restored_cgroup_dirs(wl.pid)]
        assert all(d and os.path.isdir(d) for d in places), places

        # What systemd's stop ends with: SIGKILL to every process of the
        # service's cgroup, until it is empty.
        def kill_all():
            for pid in members(daemon_cgroup):
                processes.kill_if_alive(pid)
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


# The limits of the restorer's cgroup in the tests below.
MEMORY_LIMIT = 64 << 20
TASK_LIMIT = 5


def limit_files(cgroup):
    """{file: value} of the memory and task limits that `cgroup` offers
    (v1's memory and pids hierarchies; v2 where its parent enables those
    controllers for it)."""
    wanted = {"memory.limit_in_bytes": MEMORY_LIMIT, "memory.max": MEMORY_LIMIT,
              "pids.max": TASK_LIMIT}
    return {name: value for name, value in wanted.items()
            if os.path.exists(os.path.join(cgroup, name))}


def cgroup_tree(cgroup):
    """`cgroup` and every cgroup below it, deepest first."""
    return [root for root, _, _ in os.walk(cgroup, topdown=False)]


def remove_cgroup_tree(cgroup):
    """Kills every process of `cgroup` and below, then removes them all."""
    def empty():
        for d in cgroup_tree(cgroup):
            for pid in members(d):
                processes.kill_if_alive(pid)
        return not any(members(d) for d in cgroup_tree(cgroup))
    wait_for(empty, 30, f"the processes of {cgroup} to exit")

    def removed():  # EBUSY until the last one is reaped
        for d in cgroup_tree(cgroup):
            try:
                os.rmdir(d)
            except OSError:
                return False
        return True
    wait_for(removed, 10, f"{cgroup} to be removed")


@pytest.fixture
def limited():
    """A cgroup below this process's own in every writable hierarchy (as a
    batch system makes one for a job), limited to MEMORY_LIMIT of memory and
    TASK_LIMIT tasks wherever the controllers are: {mount point: its
    directory}. Removed after the test, with everything below it."""
    mounts = cgroup_mounts()
    if not mounts:
        pytest.skip("no cgroup hierarchy is mounted read-write here")
    dirs = {}
    try:
        seen = set()
        for fstype, mountpoint, super_options in mounts:
            if (fstype, super_options) in seen:  # one hierarchy mounted twice
                continue
            seen.add((fstype, super_options))
            parent = cgroup_dir(fstype, mountpoint, super_options, os.getpid())
            if parent is None:
                pytest.skip(f"this process is in no cgroup of {mountpoint}")
            cgroup = os.path.join(parent, f"gpuckpt-test-limited-{os.getpid()}")
            os.mkdir(cgroup)
            dirs[mountpoint] = cgroup
            if os.path.exists(os.path.join(cgroup, "cpuset.cpus")):
                for name in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(cgroup, name), "w") as f:
                        f.write(read(os.path.join(parent, name)))
            for name, value in limit_files(cgroup).items():
                with open(os.path.join(cgroup, name), "w") as f:
                    f.write(str(value))
        limits = {name for d in dirs.values() for name in limit_files(d)}
        if not limits & {"memory.limit_in_bytes", "memory.max"} or "pids.max" not in limits:
            pytest.skip(f"no memory and pids controllers to limit a cgroup with here "
                        f"(only {sorted(limits)})")
        yield dirs
    finally:
        for cgroup in dirs.values():
            remove_cgroup_tree(cgroup)


class Confined(User):
    """`who` (root or a User), with every command run in `cgroups` (the
    directories of one cgroup per hierarchy), joined as root before `who`'s
    credentials are taken: a writer confined as a job is."""

    def __init__(self, who, cgroups):  # pylint: disable=super-init-not-called
        self.who = who
        self.name, self.uid, self.gid = who.name, who.uid, who.gid
        self.cgroups = list(cgroups)

    def prefix(self):
        joins = "".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))}; "
                        for d in self.cgroups)
        return ["sh", "-c", "set -e; " + joins + 'exec "$@"', "sh"] + self.who.prefix()


def assert_below(pid, limited_dirs):
    """PID's cgroup in every hierarchy of `limited_dirs` is a
    gpuckpt-restore-<pid>-<n> right below the limited one."""
    for fstype, mountpoint, super_options in cgroup_mounts():
        if mountpoint not in limited_dirs:
            continue
        theirs = cgroup_dir(fstype, mountpoint, super_options, pid)
        parent, name = os.path.split(theirs)
        assert parent == limited_dirs[mountpoint], (mountpoint, theirs)
        assert name.startswith(f"gpuckpt-restore-{pid}-"), (mountpoint, theirs)


def memory_limit_of(pid, limited_dirs):
    """The memory limit that applies to PID's memory cgroup, the least of it
    and its ancestors' (v1's memory.stat says it: hierarchical_memory_limit;
    v2: the least memory.max up to the limited cgroup); None if none seen."""
    least = None
    for fstype, mountpoint, super_options in cgroup_mounts():
        if mountpoint not in limited_dirs:
            continue
        d = cgroup_dir(fstype, mountpoint, super_options, pid)
        if os.path.exists(os.path.join(d, "memory.stat")) and fstype == "cgroup":
            for line in read(os.path.join(d, "memory.stat")).splitlines():
                key, value = line.split()
                if key == "hierarchical_memory_limit":
                    least = min(least or int(value), int(value))
        while fstype == "cgroup2" and d.startswith(limited_dirs[mountpoint]):
            if os.path.exists(os.path.join(d, "memory.max")):
                value = read(os.path.join(d, "memory.max")).strip()
                if value != "max":
                    least = min(least or int(value), int(value))
            d = os.path.dirname(d)
    return least


def test_a_restore_stays_within_the_writers_limits(limited, mount, users):
    for who in (Root(), users[0]):
        wl = mount.start("wl_memory", "--mib", "16", user=None if who.uid == 0 else who)
        assert who.write(mount.path(str(wl.pid), "ctl"), "checkpoint --kill") == (True, "")
        wait_for(lambda wl=wl: not wl.alive(), 10, "the process to be killed")
        writer = Confined(who, limited.values())
        ok, err, said = mount.try_restore(mount.path("checkpoints", f"{wl.pid}-1"), writer)
        assert (ok, said) == (True, f"pid {wl.pid}"), (who.name, err, said)
        assert_below(wl.pid, limited)
        assert memory_limit_of(wl.pid, limited) == MEMORY_LIMIT, who.name
        assert wl.verdict() == "PASS", who.name


def test_join_cgroup_puts_the_tree_in_the_writers_own_cgroups(limited, mount, users):
    a = users[0]
    wl = mount.start("wl_memory", "--mib", "16", user=a)
    assert a.write(mount.path(str(wl.pid), "ctl"), "checkpoint --kill") == (True, "")
    wait_for(lambda: not wl.alive(), 10, "the process to be killed")
    writer = Confined(a, limited.values())
    ok, err, said = mount.try_restore(
        mount.path("checkpoints", f"{wl.pid}-1") + " --join-cgroup", writer)
    assert (ok, said) == (True, f"pid {wl.pid}"), (err, said)
    # In every hierarchy the writer's own cgroup, as a batch scheduler's job
    # finds its processes there; no cgroup was made for it.
    for fstype, mountpoint, super_options in cgroup_mounts():
        if mountpoint in limited:
            assert cgroup_dir(fstype, mountpoint, super_options, wl.pid) == limited[mountpoint]
            assert not [n for n in os.listdir(limited[mountpoint])
                        if n.startswith("gpuckpt-restore-")], limited[mountpoint]
    assert memory_limit_of(wl.pid, limited) == MEMORY_LIMIT
    assert wl.verdict() == "PASS"


def test_a_tree_over_the_writers_task_limit_is_not_restored(limited, mount):
    wl = mount.start("wl_threads")  # nine tasks: TASK_LIMIT is five
    ctl(mount.path(str(wl.pid), "ctl"), "checkpoint --kill")
    wait_for(lambda: not wl.alive(), 10, "the process to be killed")
    writer = Confined(Root(), limited.values())
    ok, err, said = mount.try_restore(mount.path("checkpoints", f"{wl.pid}-1"), writer)
    assert not ok and said.startswith("error: "), (err, said)
    wait_for(lambda: not wl.alive(), 10, "what was restored to be gone")

    # The same tree is restored there once the limit allows it: the limit,
    # nothing else, stopped it.
    for cgroup in limited.values():
        if os.path.exists(os.path.join(cgroup, "pids.max")):
            with open(os.path.join(cgroup, "pids.max"), "w") as f:
                f.write("64")
    mount.restore(mount.path("checkpoints", f"{wl.pid}-1"), wl.pid, writer)
    assert_below(wl.pid, limited)
    assert wl.verdict() == "PASS"
