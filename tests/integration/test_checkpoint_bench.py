"""tests/bench/checkpoint_bench runs end to end on a tiny process (wl_big
--mib 64, one round): plain CRIU and gpuckpt each checkpoint and restore it
(the benchmark dies unless every restore says PASS), the store settles
between gpuckpt's checkpoints 2 and 3, and the report's table has the
benchmark's rows and columns and numbers that can be true. It keeps
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

from gpuckpt_testing.build import CRIU, WORKLOAD_BIN
from gpuckpt_testing.mount import why_not_runnable

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKPOINT_BENCH = os.path.join(SOURCE, "tests", "bench", "checkpoint_bench")
MIB = 64
COLUMNS = ["step", "anchor", "anchor s min / med", "gpuckpt s min / med", "ratio (med)", "goal",
           "", "samples (anchor; gpuckpt)"]
TMPFS = "plain CRIU into tmpfs"
DISK = "plain CRIU into the store's disk + `sync`"
C2 = "checkpoint 2 (right after checkpoint 1, which is still being settled)"
C3 = "checkpoint 3 (after the store settled)"
# (step, anchor) of every row, in order.
STEPS = [
    ("frozen, measured by the workload: checkpoint 1", TMPFS),
    ("frozen, measured by the workload: " + C2, TMPFS),
    ("frozen, measured by the workload: " + C3, TMPFS),
    ("frozen, reported: checkpoint 1", TMPFS + " (CRIU's frozen_time)"),
    ("frozen, reported: " + C2, TMPFS + " (CRIU's frozen_time)"),
    ("frozen, reported: " + C3, TMPFS + " (CRIU's frozen_time)"),
    ("time to durable: checkpoint 1 (empty store)", DISK),
    ("time to durable: " + C2, DISK),
    ("time to durable: " + C3, DISK),
    ("time to durable: checkpoint 1 (empty store)", TMPFS + " (the floor)"),
    ("time to durable: " + C2, TMPFS + " (the floor)"),
    ("time to durable: " + C3, TMPFS + " (the floor)"),
    (C2 + ": new bytes / logical", ""),
    ("checkpoint 2 after settling: new bytes / logical", ""),
    (C3 + ": new bytes / logical", ""),
    ("restore warm (`-d`, until criu returns)", "plain CRIU from tmpfs"),
    ("restore cold (`-d`, until criu returns; page cache dropped)",
     "plain CRIU from the store's disk"),
    ("read pages-*.img cold, GB/s (med)",
     "the disk's pace: the store's files read cold (`cat`, * bytes)"),
    ("read pages-*.img warm, GB/s (med)", "the same file in tmpfs"),
    ("daemon peak RSS (VmHWM, max over steps) MiB", "staging memory + 256 MiB"),
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
                                 " into the store's disk and into tmpfs\n"), report
        assert f"- process: wl_big --mib {MIB} " in report
        # The four restores of the round (warm and cold of each side) were
        # verified by the process.
        for restore in ("plain criu restore from tmpfs", "gpuckpt restore warm",
                        "plain criu restore from the store's disk, cold", "gpuckpt restore cold"):
            assert f"round 1: {restore} " in r.stderr, (restore, r.stderr)
        # The store settled between checkpoints 2 and 3, and both logs say how soon.
        settled = re.search(r"^\S+ round 1: store settled after ([0-9.]+) s ", r.stderr, re.M)
        assert settled and float(settled.group(1)) < 300, r.stderr
        assert re.search(r"^The store settled .* after \(s, from the return of checkpoint 2\) "
                         + re.escape(settled.group(1)) + ": ", report, re.M), report

        lines = [line for line in report.splitlines() if line.startswith("| ")]
        assert [c.strip() for c in lines[0].strip("|").split("|")] == COLUMNS
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
        assert len(rows) == len(STEPS), rows
        for (step, anchor), cells in zip(STEPS, rows):
            assert re.fullmatch(step_pattern(step), cells[0]), (step, cells[0])
            assert re.fullmatch(step_pattern(anchor), cells[1]), (anchor, cells[1])
            assert len(cells) == len(COLUMNS), cells
        by_step = {(cells[0].split(" (")[0], cells[1]): cells for cells in rows}

        def min_med(cell):
            low, med = (float(x) for x in cell.split(" / "))
            assert 0 <= low <= med, cell
            return med

        # One round: one sample per step, times of a second or so, not hours.
        durable = by_step["time to durable: checkpoint 1", DISK]
        assert 0 < min_med(durable[2]) < 120 and 0 < min_med(durable[3]) < 120, durable
        floor = by_step["time to durable: checkpoint 1", TMPFS + " (the floor)"]
        assert 0 < min_med(floor[2]) < 120 and floor[3] == durable[3], (floor, durable)
        for restore in (by_step["restore warm", "plain CRIU from tmpfs"],
                        by_step["restore cold", "plain CRIU from the store's disk"]):
            assert 0 < min_med(restore[2]) < 120 and 0 < min_med(restore[3]) < 120, restore
        # The workload saw itself stopped for less than the checkpoint took.
        frozen = by_step["frozen, measured by the workload: checkpoint 1", TMPFS]
        assert 0 < min_med(frozen[3]) <= min_med(durable[3]) + 1.0, (frozen, durable)
        frozen3 = by_step["frozen, measured by the workload: checkpoint 3", TMPFS]
        durable3 = by_step["time to durable: checkpoint 3", DISK]
        assert 0 < min_med(frozen3[3]) <= min_med(durable3[3]) + 1.0, (frozen3, durable3)
        assert frozen3[5] == "≤ 1.05x" and durable3[5] == "≤ 0.5x", (frozen3, durable3)
        assert by_step["time to durable: checkpoint 2", DISK][5] == "≤ 1.0x"

        def new_bytes(step):
            cells = by_step[step, ""]
            new, logical = (int(x) for x in cells[3].split(" / "))
            assert logical > MIB << 19 and 0 <= new <= logical, cells
            return new, logical, cells

        # Checkpoint 2, taken while checkpoint 1 may still be settling, has
        # no goal; where it was spooled every byte is new, and the row says so.
        new, logical, cells = new_bytes("checkpoint 2")
        assert cells[5] == "" and cells[6] == "", cells
        assert cells[7].startswith("spooled: all bytes new until settled; ") == (new == logical), \
            cells
        # Read again once the store has settled: judged by the < 1% goal (the
        # manifest may still give the totals checkpoint 2 was published with,
        # which the row then says).
        settled_new, _, cells = new_bytes("checkpoint 2 after settling: new bytes / logical")
        assert cells[5] == "< 1%" and cells[6] in ("met", "missed"), cells
        assert cells[7].startswith("the manifest's new_bytes as when published; ") == \
            (settled_new == new), cells
        # Checkpoint 3, taken once the store has settled, finds the unchanged
        # process's chunks and adds next to nothing.
        new, logical, cells = new_bytes("checkpoint 3")
        assert new < logical // 10 and cells[5] == "< 1%", cells
        rss = by_step["daemon peak RSS", "staging memory + 256 MiB"]
        assert int(rss[3]) > 0 and rss[5] == "≤ 1.0x", rss
        for step in ("ckpt1-r1", "ckpt2-r1", "settle-r1", "ckpt3-r1"):
            assert re.search(rf"^- {step}: [0-9.]+ s wall", report, re.M), \
                f"no CPU account of {step}"
        assert re.search(r"^- restore-r1: [0-9.]+ s wall", report, re.M), \
            "no CPU account of restore"
        # Its dumps on disk are gone, and so is the store (no --keep).
        assert not [n for n in os.listdir(os.path.join(work, "bench"))
                    if n.startswith("store") or n.startswith("plain-dump")]
    finally:
        mnt = os.path.join(work, "bench", "mnt")
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt])
        shutil.rmtree(work, ignore_errors=True)
