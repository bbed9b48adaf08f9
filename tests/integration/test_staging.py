"""Checkpoints through a real mount with staging memory far smaller than the
image, the frozen time gpuckptfs reports for them, and a second checkpoint
that takes the chunks the process left unchanged from the first.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_staging.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
directory of the workloads. Needs root, /dev/fuse and CRIU; the test is
skipped, saying why, where one of them is missing.
"""

import json
import os
import re

import pytest

from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, ctl, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.workloads import Workload

# Staging memory (16 MiB, the least gpuckptfs accepts) against an image of
# about 200 MB: CRIU must wait for room many times over.
STAGING = "16M"
IMAGE_MIB = 256

pytestmark = pytest.mark.skipif(why_not_runnable("wl_big") is not None,
                                reason=str(why_not_runnable("wl_big")))


@pytest.fixture
def mount():
    # Staged, never spooled (which stages nothing, and is the default on
    # few cores): what is tested here is the staging memory.
    m = Mount("gpuckpt-staging-test.", "--staging-memory", STAGING, "--spool", "never")
    try:
        yield m.mnt, m.work, m.workloads
    finally:
        m.close()


def test_image_far_larger_than_staging_checkpoints_and_restores(mount):
    mnt, work, workloads = mount
    wl = Workload(work, "wl_big", "--mib", str(IMAGE_MIB))
    workloads.append(wl)

    ctl(f"{mnt}/{wl.pid}/ctl", "checkpoint")
    ckpt = os.path.join(mnt, "checkpoints", f"{wl.pid}-1")
    manifest = json.loads(read(os.path.join(ckpt, "manifest.json")))
    extra = manifest["extra"]
    assert extra["staging_memory_bytes"] == 16 << 20
    # The image is far larger than the staging memory it went through.
    assert manifest["logical_bytes"] > 8 * (16 << 20), manifest["logical_bytes"]

    # Frozen time: CRIU's own measure for a process without a GPU, shorter
    # than the whole dump, and the same figure in status and metrics.
    stages = extra["stages"]
    assert stages["frozen_by"] == "criu freeze to resume"
    assert 0 < stages["frozen_s"] <= stages["dump_s"], stages
    assert stages["criu_frozen_s"] == stages["frozen_s"]
    last = [l for l in read(f"{mnt}/{wl.pid}/status").splitlines() if l.startswith("last:")][0]
    assert re.search(rf"checkpoint {wl.pid}-1 ok \(frozen {stages['frozen_s']:.2f} s, "
                     r"durable after [0-9.]+ s,", last), last
    metrics = read(os.path.join(mnt, "metrics"))
    assert "gpuckpt_checkpoint_frozen_seconds_count 1\n" in metrics
    sums = re.findall(r"^gpuckpt_checkpoint_frozen_seconds_sum ([0-9.]+)$", metrics, re.M)
    assert sums and abs(float(sums[0]) - stages["frozen_s"]) < 1e-5, metrics

    # What went through the small staging memory is the process, byte for
    # byte: restored from the mount, it checks every page.
    wl.kill()
    ctl(os.path.join(mnt, "restore"), ckpt)
    assert read(os.path.join(mnt, "restore")).strip() == f"pid {wl.pid}"
    assert wl.verdict() == "PASS"


def test_killed_checkpoint_reports_frozen_until_dump_end(mount):
    mnt, work, workloads = mount
    wl = Workload(work, "wl_memory", "--mib", "32")
    workloads.append(wl)
    ctl(f"{mnt}/{wl.pid}/ctl", "checkpoint --kill")
    wait_for(lambda: not wl.alive(), 10, "the process to be killed")
    extra = json.loads(read(os.path.join(mnt, "checkpoints", f"{wl.pid}-1", "manifest.json")))["extra"]
    assert extra["mode"] == "kill"
    assert extra["stages"]["frozen_s"] > 0
    ctl(os.path.join(mnt, "restore"), os.path.join(mnt, "checkpoints", f"{wl.pid}-1"))
    assert wl.verdict() == "PASS"


def test_second_checkpoint_takes_unchanged_chunks_from_the_first(mount):
    mnt, work, workloads = mount
    wl = Workload(work, "wl_big", "--mib", "64")
    workloads.append(wl)
    ctl(f"{mnt}/{wl.pid}/ctl", "checkpoint")
    ctl(f"{mnt}/{wl.pid}/ctl", "checkpoint")
    first = json.loads(read(os.path.join(mnt, "checkpoints", f"{wl.pid}-1", "manifest.json")))
    second = json.loads(read(os.path.join(mnt, "checkpoints", f"{wl.pid}-2", "manifest.json")))
    assert "base" not in first
    assert second["base"] == f"{wl.pid}-1"
    assert second["extra"]["parent"] == f"{wl.pid}-1"
    # The 64 MiB of pattern pages did not move: nearly every chunk is the
    # first checkpoint's, recognised without being hashed.
    assert second["base_chunks"] >= 0.9 * second["chunks"], second
    assert second["base_chunks"] < second["chunks"], "some image changed between the checkpoints"

    # The restore reads the base's chunks for the second checkpoint.
    wl.kill()
    ctl(os.path.join(mnt, "restore"), os.path.join(mnt, "checkpoints", f"{wl.pid}-2"))
    assert wl.verdict() == "PASS"
