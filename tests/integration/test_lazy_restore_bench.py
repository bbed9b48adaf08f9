"""tests/bench/lazy_restore_bench runs end to end on a tiny job (wl_steps
--mib 128, one round, the daemon reading with --direct-reads): it
restores the job eagerly and lazily, through
the mount and with plain CRIU from a copy of the images (the benchmark
dies unless the job checks out after each), and its report has the
benchmark's rows and columns with numbers that can be true. It keeps the driver
from rotting; its numbers are no measurement.

Run by ctest under wl_reaper, with GPUCKPTFS and WORKLOAD_BIN pointing at
the built gpuckptfs and the build directory. Needs root, /dev/fuse, CRIU
and a writable drop_caches; skipped, saying why, where one is missing.
"""

import json
import os
import re
import subprocess
import tempfile

import pytest

from gpuckpt_testing.build import WORKLOAD_BIN
from gpuckpt_testing.mount import why_not_runnable

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(SOURCE, "tests", "bench", "lazy_restore_bench")
MEASURES = ["criu_exited_s", "daemon_done_s", "returned_s", "cut_step_s", "next_step_s",
            "resident_s", "slowest_step_after_ms", "busy_share",
            "daemon_cpu_s", "criu_cpu_s", "job_cpu_s"]
MODES = ["eager", "lazy", "criu-eager", "criu-lazy"]


def why_not():
    return why_not_runnable("wl_steps") or (
        None if os.access("/proc/sys/vm/drop_caches", os.W_OK) else "cannot write drop_caches")


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def test_lazy_restore_bench_runs_end_to_end_with_its_rows():
    work = tempfile.mkdtemp(prefix="gpuckpt-lazy-bench-smoke.", dir="/var/tmp")
    out = os.path.join(work, "report.md")
    r = subprocess.run([BENCH, "--build", WORKLOAD_BIN, "--mib", "128", "--hot-mib", "16",
                        "--repeat", "1", "--plain-criu", "--daemon-arg=--direct-reads",
                        "--out", out],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        report = f.read()
    assert report.startswith("# lazy_restore_bench: 128 MiB job, 16 MiB read per step, "), report
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in report.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0] for row in rows[1:]] == MEASURES, rows
    assert rows[0][1:5] == [f"{mode} med (all)" for mode in MODES], rows[0]
    with open(out + ".json") as f:
        results = json.load(f)["results"]
    assert [x["mode"] for x in results] == MODES, results
    for x in results:
        assert 0 < x["returned_s"] < 60 and 0 < x["resident_s"] < 120, x
        assert x["next_step_s"] < 60 and x["steps_after"] > 0, x
        # The step the checkpoint cut ends no later than the first whole one.
        assert 0 < x["cut_step_s"] <= x["next_step_s"], x
        assert 0 < x["busy_share"] <= 1, x
        assert x["daemon_cpu_s"] >= 0 and x["criu_cpu_s"] >= 0 and x["job_cpu_s"] >= 0, x
    eager, lazy, criu_eager, criu_lazy = results
    # The daemon's own times, from its log: CRIU exits before the daemon
    # has done, and that before the write returns (the log rounds to 1 ms).
    # Plain CRIU has none.
    for x in (eager, lazy):
        assert 0 < x["criu_exited_s"] <= x["daemon_done_s"] <= x["returned_s"] + 0.001, x
    for x in (criu_eager, criu_lazy):
        assert x["criu_exited_s"] is None and x["daemon_done_s"] is None, x
    # A lazy restore returns before its memory is in; an eager one only once it is.
    assert eager["resident_s"] == eager["returned_s"], eager
    assert criu_eager["resident_s"] == criu_eager["returned_s"], criu_eager
    assert lazy["returned_s"] <= lazy["resident_s"], lazy
    assert criu_lazy["returned_s"] <= criu_lazy["resident_s"], criu_lazy
    # Plain CRIU ran outside the daemon: its time is counted all the same.
    assert criu_lazy["criu_cpu_s"] > 0, criu_lazy
    assert re.search(r"daemon options: --direct-reads; median step before the checkpoint: "
                     r"[\d.]+ ms", report), report
    subprocess.run(["rm", "-rf", work])
