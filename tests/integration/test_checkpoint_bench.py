"""tests/bench/checkpoint_bench runs end to end on a tiny process (wl_big
--mib 64, one round): plain CRIU and gpuckpt each checkpoint and restore it
(the benchmark dies unless every restore says PASS), and the report's table
has the benchmark's rows and columns and numbers that can be true. It keeps
the driver from rotting; its numbers are no measurement.

Run by ctest under wl_reaper:
    wl_reaper python3 -m pytest tests/integration/test_checkpoint_bench.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory. Needs root, /dev/fuse, CRIU and a writable drop_caches;
skipped, saying why, where one of them is missing.
"""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from harness import CRIU, WORKLOAD_BIN, why_not_runnable

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKPOINT_BENCH = os.path.join(SOURCE, "tests", "bench", "checkpoint_bench")
MIB = 64
COLUMNS = ["step", "plain CRIU (tmpfs) s min / med", "gpuckpt s min / med", "ratio (med)",
           "target", "", "samples (plain; gpuckpt)"]
STEPS = [
    "frozen, measured by the workload: checkpoint 1",
    "frozen, measured by the workload: checkpoint 2",
    "frozen, reported: checkpoint 1",
    "frozen, reported: checkpoint 2",
    "time to durable: checkpoint 1 (empty store)",
    "time to durable: checkpoint 2 (unchanged process)",
    "checkpoint 2: new bytes / logical",
    "restore (`-d`, until criu returns)",
    "read pages-*.img cold, GB/s (med)",
    "read pages-*.img warm, GB/s (med)",
    "read the store's files from disk cold (`cat`, * bytes), GB/s",
    "daemon peak RSS (VmHWM, max over steps) MiB",
]


def why_not():
    return why_not_runnable("wl_big") or (
        None if os.access("/proc/sys/vm/drop_caches", os.W_OK) else "cannot write drop_caches")


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def step_pattern(step):
    return re.escape(step).replace(r"\*", r"[^ ]+")


def test_checkpoint_bench_runs_end_to_end_with_its_rows_and_columns():
    work = tempfile.mkdtemp(prefix="gpuckpt-checkpoint-bench-smoke.", dir="/var/tmp")
    out = os.path.join(work, "report.md")
    try:
        r = subprocess.run([CHECKPOINT_BENCH, "--build", WORKLOAD_BIN, "--criu", CRIU,
                            "--work", os.path.join(work, "bench"), "--mib", str(MIB),
                            "--repeat", "1", "--out", out],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(out) as f:
            report = f.read()
        assert report.strip() in r.stdout, "the report printed differs from the one written"
        assert report.startswith("## Checkpoint benchmark: gpuckpt through the mount vs plain CRIU"
                                 " into tmpfs\n"), report
        assert f"- process: wl_big --mib {MIB} " in report
        # Both restores of the round were verified by the process.
        assert "round 1: plain criu restore" in r.stderr and "round 1: gpuckpt restore" in r.stderr

        lines = [line for line in report.splitlines() if line.startswith("| ")]
        assert [c.strip() for c in lines[0].strip("|").split("|")] == COLUMNS
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
        assert len(rows) == len(STEPS), rows
        for step, cells in zip(STEPS, rows):
            assert re.fullmatch(step_pattern(step), cells[0]), (step, cells[0])
            assert len(cells) == len(COLUMNS), cells
        by_step = {cells[0].split(" (")[0]: cells for cells in rows}

        def min_med(cell):
            low, med = (float(x) for x in cell.split(" / "))
            assert 0 <= low <= med, cell
            return med

        # One round: one sample per step, times of a second or so, not hours.
        durable = by_step["time to durable: checkpoint 1"]
        assert 0 < min_med(durable[1]) < 120 and 0 < min_med(durable[2]) < 120, durable
        assert 0 < min_med(by_step["restore"][2]) < 120, by_step["restore"]
        # The workload saw itself stopped for less than the checkpoint took.
        frozen = by_step["frozen, measured by the workload: checkpoint 1"]
        assert 0 < min_med(frozen[2]) <= min_med(durable[2]) + 1.0, (frozen, durable)
        # An unchanged process's second checkpoint adds next to nothing.
        new, logical = (int(x) for x in
                        by_step["checkpoint 2: new bytes / logical"][2].split(" / "))
        assert logical > MIB << 19 and new < logical // 10, (new, logical)
        rss = by_step["daemon peak RSS"]
        assert int(rss[2]) > 0 and rss[4] == "≤ 1.0x", rss
        assert re.search(r"^- ckpt1-r1: [0-9.]+ s wall", report, re.M), "no CPU account of ckpt1"
        assert re.search(r"^- restore-r1: [0-9.]+ s wall", report, re.M), \
            "no CPU account of restore"
        # Its tmpfs dumps are gone, and so is the store (no --keep).
        assert not [n for n in os.listdir(os.path.join(work, "bench")) if n.startswith("store")]
    finally:
        mnt = os.path.join(work, "bench", "mnt")
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt])
        shutil.rmtree(work, ignore_errors=True)
