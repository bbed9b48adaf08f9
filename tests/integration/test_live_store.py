"""The store command beside a running gpuckptfs (README.md, "The store
from the command line"): `gpuckpt ls`, `stats`, `export` and `fsck` read the store while
the daemon holds it, see what it committed and change nothing; `rm`, `gc`
and `import` are still refused, naming the daemon and saying how to do
the same through its mount; an ordinary user's `ls` and `stats` show
their own checkpoints, as the mount does, and root's `ls` names owners.

Run by ctest under wl_reaper:
    wl_reaper python3 -m pytest tests/integration/test_live_store.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory. Needs root, /dev/fuse and CRIU; skipped, saying why, where
one of them is missing.
"""

import json
import os
import tempfile

import pytest

from gpuckpt_testing import build
from gpuckpt_testing.filetools import read, tree_differences
from gpuckpt_testing.mount import cli, ctl, why_not_runnable
from gpuckpt_testing.processes import wait_for

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))


def test_read_commands_work_beside_the_daemon_and_writes_are_refused(mount):
    wl = mount.start("wl_memory", "--mib", "16")
    ctl(mount.path(str(wl.pid), "ctl"), "checkpoint")
    ckpt_id = f"{wl.pid}-1"
    wait_for(lambda: os.path.isdir(mount.path("checkpoints", ckpt_id)), 10, "the checkpoint")
    daemon_pid = read(os.path.join(mount.store, "LOCK.gpuckpt")).strip()

    r = cli(mount.store, "ls", "--json")
    assert r.returncode == 0, r.stderr
    listed = {s["id"]: s for s in json.loads(r.stdout)}
    assert ckpt_id in listed
    manifest = json.loads(read(mount.path("checkpoints", ckpt_id, "manifest.json")))
    assert listed[ckpt_id]["logical_bytes"] == manifest["logical_bytes"]

    r = cli(mount.store, "stats", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["snapshot_count"] == 1

    r = cli(mount.store, "fsck")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "clean" in r.stderr

    # The export holds the same bytes as the mount shows.
    out = tempfile.mkdtemp(prefix="gpuckpt-live-export.", dir=mount.work)
    dest = os.path.join(out, "copy")
    r = cli(mount.store, "export", ckpt_id, dest)
    assert r.returncode == 0, r.stderr
    assert tree_differences(os.path.join(dest, "images"),
                            mount.path("checkpoints", ckpt_id, "images")) == []

    # What would change the store is still the daemon's alone; the refusal
    # says how to do it through the daemon's mount, in words (no internal
    # status names).
    through = {"rm": f"rm -r {mount.mnt}/checkpoints/{ckpt_id}",
               "gc": f"echo gc > {mount.mnt}/ctl",
               "import": f"echo 'import {out}' > {mount.mnt}/ctl"}
    for args in (["rm", ckpt_id], ["gc"], ["import", out, "--name", "x"]):
        r = cli(mount.store, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert f"in use by process {daemon_pid}" in r.stderr, (args, r.stderr)
        assert through[args[0]] in r.stderr, (args, r.stderr)
        assert "Busy:" not in r.stderr, (args, r.stderr)

    # The daemon went on serving: a second checkpoint, then the reader sees it.
    ctl(mount.path(str(wl.pid), "ctl"), "checkpoint")
    r = cli(mount.store, "ls", "--json")
    assert r.returncode == 0, r.stderr
    assert {f"{wl.pid}-1", f"{wl.pid}-2"} <= {s["id"] for s in json.loads(r.stdout)}
    assert wl.verdict() == "PASS"


def test_an_ordinary_users_ls_and_stats_show_what_the_mount_shows_them(mount, users):
    """The store is root's: a user's ls and stats read their own
    checkpoints through the mount (found by its source, the store), exactly
    as it lists them; root's ls has an OWNER column; what only root may do
    (export) is refused in words, saying where the user's checkpoints are."""
    user, other = users
    theirs = mount.start("wl_memory", "--mib", "8", user=user)
    mine = mount.start("wl_memory", "--mib", "8")
    their_id = mount.checkpoint(theirs.pid, user=user)
    mount.checkpoint(mine.pid)
    mount.checkpoint(mount.start("wl_memory", "--mib", "8", user=other).pid, user=other)

    def as_user(*args):
        return user.run([build.GPUCKPT_CLI, "--store", mount.store, *args])

    r = as_user("ls", "--json")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert sorted(e["id"] for e in listed) == sorted(mount.ids(user)) == [their_id], listed
    manifest = json.loads(read(mount.path("checkpoints", their_id, "manifest.json")))
    assert listed[0] == manifest
    r = as_user("ls")
    assert r.returncode == 0 and their_id in r.stdout and "OWNER" not in r.stdout, r.stdout
    r = as_user("stats", "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["snapshot_count"] == 1, stats
    assert stats["logical_bytes"] == manifest["logical_bytes"], stats
    # Root's listing names each checkpoint's owner.
    r = cli(mount.store, "ls")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert "OWNER" in header, header
    row = next(line for line in rows if line.startswith(their_id + " "))
    assert row.split()[1] == user.name, row

    r = as_user("export", their_id, "/tmp/nowhere")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Permission denied" in r.stderr, r.stderr
    assert "NotFound" not in r.stderr and "no gpuckpt store" not in r.stderr, r.stderr
    assert f"ls {mount.mnt}/checkpoints" in r.stderr, r.stderr
