"""Two gpuckptfs daemons on this machine, each with a store and a mount of
its own, sharing one RADOS pool of a one-node Ceph cluster
(tools/micro-ceph): a process checkpointed with --kill through the first is
restored through the second and carries on; the second fetches no more
than that checkpoint stored; a checkpoint of the restored process through
the second adds only what changed; a removal through either reaches the
other. Then the pool's faults, with the OSD stopped and restarted and a
quota filling the pool: a clear errno, nothing published, the process
untouched, publication in the background going on once the pool is back."""

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import threading
import time

import pytest

from gpuckpt_testing.filetools import read
from gpuckpt_testing.micro_ceph import MicroCeph
from gpuckpt_testing.mount import Mount, cli, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.users import Root


def why_no_ceph():
    """Why no one-node Ceph cluster can run here, or None."""
    missing = [d for d in ("ceph-mon", "ceph-osd", "ceph-mgr", "rados") if not shutil.which(d)]
    if missing:
        return f"no {', '.join(missing)} (Debian's Ceph packages; tools/setup installs them)"
    return None


pytestmark = pytest.mark.skipif(bool(why_not_runnable() or why_no_ceph()),
                                reason=why_not_runnable() or why_no_ceph() or "runnable")

POOL = "gpuckpt"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ceph = MicroCeph(str(tmp_path_factory.mktemp("ceph")), pools=(POOL,))
    try:
        yield ceph
    finally:
        ceph.stop()


def pooled_mount(name, cluster, timeout_s=20, *more):
    """A daemon with a store of its own on the cluster's pool."""
    return Mount(f"gpuckpt-pool-{name}.", "--pool", POOL, "--ceph-conf", cluster.conf,
                 "--pool-timeout", str(timeout_s), *more)


@pytest.fixture
def two_mounts(cluster):
    first = pooled_mount("first", cluster)
    second = None
    try:
        second = pooled_mount("second", cluster)
        yield first, second
    finally:
        if second is not None:
            second.close()
        first.close()


def pool_metric(mount, name):
    """The value of metric `name` for the pool in the mount's metrics."""
    text = read(mount.path("metrics"))
    m = re.search(rf'^{name}{{pool="{POOL}"}} (\d+)$', text, re.M)
    assert m, f"no {name} for pool {POOL} in the metrics:\n{text}"
    return int(m.group(1))


def manifest(mount, ckpt_id):
    return json.loads(read(mount.path("checkpoints", ckpt_id, "manifest.json")))


@contextlib.contextmanager
def osd_stopped(cluster):
    """The pool unreachable for the block's time (its one OSD stopped)."""
    cluster.stop_osd()
    try:
        yield
    finally:
        cluster.start_osd()


def test_killed_through_one_daemon_restored_through_the_other_carries_on(two_mounts):
    first, second = two_mounts
    wl = first.start("wl_memory", "--mib", "64")
    ckpt = first.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 10, f"pid {wl.pid} to end after checkpoint --kill")
    made = manifest(first, ckpt)
    wait_for(lambda: ckpt in second.ids(), 5, f"{ckpt} to be listed through the second mount")

    fetched_before = pool_metric(second, "gpuckpt_pool_fetched_bytes_total")
    assert manifest(second, ckpt) == made, "the two mounts describe the checkpoint differently"
    second.restore(second.path("checkpoints", ckpt), wl.pid)
    fetched = pool_metric(second, "gpuckpt_pool_fetched_bytes_total") - fetched_before
    assert 0 < fetched <= made["stored_bytes"], \
        f"fetched {fetched} bytes for a checkpoint that stored {made['stored_bytes']}"

    # The restored process, checkpointed through the second daemon: based on
    # the checkpoint it came from, and only what changed since goes to the
    # pool.
    uploaded_before = pool_metric(second, "gpuckpt_pool_uploaded_bytes_total")
    again = second.checkpoint(wl.pid)
    later = manifest(second, again)
    uploaded = pool_metric(second, "gpuckpt_pool_uploaded_bytes_total") - uploaded_before
    assert later["extra"]["parent"] == ckpt, later["extra"]
    assert later["base"] == ckpt, later
    assert later["new_bytes"] < made["new_bytes"] / 4, (later["new_bytes"], made["new_bytes"])
    assert uploaded <= later["stored_bytes"], (uploaded, later["stored_bytes"])
    # A mount's listing may be up to a second old.
    wait_for(lambda: again in first.ids(), 5, f"{again} to be listed through the first mount")
    wl.assert_passes("restored through the second daemon")


def test_a_removal_through_either_mount_reaches_the_other(two_mounts):
    first, second = two_mounts
    wl = first.start("wl_memory", "--mib", "8")
    one = first.checkpoint(wl.pid)
    two = first.checkpoint(wl.pid)
    wl.kill()
    # The second mount reads one of them (and so holds a copy), not the other.
    assert manifest(second, one)["id"] == one
    assert os.listdir(second.path("checkpoints", one, "images"))
    subprocess.run(["rm", "-r", first.path("checkpoints", one)], check=True)
    wait_for(lambda: one not in second.ids(), 10, f"{one} to go from the second mount")
    subprocess.run(["rm", "-r", second.path("checkpoints", two)], check=True)
    wait_for(lambda: two not in first.ids(), 10, f"{two} to go from the first mount")


def where(store, cluster):
    """`gpuckpt ls --json` of `store` with the pool: each id's "where"."""
    r = cli(store, "--pool", POOL, "--ceph-conf", cluster.conf, "ls", "--json")
    assert r.returncode == 0, r.stderr
    return {s["id"]: s["where"] for s in json.loads(r.stdout)}


def test_gpuckpt_ls_says_where_each_snapshot_is(two_mounts, cluster):
    first, second = two_mounts
    wl = first.start("wl_memory", "--mib", "8")
    ckpt = first.checkpoint(wl.pid)
    wl.kill()

    # Beside the running daemons: made and published through the first, only
    # in the pool for the second, until the second reads it.
    assert where(first.store, cluster)[ckpt] == "both"
    assert where(second.store, cluster)[ckpt] == "pool"
    r = cli(second.store, "--pool", POOL, "--ceph-conf", cluster.conf, "ls")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split()[-2:] == ["WHERE", "SOURCE"], header
    assert any(row.split()[0] == ckpt and " pool " in row for row in rows), r.stdout
    assert os.listdir(second.path("checkpoints", ckpt, "images"))
    assert where(second.store, cluster)[ckpt] == "both"

    # Without a pool: neither the field nor the column.
    r = cli(first.store, "ls", "--json")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert [s["id"] for s in listed] == [ckpt] and "where" not in listed[0], listed
    r = cli(first.store, "ls")
    assert r.returncode == 0 and "WHERE" not in r.stdout, r.stdout + r.stderr


def test_gpuckpt_ls_says_local_for_a_checkpoint_not_published_yet(cluster):
    # Background publication with the pool away, and the daemon stopped
    # before it came back: the checkpoint is in the store only.
    m = pooled_mount("unpublished", cluster, 3, "--pool-background")
    try:
        wl = m.start("wl_memory", "--mib", "8")
        with osd_stopped(cluster):
            ckpt = m.checkpoint(wl.pid)
            wl.kill()
            m.close(keep=True)  # the daemon stops; its store stays
        assert ckpt not in catalog(cluster)
        assert where(m.store, cluster)[ckpt] == "local"
    finally:
        m.close()


def catalog(cluster):
    """The ids the pool's catalog lists (rados listomapkeys)."""
    return cluster.rados("listomapkeys", "gpuckpt.catalog").decode().split()


def status_value(mount, pid, key):
    text = read(mount.path(str(pid), "status"))
    m = re.search(rf"^{key}: (.*)$", text, re.M)
    assert m, f"no {key}: in {pid}/status:\n{text}"
    return m.group(1)


def test_two_daemons_checkpointing_and_removing_while_a_collection_runs_lose_nothing(cluster):
    grace = ("--pool-gc-grace", "2")
    first = pooled_mount("race1", cluster, 20, *grace)
    second = pooled_mount("race2", cluster, 20, *grace)
    third = None
    stop = threading.Event()
    refusals = []

    def collect():
        # gc through the first daemon's mount, as often as it goes.
        while not stop.is_set():
            ok, err = Root().write(first.path("ctl"), "gc")
            if not ok:
                refusals.append(err)
            time.sleep(0.2)

    collector = threading.Thread(target=collect)
    try:
        workloads = [(first, first.start("wl_memory", "--mib", "16")),
                     (second, second.start("wl_memory", "--mib", "16"))]
        collector.start()
        kept = {first: [], second: []}
        for _ in range(6):
            for mount, wl in workloads:
                kept[mount].append(mount.checkpoint(wl.pid))
                if len(kept[mount]) > 2:
                    subprocess.run(["rm", "-r", mount.path("checkpoints", kept[mount].pop(0))],
                                   check=True)
                time.sleep(0.5)
        stop.set()
        collector.join()
        assert not refusals, refusals
        log = read(os.path.join(first.state_dir, "gpuckptfs.log"))
        assert "op=gc collected=true" in log and "swept=true" in log, \
            "no collection swept during the race"
        # Every checkpoint still published reads back whole through a third
        # daemon, whose store has none of it.
        third = pooled_mount("race3", cluster, 20, *grace)
        for ckpt in kept[first] + kept[second]:
            images = third.path("checkpoints", ckpt, "images")
            for name in os.listdir(images):
                with open(os.path.join(images, name), "rb") as f:
                    while f.read(1 << 20):
                        pass
        for _, wl in workloads:
            wl.kill()
    finally:
        stop.set()
        if collector.is_alive():
            collector.join()
        for mount in (third, second, first):
            if mount is not None:
                mount.close()


# The pool's faults: the OSD stopped (the pool does not answer) and a full
# pool. These run last: they stop the cluster's OSD.


def test_an_unreachable_pool_fails_a_checkpoint_with_etimedout_and_nothing_is_published(cluster):
    m = pooled_mount("away", cluster, 3)
    try:
        wl = m.start("wl_memory", "--mib", "8")
        before = m.ids()
        with osd_stopped(cluster):
            started = time.monotonic()
            ok, err = Root().write(m.path(str(wl.pid), "ctl"), "checkpoint")
            took = time.monotonic() - started
            assert not ok, "a checkpoint succeeded with the pool unreachable"
            assert err == os.strerror(errno.ETIMEDOUT), err
            assert took < 60, f"the failure took {took:.0f} s with a 3 s pool timeout"
            last = m.last(wl.pid)
            assert f"pool {POOL} cannot be reached" in last, last
            assert wl.alive(), "the process did not survive the failed checkpoint"
            # The mount lists what this machine holds while the pool is
            # away (here nothing: the pool's checkpoints are not listed),
            # without waiting out the timeout.
            started = time.monotonic()
            assert set(m.ids()) <= set(before)
            assert time.monotonic() - started < 10
        # librados reconnects by itself: the next checkpoint is published.
        ckpt = wait_for_checkpoint(m, wl.pid)
        assert ckpt in catalog(cluster)
        wl.kill()
    finally:
        m.close()


def wait_for_checkpoint(mount, pid):
    """A checkpoint of `pid`, retried while the pool comes back (the OSD may
    take a moment to serve again): its id."""
    deadline = time.monotonic() + 60
    while True:
        ok, err = Root().write(mount.path(str(pid), "ctl"), "checkpoint")
        if ok:
            last = status_value(mount, pid, "last")
            assert last.startswith("checkpoint ") and " ok" in last, last
            return last.split()[1]
        assert time.monotonic() < deadline, f"no checkpoint a minute after the OSD came back: {err}"
        time.sleep(1)


def test_background_publication_keeps_checkpointing_while_the_pool_is_away(cluster):
    m = pooled_mount("later", cluster, 3, "--pool-background")
    try:
        wl = m.start("wl_memory", "--mib", "8")
        with osd_stopped(cluster):
            ckpt = m.checkpoint(wl.pid)
            assert status_value(m, wl.pid, "pool_last_checkpoint") == "pending"
            assert pool_metric(m, "gpuckpt_pool_pending_checkpoints") >= 1
        wait_for(lambda: pool_metric(m, "gpuckpt_pool_pending_checkpoints") == 0, 90,
                 "the pending checkpoint to be published once the OSD is back")
        assert status_value(m, wl.pid, "pool_last_checkpoint") == "published"
        assert ckpt in catalog(cluster)
        wl.kill()
    finally:
        m.close()


def test_a_full_pool_fails_a_checkpoint_with_enospc_and_says_so(cluster):
    m = pooled_mount("full", cluster, 5)
    try:
        wl = m.start("wl_memory", "--mib", "8")
        cluster.set_quota(POOL, 1)
        try:
            # The OSD learns of the quota within seconds.
            def refused():
                ok, err = Root().write(m.path(str(wl.pid), "ctl"), "checkpoint")
                assert ok or err == os.strerror(errno.ENOSPC), err
                return not ok
            wait_for(refused, 60, "a checkpoint to be refused by the full pool")
            assert "full" in m.last(wl.pid), m.last(wl.pid)
            assert wl.alive()
        finally:
            cluster.set_quota(POOL, 0)
        ckpt = wait_for_checkpoint(m, wl.pid)
        assert ckpt in catalog(cluster)
        wl.kill()
    finally:
        m.close()
