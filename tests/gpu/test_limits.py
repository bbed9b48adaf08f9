"""On a real GPU: a checkpoint that host memory or the store's disk cannot
hold is refused before anything is locked, and the process runs on.

- A CUDA process holding more device memory than the host has free memory
  (the driver would move all of it into host memory): the owner's
  `checkpoint` fails at once with ENOMEM, `last:` says why, and the process
  runs on with its GPU and checks out.
- The same for a store on a filesystem smaller than the process's device
  memory: ENOSPC.

Runs on the GPU machine, as root, from the repository root, with the bundle
of tests/gpu/prepare (.gpu-bundle/): `python3 -m pytest -q tests/gpu/test_limits.py`.
Uses the integration tests' Mount (gpuckpt_testing.mount) with the
bundle's gpuckptfs, CRIU and gpu_memory.
"""

import errno
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from gpuckpt_testing import build, gpu_host
from gpuckpt_testing.gpu_host import BUNDLE
from gpuckpt_testing.mount import Mount, status_line
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.users import User

USER = "gpuckpt-gpu-limits"


def why_not_runnable():
    if os.geteuid() != 0:
        return "needs root (gpuckptfs, CRIU)"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found: no NVIDIA driver here"
    # The bundle travels packed (tests/gpu/prepare): unpacked on first use,
    # on a GPU machine only.
    gpu_host.unpack_bundle()
    if not os.path.isfile(os.path.join(BUNDLE, "bin", "gpuckptfs")):
        return (f"no bundle at {BUNDLE} (run tests/gpu/prepare on the build machine and copy "
                ".gpu-bundle.tar.gz here)")
    return None


WHY_NOT = why_not_runnable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


@pytest.fixture(scope="module")
def bundle():
    """A copy of the bundle the ordinary user can reach (the repository may
    be under /root), with gpuckpt_testing.build pointed at it."""
    where = tempfile.mkdtemp(prefix="gpuckpt-gpu-limits-bundle.", dir="/var/tmp")
    os.chmod(where, 0o755)
    subprocess.run(["cp", "-a", BUNDLE + "/.", where], check=True)
    subprocess.run(["chmod", "-R", "go+rX", where], check=True)
    build.GPUCKPTFS = os.path.join(where, "bin", "gpuckptfs")
    build.WORKLOAD_BIN = os.path.join(where, "bin")
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def user():
    return User(USER)


def daemon_options(where):
    return ("--criu", os.path.join(where, "sbin", "criu"),
            "--criu-plugin-dir", os.path.join(where, "lib", "criu"))


def daemon_env(where):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(where, "lib")
    return env


def workload_env():
    """The workloads use the machine's own libraries, never the bundle's."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    return env


def mem_available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def gpu_free_bytes():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return int(out.split()[0]) << 20


def proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def refused_at_once(mount, user, wl, expected_errno, words):
    """The owner's checkpoint fails with `expected_errno` within seconds,
    `last:` has `words`, nothing is published, and the process runs on
    with its GPU and checks out."""
    before = set(os.listdir(mount.path("checkpoints")))
    start = time.monotonic()
    ok, error = user.write(mount.path(str(wl.pid), "ctl"), "checkpoint", timeout=300)
    took = time.monotonic() - start
    last = status_line(mount.mnt, wl.pid, "last")
    assert not ok, f"the checkpoint succeeded: {last}"
    assert error == os.strerror(expected_errno), f"{error}; last: {last}"
    assert words in last, last
    # Before anything is locked: no driver checkpoint of tens of GiB ran.
    assert took < 30, f"refused only after {took:.1f} s: {last}"
    assert set(os.listdir(mount.path("checkpoints"))) == before
    assert proc_state(wl.pid) not in ("T", "t")
    assert status_line(mount.mnt, wl.pid, "gpu state") == "running"
    assert wl.verdict() == "PASS"
    print(f"refused in {took:.2f} s: {last}")


class GpuMount(Mount):
    """Mount with the bundle's daemon (its libraries on its own
    LD_LIBRARY_PATH only)."""

    def __init__(self, where, prefix, store=None):
        super().__init__(prefix, *daemon_options(where), store=store, env=daemon_env(where))

    def start_gpu(self, user, gib):
        return self.start("gpu_memory", "--gib", str(gib), user=user, env=workload_env())


def test_device_memory_beyond_free_host_memory(bundle, user):
    available = mem_available_bytes()
    gib = available // (1 << 30) + 4
    if (gib << 30) + (2 << 30) > gpu_free_bytes():
        pytest.skip(f"the GPU has {gpu_free_bytes() >> 30} GiB free, not the {gib + 2} GiB needed "
                    f"to hold more than the host's {available >> 30} GiB of free memory")
    mount = GpuMount(bundle, "gpuckpt-gpu-limits-memory.")
    try:
        wl = mount.start_gpu(user, gib)
        wait_for(lambda: status_line(mount.mnt, wl.pid, "gpu state") == "running", 30,
                 "gpu state: running")
        refused_at_once(mount, user, wl, errno.ENOMEM, "host memory")
    finally:
        mount.close()


def test_store_on_a_small_filesystem(bundle, user):
    small = tempfile.mkdtemp(prefix="gpuckpt-gpu-limits-small.", dir="/var/tmp")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,mode=0700", "tmpfs", small], check=True)
    try:
        mount = GpuMount(bundle, "gpuckpt-gpu-limits-disk.", store=os.path.join(small, "store"))
        try:
            wl = mount.start_gpu(user, 2)
            wait_for(lambda: status_line(mount.mnt, wl.pid, "gpu state") == "running", 30,
                     "gpu state: running")
            refused_at_once(mount, user, wl, errno.ENOSPC, "store's disk")
        finally:
            mount.close()
    finally:
        subprocess.run(["umount", "-l", small])
        os.rmdir(small)
