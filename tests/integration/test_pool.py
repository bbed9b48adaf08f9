"""Two gpuckptfs daemons on this machine, each with a store and a mount of
its own, sharing one RADOS pool of a one-node Ceph cluster
(tools/micro-ceph): a process checkpointed with --kill through the first is
restored through the second and carries on; the second fetches no more
than that checkpoint stored; a checkpoint of the restored process through
the second adds only what changed; a removal through either reaches the
other."""

import json
import os
import re
import shutil
import subprocess

import pytest

from harness import Mount, read, wait_for, why_not_runnable
from micro_ceph import MicroCeph


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


@pytest.fixture
def two_mounts(cluster, request):
    options = ("--pool", POOL, "--ceph-conf", cluster.conf, "--pool-timeout", "20")
    first = Mount("gpuckpt-pool-first.", *options)
    second = None
    try:
        second = Mount("gpuckpt-pool-second.", *options)
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


def test_killed_through_one_daemon_restored_through_the_other_carries_on(two_mounts):
    first, second = two_mounts
    wl = first.start("wl_memory", "--mib", "64")
    ckpt = first.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 10, f"pid {wl.pid} to end after checkpoint --kill")
    made = manifest(first, ckpt)
    assert ckpt in second.ids(), f"{ckpt} is not listed through the second mount"

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
    assert again in first.ids(), f"{again} is not listed through the first mount"
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
