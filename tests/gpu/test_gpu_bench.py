"""tests/gpu/gpu_bench without a GPU: what can be checked on any machine.

- its options: sizes, repetitions, where the store and the report go, and
  the ones it refuses (exit 2, saying why);
- the command lines of its anchor, plain CRIU with the bundle's
  cuda_plugin and libraries, and of the driver's cuda-checkpoint;
- the report (Markdown and JSON) made from rows of measurements: every
  row, the sums, the medians and ratios of the frozen times, the read
  rates, "-" for what was not measured;
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

GPU_DIR = os.path.dirname(os.path.abspath(__file__))
GPU_BENCH = os.path.join(GPU_DIR, "gpu_bench")
sys.path.insert(0, GPU_DIR)
import gpurun  # noqa: E402  (after the path is set)


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
    assert args.out == os.path.realpath(os.path.join(gpurun.REPO_ROOT, "out", "gpu-bench"))
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
    (["--gib", "8", "--store", gpurun.REPO_ROOT], "refusing to use"),
    (["--gib", "8", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_options_are_refused_saying_why(capsys, argv, said):
    with pytest.raises(SystemExit) as e:
        gb.parse_args(argv, environ={})
    assert e.value.code == 2
    assert said in capsys.readouterr().err


# --- the command lines --------------------------------------------------------------------


def test_the_anchor_is_the_bundles_criu_with_its_cuda_plugin_and_libraries():
    bundle = gpurun.Bundle("/b")
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
    bundle = gpurun.Bundle("/b")
    assert gb.cuda_checkpoint_command(bundle, "lock", 77, "--timeout", "60000") == [
        "timeout", "-k", "5", "600", "/b/libexec/gpuckpt/cuda-checkpoint", "--action", "lock",
        "--pid", "77", "--timeout", "60000"]
    assert gb.cuda_checkpoint_command(bundle, "unlock", 77)[-4:] == [
        "--action", "unlock", "--pid", "77"]


# --- the report ---------------------------------------------------------------------------

MACHINE = {"gpu": "NVIDIA H200, GPU-x, 143771 MiB, 570.00", "cpus": "16", "ram": "125.7 GiB",
           "kernel": "6.8.0", "criu": "Version: 4.1", "store": "/s/store (ext4 on /dev/x)",
           "tmpfs": "/dev/shm 60 GiB free", "bundle": "built from abc123"}


def rows_of_two_reps():
    rows = []
    for rep, (criu_stall, gp_stall) in enumerate(((2.0, 1.0), (4.0, 1.5)), start=1):
        rows.append({"kind": "gpu_memory", "gib": "8 GiB", "rep": rep, "method": "driver",
                     "verdict": "PASS", "lock_s": 0.25, "checkpoint_s": 1.5, "restore_s": 2.0,
                     "unlock_s": 0.5, "stall_s": 2.2, "host_rss_kib": 8400000})
        rows.append({"kind": "gpu_memory", "gib": "8 GiB", "rep": rep, "method": "criu",
                     "verdict": "PASS", "checkpoint_s": 6.0, "stall_s": criu_stall,
                     "frozen_s": 5.0, "bytes": 8600000000, "restore_s": 7.0})
        rows.append({"kind": "gpu_memory", "gib": "8 GiB", "rep": rep, "method": "gpuckpt",
                     "verdict": "PASS", "ckpt1_s": 9.0, "ckpt1_stall_s": gp_stall,
                     "ckpt1_frozen_s": 2.5, "ckpt1_logical": 8600000000,
                     "ckpt1_new": 8500000000, "ckpt1_stored": 8500000100, "ckpt2_s": 3.0,
                     "ckpt2_stall_s": gp_stall, "ckpt2_frozen_s": None,
                     "ckpt2_logical": 8600000000, "ckpt2_new": 1000, "ckpt2_chunks": 2050,
                     "ckpt2_base_chunks": 2048, "restore_s": 8.0, "read_cold_s": 4.0,
                     "read_cold_bytes": 8000000000, "disk_cold_s": 2.0,
                     "disk_cold_bytes": 8000000000})
    rows.append({"kind": "pytorch", "gib": "PyTorch 6 GB", "rep": 1, "method": "driver",
                 "verdict": "FAIL: after the driver's checkpoint and restore: FAIL: layer 3"})
    rows.append({"kind": "pytorch", "gib": "PyTorch 6 GB", "rep": 1, "method": "criu",
                 "verdict": "skipped: /dev/shm has 3 GiB free, needs 8"})
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
    # Per repetition: driver, plain CRIU, gpuckpt's 1st and 2nd; then the
    # failed and the skipped row.
    assert [r[2].split(":")[0].split(",")[0] for r in main] == (
        ["cuda-checkpoint", "plain CRIU + cuda_plugin", "gpuckpt", "gpuckpt"] * 2
        + ["cuda-checkpoint", "plain CRIU + cuda_plugin"])
    assert all(len(r) == 8 for r in main), main
    driver = main[0]
    assert driver[:3] == ["8 GiB", "1", "cuda-checkpoint: lock + checkpoint (0.25 + 1.50) / "
                                        "restore + unlock (2.00 + 0.50)"]
    assert driver[3:] == ["1.75", "2.200 / -", "2.50", "-", "PASS"]
    assert main[1][3:] == ["6.00", "2.000 / 5.000", "7.00", "image 8,600,000,000", "PASS"]
    assert main[2][3:] == ["9.00", "1.000 / 2.500", "-",
                           "logical 8,600,000,000, new 8,500,000,000, stored 8,500,000,100",
                           "PASS"]
    assert main[3][3:] == ["3.00", "1.000 / -", "8.00", "logical 8,600,000,000, new 1,000; "
                           "chunks found unchanged in the 1st: 2,048 of 2,050", "PASS"]
    assert main[8] == ["PyTorch 6 GB", "1", "cuda-checkpoint: lock + checkpoint (- + -) / "
                       "restore + unlock (- + -)", "-", "- / -", "-", "-",
                       "FAIL: after the driver's checkpoint and restore: FAIL: layer 3"]
    assert main[9][-1] == "skipped: /dev/shm has 3 GiB free, needs 8"

    frozen = table(md, "| workload | reps | driver lock .. unlock")
    # Medians of two: plain CRIU (2 + 4) / 2 = 3, gpuckpt (1 + 1.5) / 2 = 1.25.
    assert frozen[0] == ["8 GiB", "2", "2.200", "3.000 / 5.000", "1.250 (0.42x) / 2.500 (0.50x)",
                         "1.250 (0.42x) / - (-)"]
    assert frozen[1] == ["PyTorch 6 GB", "1", "-", "- / -", "- (-) / - (-)", "- (-) / - (-)"]
    assert doc["frozen"]["8 GiB"]["criu_stall_s"] == 3.0
    assert doc["frozen"]["8 GiB"]["ckpt1_stall_ratio"] == "0.42x"

    reads = table(md, "| workload | reps | cold `cat`")
    assert reads == [["8 GiB", "2", "2.00", "4.00", "0.50x"], ["PyTorch 6 GB", "0", "-", "-", "-"]]
    assert md.rstrip().endswith("('-': not reported).")
    assert doc["machine"] == MACHINE and len(doc["rows"]) == 8
    json.dumps(doc)  # what gpu-bench.json holds


def test_report_is_written_and_printed(tmp_path, capsys):
    rows = rows_of_two_reps()
    gb.write_report(str(tmp_path / "out"), rows, MACHINE)
    md = (tmp_path / "out" / "gpu-bench.md").read_text()
    assert md == gb.report(rows, MACHINE)[0]
    assert md in capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "gpu-bench.json").read_text())
    assert [r["method"] for r in doc["rows"]][:3] == ["driver", "criu", "gpuckpt"]


# --- where it cannot run --------------------------------------------------------------------


def test_without_a_gpu_it_fails_loudly_and_says_where_its_report_goes(tmp_path):
    why = gpurun.why_not_runnable()
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
