"""GPU jobs as people run them, on a real GPU, through the mount:

- a CUDA process as the init of a container made as runc and the NVIDIA
  container toolkit make one (tests/workloads/toolkit-container: its own
  mount, pid, uts, ipc and net namespaces, /dev/nvidia* and the driver's
  libraries bound in), written `checkpoint --kill` into its init's ctl and
  restored; its device memory must check out; the same for a PyTorch
  training run (train.py), whose losses must equal a run straight
  through;
- a process using CUDA managed memory (cudaMallocManaged, touched from the
  host and the device), which the driver cannot checkpoint: refused with
  ENOTSUP before anything is locked or frozen, the process running on and
  checking out (its mappings of the NVIDIA device files are printed);
- a tree of three processes on one GPU (a parent and two children, each
  with a context of its own, one of them idle), checkpointed through the
  parent's ctl as an ordinary user, killed and restored;
- two processes of two ordinary users on one GPU, each checkpointed by its
  owner while the other runs on, one of them killed and restored.

Each prints what it measured for tests/gpu/README.md. Runs on the GPU
machine, as root, from the repository root, with the bundle of
tests/gpu/prepare: `python3 -m pytest -s -rs tests/gpu/test_gpu_jobs.py`.
"""

import errno
import os
import shutil
import subprocess
import time

import pytest

from gpuckpt_testing import build, gpu_host
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import status_line
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.toolkit_container import ToolkitContainer
from gpuckpt_testing.users import Root, User
from gpuckpt_testing.workloads import workload_env

pytestmark = gpu_host.skip_unless_runnable(1)
GIB = 1


@pytest.fixture
def users():
    return User("gpuckpt-gpu-jobs-a"), User("gpuckpt-gpu-jobs-b")


def wait_gpu_running(m, pid):
    wait_for(lambda: status_line(m.mnt, pid, "gpu state") == "running", 60,
             f"gpu state: running for {pid}")


def restore(m, ckpt, user=None):
    """Restores through the restore file; (seconds, what it says)."""
    start = time.monotonic()
    ok, err, said = m.try_restore(m.path("checkpoints", ckpt), user=user, timeout=600)
    took = time.monotonic() - start
    assert ok, f"restore of {ckpt}: {err}; {said}\n{m.diagnostics()}"
    return took, said


def nvidia_mappings(pid):
    """The process's mappings of NVIDIA device files: for each file, the
    sizes (KiB) and permissions of its mappings."""
    found = {}
    for line in read(f"/proc/{pid}/maps").splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith("/dev/nvidia"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.setdefault(fields[5], []).append(f"{(end - start) >> 10}K {fields[1]}")
    return found


def test_a_cuda_container_is_checkpointed_through_its_init_and_restored(bundle_mount):
    m = bundle_mount
    binary = os.path.join(m.work, "gpu_memory")
    shutil.copy(os.path.join(build.WORKLOAD_BIN, "gpu_memory"), binary)
    container = ToolkitContainer(m.work, [binary, "--gib", str(GIB)], env=workload_env())
    try:
        wait_for(lambda: os.path.isdir(m.path(str(container.pid))), 30,
                 "the container's init to appear in the mount")
        wait_gpu_running(m, container.pid)
        mountinfo = read(f"/proc/{container.pid}/mountinfo")
        devices = sorted({f.split()[4] for f in mountinfo.splitlines()
                          if f.split()[4].startswith("/dev/nvidia")})
        libraries = sum(1 for f in mountinfo.splitlines() if "libcuda.so" in f.split()[4])
        assert devices and libraries, mountinfo
        start = time.monotonic()
        ckpt = m.checkpoint(container.pid, "--kill")
        ckpt_s = time.monotonic() - start
        first = container.pid
        wait_for(lambda: not os.path.exists(f"/proc/{first}"), 60, "the killed container to go")
        restore_s, said = restore(m, ckpt)
        restored = container.find_restored()
        assert restored is not None and said.splitlines()[0] == f"pid {restored}", said
        verdict = container.verdict()
        print(f"\nCUDA container ({GIB} GiB; devices {devices}, {libraries} libcuda bind "
              f"mount(s)): checkpoint --kill {ckpt_s:.2f} s, restore {restore_s:.2f} s, "
              f"verdict {verdict}")
        assert verdict == "PASS"
    finally:
        container.close()


TRAIN_STEPS = 200


def test_a_pytorch_container_is_checkpointed_through_its_init_and_restored(bundle_mount):
    """train.py (seeded, deterministic) as a container's init, killed by its
    checkpoint mid-run and restored: its log of losses must equal, byte for
    byte, that of a run straight through outside any container."""
    m = bundle_mount
    train = os.path.join(m.work, "train.py")
    shutil.copy(os.path.join(os.path.dirname(__file__), "train.py"), train)
    python = shutil.which("python3")
    reference = os.path.join(m.work, "reference.log")
    r = subprocess.run([python, train, "--steps", str(TRAIN_STEPS), "--step-ms", "50", "--log",
                        reference, "--ready", reference + ".ready"], env=workload_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    log = os.path.join(m.work, "container.log")
    ready = log + ".ready"
    # The image's Python: this machine's, and its environment where that
    # is not under /usr (a virtual environment, as /opt/...).
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                            text=True, check=True).stdout.strip()
    binds = [] if os.path.realpath(prefix).startswith("/usr/") else [prefix]
    container = ToolkitContainer(m.work, [python, train, "--steps", str(TRAIN_STEPS), "--step-ms",
                                          "50", "--log", log, "--ready", ready],
                                 binds=binds, env=workload_env(), ready=ready)
    try:
        wait_for(lambda: os.path.isdir(m.path(str(container.pid))), 30,
                 "the container's init to appear in the mount")
        wait_gpu_running(m, container.pid)
        start = time.monotonic()
        ckpt = m.checkpoint(container.pid, "--kill")
        ckpt_s = time.monotonic() - start
        first = container.pid
        wait_for(lambda: not os.path.exists(f"/proc/{first}"), 60, "the killed container to go")
        assert not os.path.exists(log), "the run ended before its checkpoint"
        restore_s, said = restore(m, ckpt)
        restored = container.find_restored()
        assert restored is not None and said.splitlines()[0] == f"pid {restored}", said
        wait_for(lambda: os.path.exists(log), 300, "the restored run to end")
        same = read(log) == read(reference)
        print(f"\nPyTorch container (train.py, {TRAIN_STEPS} steps): checkpoint --kill "
              f"{ckpt_s:.2f} s, restore {restore_s:.2f} s, log equal to a run straight "
              f"through: {same}")
        assert same, (read(log)[-500:], read(reference)[-500:])
    finally:
        container.close()


def test_managed_memory_is_refused_before_anything_is_frozen(bundle_mount):
    """The driver cannot checkpoint managed memory (CUDA_ERROR_NOT_SUPPORTED
    from cuCheckpointProcessCheckpoint, after CRIU froze the tree): the
    daemon refuses such a process first, from its mappings, with ENOTSUP and
    a reason, and it runs on untouched. A plain CUDA process beside it shows
    what its mappings look like without managed memory."""
    m = bundle_mount
    wl = m.start("gpu_memory", "--gib", str(GIB), "--managed", env=workload_env())
    wait_gpu_running(m, wl.pid)
    managed_maps = nvidia_mappings(wl.pid)
    plain = m.start("gpu_memory", "--gib", str(GIB), env=workload_env())
    wait_gpu_running(m, plain.pid)
    plain_maps = nvidia_mappings(plain.pid)
    plain.assert_passes("the plain process beside")
    before = set(m.ids())
    start = time.monotonic()
    ok, err = Root().write(m.path(str(wl.pid), "ctl"), "checkpoint --kill", timeout=600)
    refused_s = time.monotonic() - start
    last = m.last(wl.pid)
    print(f"\nmanaged memory ({GIB} GiB): {'taken' if ok else 'refused'} in {refused_s:.2f} s "
          f"({err}; {last})\n  mappings, managed: {managed_maps}\n  mappings, plain:   "
          f"{plain_maps}")
    assert not ok and err == os.strerror(errno.ENOTSUP), (err, last)
    assert "CUDA managed memory" in last and "nothing was locked or frozen" in last, last
    assert set(m.ids()) == before
    assert status_line(m.mnt, wl.pid, "gpu state") == "running"
    wl.assert_passes("after the refusal")


def test_a_tree_of_three_processes_on_one_gpu_comes_back_whole(bundle_mount, users):
    m = bundle_mount
    a, _ = users
    wl = m.start("gpu_memory", "--gib", str(GIB), "--children", "2", user=a,
                 env=workload_env())
    wait_gpu_running(m, wl.pid)
    children = [int(p) for p in read(f"/proc/{wl.pid}/task/{wl.pid}/children").split()]
    assert len(children) == 2, children
    start = time.monotonic()
    ckpt = m.checkpoint(wl.pid, "--kill", user=a)
    ckpt_s = time.monotonic() - start
    wait_for(wl.gone, 60, "the killed tree to go")
    restore_s, said = restore(m, ckpt, user=a)
    assert said.splitlines()[0] == f"pid {wl.pid}", said
    again = sorted(int(p) for p in read(f"/proc/{wl.pid}/task/{wl.pid}/children").split())
    assert again == sorted(children), (again, children)
    verdict = wl.verdict()
    print(f"\ntree of 3 on one GPU ({GIB} GiB each, one idle), as {a.name}: checkpoint --kill "
          f"{ckpt_s:.2f} s, restore {restore_s:.2f} s, verdict {verdict}")
    assert verdict == "PASS"


def test_two_users_on_one_gpu_each_checkpoint_their_own(bundle_mount, users):
    m = bundle_mount
    a, b = users
    wa = m.start("gpu_memory", "--gib", str(GIB), user=a, env=workload_env())
    wb = m.start("gpu_memory", "--gib", str(GIB), user=b, env=workload_env())
    wait_gpu_running(m, wa.pid)
    wait_gpu_running(m, wb.pid)
    start = time.monotonic()
    m.checkpoint(wa.pid, user=a)  # a's runs on, and so does b's
    a_first_s = time.monotonic() - start
    assert wb.alive()
    ok, err = b.write(m.path(str(wa.pid), "ctl"), "checkpoint")
    assert not ok, "b checkpointed a's process"
    start = time.monotonic()
    m.checkpoint(wb.pid, user=b)  # b's runs on, and so does a's
    b_s = time.monotonic() - start
    assert wa.alive()
    start = time.monotonic()
    ckpt = m.checkpoint(wa.pid, "--kill", user=a)
    a_kill_s = time.monotonic() - start
    wait_for(wa.gone, 60, "a's killed process to go")
    assert wb.alive()
    restore_s, said = restore(m, ckpt, user=a)
    assert said.splitlines()[0] == f"pid {wa.pid}", said
    verdicts = (wa.verdict(), wb.verdict())
    print(f"\ntwo users on one GPU ({GIB} GiB each): a's checkpoint {a_first_s:.2f} s, "
          f"--kill {a_kill_s:.2f} s, restore {restore_s:.2f} s; b's checkpoint {b_s:.2f} s; "
          f"verdicts {verdicts}")
    assert verdicts == ("PASS", "PASS")
