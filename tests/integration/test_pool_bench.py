"""tests/bench/pool_bench runs end to end on a tiny process (wl_big --mib 32,
one round, memstore): a daemon with a local store only, one with
--pool-background and one with --pool each checkpoint it twice, and the
pool's checkpoint is restored through its own daemon and through a second
one that fetches it (the benchmark dies unless every restore says PASS).
The report's table has the benchmark's rows and columns and numbers that
can be true. It keeps the driver from rotting; its numbers are no
measurement.

Run by ctest under wl_reaper:
    wl_reaper python3 -m pytest tests/integration/test_pool_bench.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory. Needs root, /dev/fuse, CRIU and Debian's Ceph packages;
skipped, saying why, where one of them is missing.
"""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from gpuckpt_testing.build import WORKLOAD_BIN
from gpuckpt_testing.mount import why_not_runnable

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POOL_BENCH = os.path.join(SOURCE, "tests", "bench", "pool_bench")
MIB = 32
COLUMNS = ["step", "local s min / med", "pool s min / med", "ratio pool/local (med)",
           "samples (local; pool)"]
STEPS = [
    "time to durable: checkpoint 1 (new data)",
    "time to durable: checkpoint 2 (unchanged process)",
    "frozen, measured by the workload: checkpoint 1",
    "frozen, measured by the workload: checkpoint 2",
    "frozen, reported: checkpoint 1",
    "frozen, reported: checkpoint 2",
    "--pool-background, write returns: checkpoint 1",
    "--pool-background, write returns: checkpoint 2",
    "--pool-background, until published: checkpoint 1",
    "--pool-background, until published: checkpoint 2",
    "the daemon's own account (manifest duration_s): checkpoint 1",
    "the daemon's own account (manifest duration_s): checkpoint 2",
    "restore, until the write returns (local: the daemon that made it; pool: the other daemon)",
    "checkpoint 1 through the pool: MB uploaded (pool) / its stored_bytes (local)",
    "checkpoint 2 through the pool: MB uploaded (pool) / its stored_bytes (local)",
    "restore on the other daemon: MB fetched (pool) / checkpoint 1's stored_bytes (local)",
]


def why_not():
    missing = [d for d in ("ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rados")
               if not shutil.which(d)]
    if missing:
        return f"no {', '.join(missing)} (Debian's Ceph packages; tools/setup installs them)"
    return why_not_runnable("wl_big")


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def median(cell):
    """The median of a "min / med" cell, checked to be no less than the min."""
    low, med = (float(x) for x in cell.split(" / "))
    assert 0 <= low <= med, cell
    return med


def test_pool_bench_runs_end_to_end_with_its_rows_and_columns():
    work = tempfile.mkdtemp(prefix="gpuckpt-pool-bench.", dir="/var/tmp")
    out = os.path.join(work, "report.md")
    try:
        r = subprocess.run([POOL_BENCH, "--build", WORKLOAD_BIN, "--work",
                            os.path.join(work, "bench"), "--mib", str(MIB), "--repeat", "1",
                            "--store", "memstore", "--out", out],
                           capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(out) as f:
            report = f.read()
        assert report.strip() in r.stdout, "the report printed differs from the one written"
        assert report.startswith("## Shared pool benchmark: gpuckpt through a RADOS pool vs a "
                                 "local store only\n"), report
        assert f"- process: wl_big --mib {MIB} --stall;" in report
        assert re.search(r"^- ceph: ceph version [0-9]+\.", report, re.M), report
        assert "### memstore\n" in report and "### bluestore" not in report
        # The restores of the round were verified by the process.
        for said in ("restored through pool: PASS", "restored through other: PASS"):
            assert said in r.stderr, said

        lines = [line for line in report.splitlines() if line.startswith("| ")]
        assert [c.strip() for c in lines[0].strip("|").split("|")] == COLUMNS
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
        assert [cells[0] for cells in rows] == STEPS
        assert all(len(cells) == len(COLUMNS) for cells in rows), rows
        by_step = dict(zip(STEPS, rows))

        # One round: seconds, not hours; every side measured.
        for step in STEPS[:2] + STEPS[6:13]:
            local, pool = median(by_step[step][1]), median(by_step[step][2])
            assert 0 < local < 120 and 0 < pool < 120, by_step[step]
        # The workload saw itself stopped for less than the checkpoint took.
        frozen = by_step["frozen, measured by the workload: checkpoint 1"]
        durable = by_step["time to durable: checkpoint 1 (new data)"]
        assert 0 < median(frozen[2]) <= median(durable[2]) + 1.0, (frozen, durable)
        # Publication in the background ends after the write returned.
        returns = by_step["--pool-background, write returns: checkpoint 1"]
        published = by_step["--pool-background, until published: checkpoint 1"]
        assert median(published[2]) >= median(returns[2]), (returns, published)
        # The daemon's own account ends before the write returns, which
        # also waits for the publication.
        own = by_step["the daemon's own account (manifest duration_s): checkpoint 1"]
        assert median(own[2]) <= median(durable[2]), (own, durable)
        # Checkpoint 1 sent the pool no more than it stored; checkpoint 2 of
        # the unchanged process sent less than that.
        first = by_step[STEPS[-3]]
        assert 0 < median(first[2]) <= median(first[1]), first
        second = by_step[STEPS[-2]]
        assert median(second[2]) < median(first[2]) / 10, (first, second)
        # The other daemon fetched some of the checkpoint, and no more than
        # it stored.
        fetched = by_step[STEPS[-1]]
        stored_mb, fetched_mb = median(fetched[1]), median(fetched[2])
        assert 0 < fetched_mb <= stored_mb, fetched
        assert stored_mb < MIB * 1.1, fetched
        # The round's stores and cluster are gone; its logs stay.
        left = os.listdir(os.path.join(work, "bench"))
        assert "m1" not in left, left
        assert os.path.isdir(os.path.join(work, "bench", "logs", "memstore-r1-ceph")), left
    finally:
        for daemon in "wlbpo":
            path = os.path.join(work, "bench", "m1", daemon, "mnt")
            if os.path.ismount(path):
                subprocess.run(["fusermount3", "-u", "-z", path])
        shutil.rmtree(work, ignore_errors=True)
