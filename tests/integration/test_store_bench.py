"""tests/bench/store_bench runs end to end on tiny data (8 MiB per
checkpoint): every tool installed here imports both checkpoints and reads
them back verified, and the report's table has the benchmark's columns and
numbers that can be true. It keeps the driver from rotting; its numbers are
no measurement.

Run by ctest:
    python3 -m pytest tests/integration/test_store_bench.py
with WORKLOAD_BIN pointing at the build directory (its tools/gpuckpt/gpuckpt
and tests/bench/make_checkpoint_tree). Needs root (the benchmark drops the
page cache); restic and borg are measured where they are installed.
"""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from harness import GPUCKPT_CLI, WORKLOAD_BIN

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORE_BENCH = os.path.join(SOURCE, "tests", "bench", "store_bench")
GENERATOR = os.path.join(WORKLOAD_BIN, "tests", "bench", "make_checkpoint_tree")
SIZE_MIB = 8
COLUMNS = ["tool", "import 1 s", "MB/s", "stored after 1 MB", "% of ckpt1", "import 2 s", "MB/s",
           "added by 2 MB", "% of ckpt2", "read-back cold s", "MB/s", "read-back warm s", "MB/s"]


def why_not():
    if os.geteuid() != 0:
        return "needs root (the benchmark drops the page cache)"
    if not os.access(GPUCKPT_CLI, os.X_OK):
        return f"no gpuckpt CLI at {GPUCKPT_CLI} (WORKLOAD_BIN={WORKLOAD_BIN!r})"
    if not os.access(GENERATOR, os.X_OK):
        return f"no make_checkpoint_tree at {GENERATOR}"
    return None


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def table_rows(report):
    """The report's table: its header cells and {tool: cells}."""
    lines = [line for line in report.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return header, rows


def test_store_bench_runs_end_to_end_with_its_columns():
    tools = ["gpuckpt"] + [t for t in ("restic", "borg") if shutil.which(t)]
    work = tempfile.mkdtemp(prefix="gpuckpt-store-bench-smoke.", dir="/var/tmp")
    out = os.path.join(work, "report.md")
    try:
        r = subprocess.run([STORE_BENCH, "--gpuckpt", GPUCKPT_CLI, "--generator", GENERATOR,
                            "--work", os.path.join(work, "bench"), "--size-mib", str(SIZE_MIB),
                            "--only", ",".join(tools), "--out", out],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(out) as f:
            report = f.read()
        assert report.strip() in r.stdout, "the report printed differs from the one written"
        assert report.startswith(f"## Store benchmark: {', '.join(tools)}\n"), report
        assert f"make_checkpoint_tree --size-mib {SIZE_MIB} --seed 1" in report

        header, rows = table_rows(report)
        assert header == COLUMNS
        assert sorted(rows) == sorted(tools), rows
        logical = {int(n) for n in re.findall(r"ckpt[12] (\d+) bytes", report)}
        assert len(logical) == 2 and all(n > SIZE_MIB << 20 for n in logical), logical
        for tool, cells in rows.items():
            assert len(cells) == len(COLUMNS), cells
            for i in (1, 5, 9, 11):  # seconds
                assert 0 < float(cells[i]) < 120, (tool, COLUMNS[i], cells[i])
            for i in (2, 6, 10, 12):  # MB/s: bytes over seconds
                assert cells[i] == "-" or float(cells[i]) > 0, (tool, COLUMNS[i], cells[i])
            assert float(cells[3]) > 0, (tool, "nothing stored by import 1")
            assert float(cells[7]) >= 0, (tool, "added by 2", cells[7])
        # ckpt2 is ckpt1 with about 1 % new pages, imported with --base:
        # gpuckpt stores a small part of it anew.
        assert float(rows["gpuckpt"][8]) < 25, rows["gpuckpt"]
        assert "gpuckpt's own `stats --json` after import 2" in report
        # Only logs and the report stay (no --keep).
        assert not os.path.exists(os.path.join(work, "bench", "tree"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
