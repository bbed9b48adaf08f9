"""tests/gpu/gpu_bench without a GPU: what can be checked on any machine.

- its options: sizes, repetitions, where the store and the report go, and
  the ones it refuses (exit 2, saying why);
- the command lines of its anchor, plain CRIU with the bundle's
  cuda_plugin and libraries, and of the driver's cuda-checkpoint;
- the report (Markdown and JSON) made from rows of measurements: every
  row, the sums, the medians and ratios of the frozen times, of the times
  to durable and of the warm and cold restores, the read rates, "-" for
  what was not measured;
- the stall meter of its PyTorch workload (tests/gpu/stall_meter.py): a
  stall of the main loop counts even when the step it held up ends after
  the SIGUSR2 that asks for it;
- run where it cannot run (no GPU, not root, no bundle), it exits 2 saying
  why and where its report would have gone, and touches no store.

The measurements themselves need the GPU machine: see tests/gpu/README.md.
"""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from gpuckpt_testing import build, gpu_host
from gpuckpt_testing.gpu_host import GPU_DIR

# Beside this file (pytest puts the directory of a test file on the path).
import stall_meter  # noqa: E402  pylint: disable=wrong-import-order

GPU_BENCH = os.path.join(GPU_DIR, "gpu_bench")


def load_gpu_bench():
    loader = importlib.machinery.SourceFileLoader("gpu_bench", GPU_BENCH)
    spec = importlib.util.spec_from_loader("gpu_bench", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gb = load_gpu_bench()


# --- options ------------------------------------------------------------------------------


def test_options_give_the_sizes_in_order_and_absolute_paths(tmp_path):
    args = gb.parse_args(["--gib", "8,32", "--torch-gb", "6", "--reps", "3", "--store",
                          str(tmp_path / "s" / ".." / "store"), "--out", str(tmp_path / "out")],
                         environ={})
    assert (args.gib, args.torch_gb, args.reps) == ([8, 32], [6], 3)
    assert args.store == os.path.realpath(tmp_path / "store")
    assert args.out == os.path.realpath(tmp_path / "out")
    assert gb.workloads(args) == [("gpu_memory", 8), ("gpu_memory", 32), ("pytorch", 6)]
    assert gb.report_paths(args.out) == [os.path.join(args.out, n) for n in
                                         ("gpu-bench.json", "gpu-bench.md",
                                          "gpu-bench-logs.tar.gz")]


def test_options_default_to_the_disk_and_to_out_or_OUT(tmp_path):
    args = gb.parse_args(["--torch-gb", "2"], environ={})
    assert (args.gib, args.torch_gb, args.reps) == ([], [2], 1)
    assert args.store == "/var/tmp/gpuckpt-gpu-bench"
    assert args.out == os.path.realpath(os.path.join(build.REPO_ROOT, "out", "gpu-bench"))
    args = gb.parse_args(["--gib", "1"], environ={"OUT": str(tmp_path)})
    assert args.out == os.path.realpath(tmp_path)


@pytest.mark.parametrize("argv,said", [
    ([], "give --gib, --torch-gb or both"),
    (["--gib", "0"], "--gib takes sizes in GiB, comma-separated"),
    (["--gib", "8,"], "--gib takes sizes in GiB, comma-separated"),
    (["--gib", "8 GiB"], "--gib takes sizes in GiB, comma-separated"),
    (["--torch-gb", "-6"], "--torch-gb takes sizes in GB, comma-separated"),
    (["--gib", "8", "--reps", "0"], "must be a positive integer"),
    (["--gib", "8", "--store", "/var/tmp/"], "refusing to use /var/tmp as the store's parent"),
    (["--gib", "8", "--store", "/"], "refusing to use / as the store's parent"),
    (["--gib", "8", "--store", build.REPO_ROOT], "refusing to use"),
    (["--gib", "8", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_options_are_refused_saying_why(capsys, argv, said):
    with pytest.raises(SystemExit) as e:
        gb.parse_args(argv, environ={})
    assert e.value.code == 2
    assert said in capsys.readouterr().err


# --- the command lines --------------------------------------------------------------------


def test_the_anchor_is_the_bundles_criu_with_its_cuda_plugin_and_libraries():
    bundle = gpu_host.Bundle("/b")
    argv, env = gb.criu_command(bundle, gb.criu_dump_args(1234, "/dev/shm/gpuckpt-gpu-bench-8"),
                                environ={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    assert argv == ["timeout", "-k", "5", "600", "/b/sbin/criu", "dump", "-t", "1234",
                    "-D", "/dev/shm/gpuckpt-gpu-bench-8", "--leave-running", "-o", "dump.log",
                    "-v2", "--libdir", "/b/lib/criu"]
    # cuda_plugin runs the cuda-checkpoint it finds first on PATH: the
    # bundle's, the one gpuckpt's daemon uses too.
    assert env["PATH"] == "/b/libexec/gpuckpt:/usr/bin:/bin"
    assert os.path.join(env["PATH"].split(":")[0], "cuda-checkpoint") == bundle.cuda_checkpoint
    assert env["LD_LIBRARY_PATH"] == "/b/lib" and env["HOME"] == "/root"

    argv, _ = gb.criu_command(bundle, gb.criu_restore_args("/dev/shm/gpuckpt-gpu-bench-8"),
                              environ={})
    assert argv == ["timeout", "-k", "5", "600", "/b/sbin/criu", "restore",
                    "-D", "/dev/shm/gpuckpt-gpu-bench-8", "-d", "-o", "restore.log", "-v2",
                    "--libdir", "/b/lib/criu"]


def test_the_driver_alone_is_the_bundles_cuda_checkpoint():
    bundle = gpu_host.Bundle("/b")
    assert gb.cuda_checkpoint_command(bundle, "lock", 77, "--timeout", "60000") == [
        "timeout", "-k", "5", "600", "/b/libexec/gpuckpt/cuda-checkpoint", "--action", "lock",
        "--pid", "77", "--timeout", "60000"]
    assert gb.cuda_checkpoint_command(bundle, "unlock", 77)[-4:] == [
        "--action", "unlock", "--pid", "77"]


# --- the report ---------------------------------------------------------------------------

MACHINE = {"gpu": "NVIDIA H200, GPU-x, 143771 MiB, 570.00", "cpus": "16", "ram": "125.7 GiB",
           "kernel": "6.8.0", "criu": "Version: 4.1", "store": "/s/store (ext4 on /dev/x)",
           "tmpfs": "/dev/shm 60 GiB free", "bundle": "built from abc123"}


# Per repetition of 8 GiB: plain CRIU into tmpfs (checkpoint, restore),
# into the store's disk (dump, sync, restore cold), gpuckpt (1st, 2nd
# checkpoint, restore warm, cold).
TIMES = ({"criu": (6.0, 7.0), "criu_disk": (10.0, 2.5, 9.0), "gpuckpt": (9.0, 3.0, 8.0, 12.0)},
         {"criu": (8.0, 5.0), "criu_disk": (11.0, 3.5, 11.0), "gpuckpt": (11.0, 4.0, 6.0, 13.0)})


def rows_of_two_reps():
    rows = []
    for rep, (criu_stall, gp_stall) in enumerate(((2.0, 1.0), (4.0, 1.5)), start=1):
        times = TIMES[rep - 1]
        rows.append({"kind": "gpu_memory", "gib": "8 GiB", "rep": rep, "method": "driver",
                     "verdict": "PASS", "lock_s": 0.25, "checkpoint_s": 1.5, "restore_s": 2.0,
                     "unlock_s": 0.5, "stall_s": 2.2, "host_rss_kib": 8400000})
        rows.append({"kind": "gpu_memory", "gib": "8 GiB", "rep": rep, "method": "criu",
                     "verdict": "PASS", "checkpoint_s": times["criu"][0], "stall_s": criu_stall,
                     "frozen_s": 5.0, "bytes": 8600000000, "restore_s": times["criu"][1]})
        dump, sync, restore_cold = times["criu_disk"]
        rows.append({"kind": "gpu_memory", "gib": "8 GiB", "rep": rep, "method": "criu_disk",
                     "verdict": "PASS", "checkpoint_s": dump, "sync_s": sync,
                     "durable_s": dump + sync, "stall_s": criu_stall + 0.5, "frozen_s": 5.5,
                     "bytes": 8600000000, "restore_cold_s": restore_cold})
        ckpt1, ckpt2, restore_warm, restore_cold = times["gpuckpt"]
        rows.append({"kind": "gpu_memory", "gib": "8 GiB", "rep": rep, "method": "gpuckpt",
                     "verdict": "PASS", "ckpt1_s": ckpt1, "ckpt1_stall_s": gp_stall,
                     "ckpt1_frozen_s": 2.5, "ckpt1_logical": 8600000000,
                     "ckpt1_new": 8500000000, "ckpt1_stored": 8500000100, "ckpt2_s": ckpt2,
                     "ckpt2_stall_s": gp_stall, "ckpt2_frozen_s": None,
                     "ckpt2_logical": 8600000000, "ckpt2_new": 1000, "ckpt2_chunks": 2050,
                     "ckpt2_base_chunks": 2048, "restore_s": restore_warm,
                     "restore_cold_s": restore_cold, "read_cold_s": 4.0,
                     "read_cold_bytes": 8000000000, "disk_cold_s": 2.0,
                     "disk_cold_bytes": 8000000000})
    rows.append({"kind": "pytorch", "gib": "PyTorch 6 GB", "rep": 1, "method": "driver",
                 "verdict": "FAIL: after the driver's checkpoint and restore: FAIL: layer 3"})
    rows.append({"kind": "pytorch", "gib": "PyTorch 6 GB", "rep": 1, "method": "criu",
                 "verdict": "skipped: /dev/shm has 3 GiB free, needs 8"})
    rows.append({"kind": "pytorch", "gib": "PyTorch 6 GB", "rep": 1, "method": "criu_disk",
                 "verdict": "skipped: /var/tmp/gpuckpt-gpu-bench has 5 GiB free, needs 8"})
    return rows


def table(md, header_start):
    """The rows (cells) of the Markdown table whose header starts so."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        out.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return out


def test_report_has_every_row_sum_median_and_ratio():
    md, doc = gb.report(rows_of_two_reps(), MACHINE)
    assert md.startswith("# gpu_bench\n\n- gpu: NVIDIA H200, GPU-x, 143771 MiB, 570.00\n- cpus: "
                         "16\n"), md
    assert "- bundle: built from abc123\n" in md

    main = table(md, "| workload | rep | method |")
    # Per repetition: driver, plain CRIU into tmpfs and into the disk,
    # gpuckpt's 1st and 2nd; then the failed and the skipped rows.
    assert [r[2].split(":")[0].split(",")[0] for r in main] == (
        ["cuda-checkpoint", "plain CRIU + cuda_plugin", "plain CRIU + cuda_plugin", "gpuckpt",
         "gpuckpt"] * 2
        + ["cuda-checkpoint", "plain CRIU + cuda_plugin", "plain CRIU + cuda_plugin"])
    assert all(len(r) == 8 for r in main), main
    driver = main[0]
    assert driver[:3] == ["8 GiB", "1", "cuda-checkpoint: lock + checkpoint (0.25 + 1.50) / "
                                        "restore + unlock (2.00 + 0.50)"]
    assert driver[3:] == ["1.75", "2.200 / -", "2.50", "-", "PASS"]
    assert main[1][2:] == ["plain CRIU + cuda_plugin, tmpfs", "6.00", "2.000 / 5.000", "7.00",
                           "image 8,600,000,000", "PASS"]
    # Into the disk: the checkpoint column is time to durable, dump + sync
    # (10 + 2.5); the restore column the cold restore.
    assert main[2][2:] == ["plain CRIU + cuda_plugin, store's disk + sync (dump 10.00 + sync "
                           "2.50), cold restore", "12.50", "2.500 / 5.500", "9.00",
                           "image 8,600,000,000", "PASS"]
    assert main[3][3:] == ["9.00", "1.000 / 2.500", "-",
                           "logical 8,600,000,000, new 8,500,000,000, stored 8,500,000,100",
                           "PASS"]
    # The restores of the 2nd checkpoint: warm / cold.
    assert main[4][2:] == ["gpuckpt, 2nd checkpoint (unchanged), restore of it warm / cold",
                           "3.00", "1.000 / -", "8.00 / 12.00", "logical 8,600,000,000, new "
                           "1,000; chunks found unchanged in the 1st: 2,048 of 2,050", "PASS"]
    assert main[7][3:6] == ["14.50", "4.500 / 5.500", "11.00"]
    assert main[9][5] == "6.00 / 13.00"
    assert main[10] == ["PyTorch 6 GB", "1", "cuda-checkpoint: lock + checkpoint (- + -) / "
                        "restore + unlock (- + -)", "-", "- / -", "-", "-",
                        "FAIL: after the driver's checkpoint and restore: FAIL: layer 3"]
    assert main[11][-1] == "skipped: /dev/shm has 3 GiB free, needs 8"
    assert main[12][3:] == ["-", "- / -", "-", "image -",
                            "skipped: /var/tmp/gpuckpt-gpu-bench has 5 GiB free, needs 8"]

    frozen = table(md, "| workload | reps | driver lock .. unlock")
    # Medians of two: plain CRIU (2 + 4) / 2 = 3, gpuckpt (1 + 1.5) / 2 = 1.25.
    assert frozen[0] == ["8 GiB", "2", "2.200", "3.000 / 5.000", "1.250 (0.42x) / 2.500 (0.50x)",
                         "1.250 (0.42x) / - (-)"]
    assert frozen[1] == ["PyTorch 6 GB", "1", "-", "- / -", "- (-) / - (-)", "- (-) / - (-)"]
    assert doc["frozen"]["8 GiB"]["criu_stall_s"] == 3.0
    assert doc["frozen"]["8 GiB"]["ckpt1_stall_ratio"] == "0.42x"

    durable = table(md, "| workload | reps | plain CRIU into tmpfs |")
    # Medians of two: plain CRIU into tmpfs (6 + 8) / 2 = 7, restore (7 + 5)
    # / 2 = 6; into the disk (12.5 + 14.5) / 2 = 13.5, cold restore (9 + 11)
    # / 2 = 10; gpuckpt's 1st (9 + 11) / 2 = 10: 10 / 7 = 1.43x, 10 / 13.5 =
    # 0.74x; 2nd (3 + 4) / 2 = 3.5: 0.50x, 0.26x; warm (8 + 6) / 2 = 7:
    # 7 / 6 = 1.17x; cold (12 + 13) / 2 = 12.5: 12.5 / 10 = 1.25x.
    assert durable[0] == ["8 GiB", "2", "7.00", "13.50", "10.00 (1.43x / 0.74x)",
                          "3.50 (0.50x / 0.26x)", "6.00", "7.00 (1.17x)", "10.00",
                          "12.50 (1.25x)"]
    assert durable[1] == ["PyTorch 6 GB", "1", "-", "-", "- (- / -)", "- (- / -)", "-", "- (-)",
                          "-", "- (-)"]
    assert md.index("Time to durable and restores, seconds, medians over the repetitions") > \
        md.index("| workload | reps | driver lock .. unlock")
    assert doc["durable"]["8 GiB"] == {
        "criu_tmpfs_s": 7.0, "criu_disk_durable_s": 13.5,
        "ckpt1_s": 10.0, "ckpt1_tmpfs_ratio": "1.43x", "ckpt1_disk_ratio": "0.74x",
        "ckpt2_s": 3.5, "ckpt2_tmpfs_ratio": "0.50x", "ckpt2_disk_ratio": "0.26x",
        "criu_tmpfs_restore_s": 6.0, "restore_warm_s": 7.0, "restore_warm_ratio": "1.17x",
        "criu_disk_restore_cold_s": 10.0, "restore_cold_s": 12.5, "restore_cold_ratio": "1.25x"}
    assert doc["durable"]["PyTorch 6 GB"]["restore_cold_ratio"] == "-"

    reads = table(md, "| workload | reps | cold `cat`")
    assert reads == [["8 GiB", "2", "2.00", "4.00", "0.50x"], ["PyTorch 6 GB", "0", "-", "-", "-"]]
    assert md.rstrip().endswith("('-': not reported).")
    assert doc["machine"] == MACHINE and len(doc["rows"]) == 11
    json.dumps(doc)  # what gpu-bench.json holds


def test_report_is_written_and_printed(tmp_path, capsys):
    rows = rows_of_two_reps()
    gb.write_report(str(tmp_path / "out"), rows, MACHINE)
    md = (tmp_path / "out" / "gpu-bench.md").read_text()
    assert md == gb.report(rows, MACHINE)[0]
    assert md in capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "gpu-bench.json").read_text())
    assert [r["method"] for r in doc["rows"]][:4] == ["driver", "criu", "criu_disk", "gpuckpt"]
    assert tuple(r["method"] for r in doc["rows"][:4]) == gb.METHODS


# --- the stall meter of the PyTorch workloads --------------------------------------------


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Signals:
    """SIGUSR2 as the meter's thread sees it: `pending` sent, not yet taken."""

    def __init__(self):
        self.pending = 0

    def __call__(self):
        if not self.pending:
            return False
        self.pending -= 1
        return True


def pytorch_meter(pause_s=0.1):
    clock = Clock()
    meter = stall_meter.StallMeter("/nonexistent/result.stall", pause_s, write=None, clock=clock)
    return meter, clock


def wakes(meter, clock, signals, start, end, every=0.001):
    """The meter's thread waking from start to end (inclusive), every
    `every` seconds; the answers it gives meanwhile: [(when, stall)]."""
    answers = []
    n = 0
    while start + n * every <= end + 1e-9:
        clock.now = start + n * every
        stall = meter.wake(signals)
        if stall is not None:
            answers.append((clock.now, stall))
        n += 1
    return answers


def step_ends(meter, clock, when):
    clock.now = when
    meter.step_done()


def test_the_stall_meter_waits_for_the_step_held_up_by_the_drivers_lock():
    meter, clock = pytorch_meter()
    signals = Signals()
    # Steps end at 0.10 and 0.25 (0.05 s beyond the pause); the next one,
    # begun at 0.35, is held by the driver's lock until 2.35 and ends at
    # 2.40. The meter's thread makes no CUDA call: it wakes every 1 ms
    # throughout.
    assert wakes(meter, clock, signals, 0.0, 0.1) == []
    step_ends(meter, clock, 0.1)
    assert wakes(meter, clock, signals, 0.101, 0.25) == []
    step_ends(meter, clock, 0.25)
    assert wakes(meter, clock, signals, 0.251, 2.359) == []
    # SIGUSR2 right after the unlock, before the held-up step ends: no
    # answer yet (else it would be the thread's 1 ms gaps alone)...
    signals.pending = 1
    assert wakes(meter, clock, signals, 2.36, 2.38) == []
    # ... and a second SIGUSR2 meanwhile is left for the next answer.
    signals.pending = 1
    assert wakes(meter, clock, signals, 2.381, 2.399) == []
    assert signals.pending == 1
    step_ends(meter, clock, 2.4)
    # Answered at the next wake-up: 2.40 - 0.25 - 0.10, the pause.
    [(when, stall)] = wakes(meter, clock, signals, 2.401, 2.401)
    assert stall == pytest.approx(2.05)
    # A new interval: the second SIGUSR2, taken now, answers once the next
    # step ends, with that step's 0.05 s alone.
    assert wakes(meter, clock, signals, 2.402, 2.55) == []
    assert signals.pending == 0
    step_ends(meter, clock, 2.55)
    [(when, stall)] = wakes(meter, clock, signals, 2.551, 2.56)
    assert when == pytest.approx(2.551) and stall == pytest.approx(0.05)


def test_the_stall_meter_answers_within_10_s_when_no_step_ends():
    meter, clock = pytorch_meter()
    signals = Signals()
    step_ends(meter, clock, 0.0)
    # The loop has ended (no more steps); the thread was frozen 0.5 s.
    assert wakes(meter, clock, signals, 0.0, 1.0, every=0.25) == []
    assert wakes(meter, clock, signals, 1.5, 2.0, every=0.25) == []
    signals.pending = 1
    assert wakes(meter, clock, signals, 2.5, 12.25, every=0.25) == []
    # 10 s after the signal was taken: what it has, the frozen 0.5 s.
    assert wakes(meter, clock, signals, 12.5, 12.5) == [(12.5, 0.5)]


# --- where it cannot run --------------------------------------------------------------------


def test_without_a_gpu_it_fails_loudly_and_says_where_its_report_goes(tmp_path):
    why = gpu_host.why_not_runnable()
    if why is None:
        pytest.skip("this machine could run the benchmark (root, a GPU, the bundle): the "
                    "refusal is checked where one of them is missing")
    store = tmp_path / "store"
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, GPU_BENCH, "--gib", "1", "--store", str(store),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"gpu_bench: the report goes to {out}/gpu-bench.md" in r.stderr, r.stderr
    assert f"gpu_bench: error: cannot run here: {why}" in r.stderr, r.stderr
    assert not store.exists() and not out.exists()
