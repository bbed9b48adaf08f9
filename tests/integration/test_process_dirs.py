"""<pid>/ of processes that use no GPU, on a mount without --all-processes
(the daemon's default): a process is shown once its owner or root names it
and stays absent to everyone else; root is told ESRCH for a pid that is no
process; a restored tree is listed under its pid, so that its next
checkpoint needs no `track`; a restore of a copy says which checkpoint it
imported, and that checkpoint is marked as a restore's.

Run by ctest under wl_reaper; needs root, /dev/fuse and CRIU (skipped,
saying why, where one is missing)."""

import json
import os

import pytest

from gpuckpt_testing.mount import Mount, cli, listdir_as, probe, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.workloads import Workload

pytestmark = pytest.mark.skipif(why_not_runnable("wl_memory") is not None,
                                reason=str(why_not_runnable("wl_memory")))


@pytest.fixture
def mount(request):
    """gpuckptfs showing GPU, tracked and named processes only."""
    m = Mount("gpuckpt-process-dirs.", all_processes=False)
    try:
        yield m
    finally:
        m.close(keep=getattr(request.node, "gpuckpt_failed", False)
                and bool(os.environ.get("KEEP_WORK")))


def free_pid():
    """A pid that no process has (the highest one, or below it)."""
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) - 1
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_a_process_is_shown_once_its_owner_names_it_and_to_no_one_else(mount, users):
    a, b = users
    # Started by hand: Mount.start() would name it as root.
    wl = Workload(mount.work, "wl_memory", user=a)
    mount.workloads.append(wl)
    name = str(wl.pid)
    assert name not in listdir_as(a, mount.mnt), "shown before anyone named it"
    # Another user naming it learns nothing, and shows it to no one.
    assert probe("stat", mount.path(name), user=b) == "ENOENT"
    assert probe("stat", mount.path(name, "ctl"), user=b) == "ENOENT"
    assert name not in listdir_as(a, mount.mnt), "another user's lookup showed it"
    # Its owner naming it gets it, and it is listed from then on (to them).
    assert probe("stat", mount.path(name), user=a) == "OK"
    assert name in listdir_as(a, mount.mnt)
    assert name not in listdir_as(b, mount.mnt)
    assert probe("stat", mount.path(name), user=b) == "ENOENT"
    # And its checkpoint needs nothing more.
    made = mount.checkpoint(wl.pid, user=a)
    assert made in mount.ids(a)
    wl.assert_passes("after its checkpoint")


def test_root_is_told_there_is_no_such_process(mount, users):
    a, _ = users
    pid = free_pid()
    assert probe("stat", mount.path(str(pid))) == "ESRCH"
    # An ordinary user is told as little as for another user's process.
    assert probe("stat", mount.path(str(pid)), user=a) == "ENOENT"
    # A kernel thread is no process to checkpoint: absent, even to root.
    assert probe("stat", mount.path("2")) == "ENOENT"


def test_a_restored_tree_is_listed_and_a_copys_import_says_what_it_is(mount, users):
    a, _ = users
    wl = mount.start("wl_memory", user=a)
    made = mount.checkpoint(wl.pid, "--kill", user=a)
    wait_for(wl.gone, 30, f"pid {wl.pid} to end after checkpoint --kill")
    copy = os.path.join(wl.dir, "copy")
    r = a.run(["cp", "-r", mount.path("checkpoints", made), copy], timeout=300)
    assert r.returncode == 0, r.stderr
    ok, err, said = mount.try_restore(copy, user=a)
    assert ok, f"restore of {copy}: {err}; {said}"
    lines = said.splitlines()
    assert lines[0] == f"pid {wl.pid}", said
    assert len(lines) == 2 and lines[1].startswith("imported: "), said
    imported = lines[1][len("imported: "):]
    assert imported != made and imported in mount.ids(a), (imported, mount.ids(a))
    # Listed without anyone naming it, and checkpointed without `track`.
    assert str(wl.pid) in listdir_as(a, mount.mnt)
    again = mount.checkpoint(wl.pid, user=a)
    assert again not in (made, imported)
    # The import is marked as a restore's, in its manifest and in listings.
    ok, text = a.read(mount.path("checkpoints", imported, "manifest.json"))
    assert ok, text
    extra = json.loads(text)["extra"]
    assert extra.get("imported_by_restore") is True, extra
    assert extra.get("imported_from") == copy, extra
    ok, text = a.read(mount.path("checkpoints", made, "manifest.json"))
    assert "imported_by_restore" not in json.loads(text)["extra"]
    listed = {s["id"]: s for s in json.loads(cli(mount.store, "ls", "--json").stdout)}
    assert listed[imported]["source"] == f"restore of {copy}", listed[imported]
    assert not listed[made]["source"].startswith("restore of"), listed[made]
    wl.assert_passes("after the restore from its copy")
    # A restore from the mount imports nothing, and says no more.
    wait_for(wl.gone, 30, f"pid {wl.pid} to end after its verdict")
    ok, err, said = mount.try_restore(mount.path("checkpoints", again), user=a)
    assert ok, f"restore of {again}: {err}; {said}"
    assert said == f"pid {wl.pid}", said
