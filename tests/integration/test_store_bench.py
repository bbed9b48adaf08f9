"""tests/bench/store_bench runs end to end on tiny data (8 MiB per
checkpoint, two rounds): every tool installed here imports both checkpoints
and reads them back verified, and the report has the benchmark's tables
(medians, spread over the rounds), each round's numbers and numbers that can
be true. With --source it measures two given directories in place and leaves
them as they were, and it refuses sources it cannot use. It keeps the driver
from rotting; its numbers are no measurement.

Run by ctest:
    python3 -m pytest tests/integration/test_store_bench.py
with WORKLOAD_BIN pointing at the build directory (its tools/gpuckpt/gpuckpt
and tests/bench/make_checkpoint_tree). Needs root (the benchmark drops the
page cache); restic and borg are measured where they are installed.
"""

import hashlib
import os
import random
import re
import shutil
import subprocess
import tempfile

import pytest

from gpuckpt_testing.build import GPUCKPT_CLI, WORKLOAD_BIN

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORE_BENCH = os.path.join(SOURCE, "tests", "bench", "store_bench")
GENERATOR = os.path.join(WORKLOAD_BIN, "tests", "bench", "make_checkpoint_tree")
SIZE_MIB = 8
ROUNDS = 2
COLUMNS = ["tool", "import 1 s", "MB/s", "stored after 1 MB", "% of ckpt1", "import 2 s", "MB/s",
           "added by 2 MB", "% of ckpt2", "read-back cold s", "MB/s", "read-back warm s", "MB/s"]
SPREAD_COLUMNS = ["tool", "import 1 s", "import 2 s", "read-back cold s", "read-back warm s"]
ROUND_LINE = re.compile(r"^- round (\d+), (\w+): import ([\d.]+) s \+ ([\d.]+) s, stored "
                        r"([\d.]+) MB \+ ([\d.]+) MB, read-back ([\d.]+) s cold, ([\d.]+) s warm$",
                        re.M)


def why_not():
    if os.geteuid() != 0:
        return "needs root (the benchmark drops the page cache)"
    if not os.access(GPUCKPT_CLI, os.X_OK):
        return f"no gpuckpt CLI at {GPUCKPT_CLI} (WORKLOAD_BIN={WORKLOAD_BIN!r})"
    if not os.access(GENERATOR, os.X_OK):
        return f"no make_checkpoint_tree at {GENERATOR}"
    return None


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def installed_tools():
    return ["gpuckpt"] + [t for t in ("restic", "borg") if shutil.which(t)]


@pytest.fixture
def work():
    # Real: the report names the sources by their real paths.
    path = os.path.realpath(tempfile.mkdtemp(prefix="gpuckpt-store-bench-smoke.", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def store_bench(work, *args):
    return subprocess.run([STORE_BENCH, "--gpuckpt", GPUCKPT_CLI, "--generator", GENERATOR,
                           "--work", os.path.join(work, "bench"), *args],
                          capture_output=True, text=True, timeout=300)


def run_report(work, tools, *args):
    """Runs the benchmark, which must succeed; its report."""
    out = os.path.join(work, "report.md")
    r = store_bench(work, "--only", ",".join(tools), "--out", out, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        report = f.read()
    assert report.strip() in r.stdout, "the report printed differs from the one written"
    assert report.startswith(f"## Store benchmark: {', '.join(tools)}\n"), report
    return report


def tables(report):
    """The report's tables in order, each as its header cells and
    {tool: cells}."""
    blocks, block = [], []
    for line in report.splitlines() + [""]:
        if line.startswith("| "):
            block.append([c.strip() for c in line.strip("|").split("|")])
        elif block:
            blocks.append((block[0], {cells[0]: cells for cells in block[2:]}))
            block = []
    return blocks


def check_main_table(header, rows, tools):
    assert header == COLUMNS
    assert sorted(rows) == sorted(tools), rows
    for tool, cells in rows.items():
        assert len(cells) == len(COLUMNS), cells
        for i in (1, 5, 9, 11):  # seconds
            assert 0 < float(cells[i]) < 120, (tool, COLUMNS[i], cells[i])
        for i in (2, 6, 10, 12):  # MB/s: bytes over seconds
            assert cells[i] == "-" or float(cells[i]) > 0, (tool, COLUMNS[i], cells[i])
        assert float(cells[3]) > 0, (tool, "nothing stored by import 1")
        assert float(cells[7]) >= 0, (tool, "added by 2", cells[7])


def round_lines(report):
    """Each round's lines, as (round, tool, numbers), in report order."""
    return [(int(m[0]), m[1], [float(x) for x in m[2:]]) for m in ROUND_LINE.findall(report)]


def test_store_bench_two_rounds_end_to_end(work):
    tools = installed_tools()
    report = run_report(work, tools, "--size-mib", str(SIZE_MIB), "--repeat", str(ROUNDS))
    assert f"make_checkpoint_tree --size-mib {SIZE_MIB} --seed 1" in report
    assert f"- rounds: {ROUNDS}," in report
    logical = {int(n) for n in re.findall(r"ckpt[12] (\d+) bytes", report)}
    assert len(logical) == 2 and all(n > SIZE_MIB << 20 for n in logical), logical

    (header, rows), (spread_header, spread_rows) = tables(report)
    check_main_table(header, rows, tools)
    # ckpt2 is ckpt1 with about 1 % new pages, imported with --base:
    # gpuckpt stores a small part of it anew.
    assert float(rows["gpuckpt"][8]) < 25, rows["gpuckpt"]

    assert f"Spread over {ROUNDS} rounds, min / median / max:" in report
    assert spread_header == SPREAD_COLUMNS
    assert sorted(spread_rows) == sorted(tools), spread_rows
    for tool, cells in spread_rows.items():
        for column, cell in zip(SPREAD_COLUMNS[1:], cells[1:]):
            low, median, high = (float(x) for x in cell.split(" / "))
            assert 0 < low <= median <= high, (tool, column, cell)
        # The main table's seconds are the same medians.
        assert [c.split(" / ")[1] for c in cells[1:]] == [rows[tool][i] for i in (1, 5, 9, 11)]

    # One line per tool per round, in the order they ran: round k starts
    # with tool k of the list.
    lines = round_lines(report)
    assert [(k, tool) for k, tool, _ in lines] == [
        (k + 1, tools[(k + i) % len(tools)]) for k in range(ROUNDS) for i in range(len(tools))]
    for k, tool, numbers in lines:
        assert all(n >= 0 for n in numbers) and numbers[0] > 0, (k, tool, numbers)

    m = re.search(r"gpuckpt's stored after 1 without its reserve file RESERVE\.gpuckpt "
                  r"\(([\d.]+) MB .*\): ([\d.]+) MB", report)
    assert m, report
    reserve_mb, data_mb = float(m[1]), float(m[2])
    assert reserve_mb > 0 and 0 < data_mb < float(rows["gpuckpt"][3]), (m[0], rows["gpuckpt"])
    assert abs(reserve_mb + data_mb - float(rows["gpuckpt"][3])) < 0.2, (m[0], rows["gpuckpt"])
    assert "gpuckpt's own `stats --json` after import 2 of the last round" in report
    if len(tools) > 1:
        for n in (1, 2):
            m = re.search(rf"^gpuckpt import {n} throughput / faster of restic, borg: "
                          r"min ([\d.]+)x, median ([\d.]+)x, max ([\d.]+)x; per round: (.*)$",
                          report, re.M)
            assert m, report
            assert float(m[1]) <= float(m[2]) <= float(m[3]), m[0]
            assert len(re.findall(r"[\d.]+x \((?:restic|borg)\)", m[4])) == ROUNDS, m[0]
    # Only logs and the report stay (no --keep), with each round's logs.
    assert not os.path.exists(os.path.join(work, "bench", "tree"))
    assert sorted(os.listdir(os.path.join(work, "bench", "logs"))) == [
        "generator.out", *(f"round{k + 1}" for k in range(ROUNDS))]


def make_sources(parent):
    """Two small checkpoint-like directories: ckpt2 is ckpt1 with a few
    pages rewritten, one file grown and one metadata file changed."""
    rng = random.Random(1)
    first, second = os.path.join(parent, "dump-1"), os.path.join(parent, "dump-2")
    os.makedirs(first)
    os.makedirs(second)
    pages = rng.randbytes(96 << 12) + bytes(64 << 12)
    files = {"pages-1.img": pages, "pages-2.img": rng.randbytes(40 << 12),
             "core-1234.img": rng.randbytes(700), "inventory.img": b"\x54\x56\x58\x59" * 16}
    changed = dict(files)
    changed["pages-1.img"] = pages[:8 << 12] + rng.randbytes(3 << 12) + pages[11 << 12:]
    changed["pages-2.img"] = files["pages-2.img"] + rng.randbytes(2 << 12)
    changed["core-1234.img"] = files["core-1234.img"][:100] + b"new" + files["core-1234.img"][103:]
    for directory, contents in ((first, files), (second, changed)):
        for name, data in contents.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
    return first, second


def tree_digest(directory):
    """Every entry under `directory` with its size and content hash."""
    digest = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            entry = os.lstat(path)
            content = None
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    content = hashlib.sha256(f.read()).hexdigest()
            digest[os.path.relpath(path, directory)] = (entry.st_mode, entry.st_size, content)
    return digest


def test_store_bench_source_dirs_read_in_place(work):
    tools = installed_tools()
    first, second = make_sources(os.path.join(work, "sources"))
    before = [tree_digest(first), tree_digest(second)]
    # --size-mib is ignored: the free-space bound it would set (8x, 8 TiB)
    # would refuse the run.
    report = run_report(work, tools, "--source", f"{first},{second}", "--size-mib", str(1 << 20))
    assert [tree_digest(first), tree_digest(second)] == before, "a source changed"

    sizes = [sum(size for _, size, content in d.values() if content) for d in before]
    assert (f"- data: --source, read in place: ckpt1 = {first}, ckpt2 = {second}; "
            f"ckpt1 {sizes[0]} bytes, ckpt2 {sizes[1]} bytes (logical)") in report
    assert "make_checkpoint_tree" not in report
    assert "Spread over" not in report  # one round
    [(header, rows)] = tables(report)
    check_main_table(header, rows, tools)
    assert [(k, tool) for k, tool, _ in round_lines(report)] == [(1, t) for t in tools]
    assert "gpuckpt's own `stats --json` after import 2: " in report
    if len(tools) > 1:
        for n in (1, 2):
            assert re.search(rf"^gpuckpt import {n} throughput / faster of restic, borg "
                             r"\((restic|borg)\): [\d.]+x$", report, re.M), report


@pytest.mark.parametrize("case", ["missing", "same", "not a directory", "inside the work dir"])
def test_store_bench_refuses_bad_sources(work, case):
    bench_work = os.path.join(work, "bench")
    if case == "inside the work dir":
        # A work dir of an earlier run (its marker in it), which store_bench
        # empties at start: a source in it would be deleted.
        first, second = make_sources(os.path.join(bench_work, "sources"))
        open(os.path.join(bench_work, ".gpuckpt-bench"), "w").close()
    else:
        first, second = make_sources(os.path.join(work, "sources"))
    sources, problem = {
        "missing": ([first, os.path.join(work, "absent")],
                    f"{os.path.join(work, 'absent')} does not exist"),
        "same": ([first, first + "/"], f"{first} and {first} are the same directory"),
        "not a directory": ([first, os.path.join(second, "core-1234.img")],
                            f"{os.path.join(second, 'core-1234.img')} is not a directory"),
        "inside the work dir": ([first, second], f"{first} overlaps the work dir {bench_work}"),
    }[case]
    before = [tree_digest(first), tree_digest(second)]
    r = subprocess.run([STORE_BENCH, "--gpuckpt", GPUCKPT_CLI, "--work", bench_work,
                        "--source", ",".join(sources)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"store_bench: --source: {problem}" in r.stderr, r.stderr
    assert [tree_digest(first), tree_digest(second)] == before
