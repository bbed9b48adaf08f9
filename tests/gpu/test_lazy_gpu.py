"""Lazy restores and GPU processes, on a real GPU.

- `restore --lazy` of root's CUDA process (device memory and a host
  heap) beside `restore --eager` of the same checkpoint: how soon each
  returns, when the lazy one is resident, and that the process checks out
  after both.
- What the driver's restore does with lazily served host memory, measured
  with CRIU alone (its lazy-pages server and `restore --lazy-pages`, with
  the cuda plugin, on the checkpoint's images in the mount): whether the
  restore returns, how long it and the server take, and the process's
  verdict; once with device memory alone, once with 4 GiB of host heap
  beside it (does that part stay lazy after the restore returns?).
  Printed for tests/gpu/README.md; it asserts only that the
  process either checks out or is gone, never left running with wrong
  memory.

Runs on the GPU machine, as root, from the repository root, with the bundle
of tests/gpu/prepare: `python3 -m pytest -s -rs tests/gpu/test_lazy_gpu.py`.
"""

import os
import shutil
import subprocess
import tempfile
import time

import pytest

from gpuckpt_testing import gpu_host
from gpuckpt_testing.mount import status_line
from gpuckpt_testing.processes import kill_if_alive, proc_state, wait_for
from gpuckpt_testing.users import Root
from gpuckpt_testing.workloads import workload_env


pytestmark = gpu_host.skip_unless_runnable(1)
GIB = 2


def gpu_checkpoint(m, host_mib=0):
    more = ["--host-mib", str(host_mib)] if host_mib else []
    wl = m.start("gpu_memory", "--gib", str(GIB), "--idle", *more, env=workload_env())
    wait_for(lambda: status_line(m.mnt, wl.pid, "gpu state") == "running", 60, "gpu state: running")
    made = m.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 60, "the killed CUDA process to go")
    return wl, made


HOST_MIB = 4096


def timed_restore(m, made, mode):
    """`restore` of `made` with `mode` (--eager or --lazy): (seconds until
    the write returned, what `cat restore` said then)."""
    start = time.monotonic()
    ok, err = Root().write(m.path("restore"), m.path("checkpoints", made) + " " + mode,
                           timeout=600)
    took = time.monotonic() - start
    text = Root().read(m.path("restore"))[1]
    assert ok, f"{mode}: {err}; {text}"
    return took, text


def test_a_gpu_tree_restores_lazily_beside_an_eager_restore(bundle_mount):
    """A CUDA process with 2 GiB of device memory and 4 GiB of host heap,
    restored eagerly, killed, and restored lazily from the same checkpoint:
    the lazy restore returns once the device memory is back, the host heap
    follows, and both times the process checks out."""
    m = bundle_mount
    wl, made = gpu_checkpoint(m, HOST_MIB)
    eager_s, said = timed_restore(m, made, "--eager")
    assert said.startswith(f"pid {wl.pid}\nlazy: no (") or said == f"pid {wl.pid}\n", said
    wl.kill()
    lazy_s, said = timed_restore(m, made, "--lazy")
    assert said.startswith(f"pid {wl.pid}\nlazy: yes"), said
    start = time.monotonic()
    wait_for(lambda: "resident: all" in Root().read(m.path("restore"))[1], 300,
             "the lazily restored tree to be resident")
    resident_s = lazy_s + time.monotonic() - start
    final = Root().read(m.path("restore"))[1].strip().splitlines()[-1]
    verdict = wl.verdict()
    print(f"\nGPU tree of {GIB} GiB device memory and {HOST_MIB} MiB host heap: eager restore "
          f"{eager_s:.2f} s; lazy restore returned in {lazy_s:.2f} s, resident after about "
          f"{resident_s:.2f} s ({final}); verdict {verdict}")
    assert verdict == "PASS"


@pytest.mark.parametrize("host_mib", [0, 4096])
def test_what_the_drivers_restore_does_with_lazily_served_host_memory(bundle_mount, bundle,
                                                                      host_mib):
    """CRIU alone, lazily, on the images in the mount (read through it as
    the daemon's lazy restores read them); with host_mib, the process also
    holds that much host heap beside its device memory: whether that part
    stays lazy after the restore returns."""
    m = bundle_mount
    wl, made = gpu_checkpoint(m, host_mib)
    images = m.path("checkpoints", made, "images")
    work = tempfile.mkdtemp(prefix="gpuckpt-gpu-lazy-criu.", dir="/var/tmp")
    criu = bundle.criu
    env = bundle.env()
    env["PATH"] = os.path.dirname(bundle.cuda_checkpoint) + ":" + env["PATH"]
    plugins = bundle.criu_plugins
    server = subprocess.Popen([criu, "lazy-pages", "-D", images, "-W", work, "-o",
                               "lazy-pages.log", "-v4", "--libdir", plugins],
                              env=env, start_new_session=True)
    try:
        wait_for(lambda: os.path.exists(os.path.join(work, "lazy-pages.socket")), 30,
                 "the lazy-pages server to listen")
        start = time.monotonic()
        try:
            r = subprocess.run([criu, "restore", "--lazy-pages", "-D", images, "-W", work,
                                "-o", "restore.log", "-v4", "-d", "--libdir", plugins,
                                "--pidfile", os.path.join(work, "pid"),
                                "--manage-cgroups=ignore"],
                               env=env, capture_output=True, text=True, timeout=300)
            returned = f"exit {r.returncode}"
        except subprocess.TimeoutExpired:
            returned = "no return within 300 s"
        restore_s = time.monotonic() - start
        try:
            server.wait(timeout=300)
            served = f"exit {server.returncode}"
        except subprocess.TimeoutExpired:
            served = "still running after 300 s"
        resident_s = time.monotonic() - start
        alive = proc_state(wl.pid) not in ("", "Z")
        verdict = wl.verdict() if alive else "gone"
        with open(os.path.join(work, "restore.log"), errors="replace") as f:
            restore_errors = [line.strip() for line in f if "Error" in line][-3:]
        with open(os.path.join(work, "lazy-pages.log"), errors="replace") as f:
            log = f.read()
        faults = log.count("#PF at")
        print(f"\nCRIU --lazy-pages, GPU tree of {GIB} GiB and {host_mib} MiB host heap: "
              f"restore {returned} in {restore_s:.2f} "
              f"s; lazy-pages server {served} after {resident_s:.2f} s; {faults} page faults "
              f"served; verdict: {verdict}; restore errors: {restore_errors}")
        assert verdict in ("PASS", "gone"), verdict
    finally:
        kill_if_alive(wl.pid)
        if server.poll() is None:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)
