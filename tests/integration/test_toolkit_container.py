"""A container made the way runc and the NVIDIA container toolkit make one
(tests/workloads/toolkit-container, no container engine): a workload as
the init of its own mount, pid, uts, ipc and net namespaces, on a tmpfs
root with this machine's /usr and /etc, device nodes and library files
bound in. Written `checkpoint --kill` into its init's ctl, then restored
through the restore file: the container comes back whole (namespaces,
host name, bind mounts) and its memory checks out, with nothing asked of
the user beyond that. This machine has no GPU: tests/gpu/test_gpu_jobs.py
runs the same with /dev/nvidia* and the driver's libraries on a GPU.

Run by ctest under wl_reaper; needs root, /dev/fuse and CRIU (skipped,
saying why, where one is missing)."""

import os
import shutil
import subprocess

import pytest

from gpuckpt_testing import build
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.toolkit_container import ToolkitContainer

WHY_NOT = why_not_runnable("wl_memory") or (
    None if shutil.which("unshare") and shutil.which("pivot_root")
    else "no unshare or pivot_root (util-linux)")
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def a_library_file():
    """A real shared library of this machine, bound over its own path as the
    toolkit binds the driver's (the workload does not load it)."""
    for name in ("libz.so.1", "libzstd.so.1", "liblz4.so.1"):
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
            path = os.path.realpath(os.path.join(d, name))
            if os.path.isfile(path):
                return path
    pytest.skip("no libz, libzstd or liblz4 to bind as a driver library")


def namespaces(pid):
    return {ns: os.readlink(f"/proc/{pid}/ns/{ns}") for ns in ("mnt", "pid", "uts", "ipc", "net")}


def test_a_container_init_is_checkpointed_through_its_ctl_and_restored():
    mount = Mount("gpuckpt-container.")
    container = None
    try:
        binary = os.path.join(mount.work, "wl_memory")
        shutil.copy(os.path.join(build.WORKLOAD_BIN, "wl_memory"), binary)
        library = a_library_file()
        container = ToolkitContainer(mount.work, [binary, "--mib", "64"], files=[library])
        ours = namespaces("self")
        theirs = namespaces(container.pid)
        assert all(theirs[ns] != ours[ns] for ns in ours), (theirs, ours)
        wait_for(lambda: os.path.isdir(mount.path(str(container.pid))), 10,
                 "the container's init to appear in the mount")

        ckpt = mount.checkpoint(container.pid, "--kill")
        first = container.pid
        wait_for(lambda: not os.path.exists(f"/proc/{first}"), 30, "the killed container to go")
        ok, err, said = mount.try_restore(mount.path("checkpoints", ckpt))
        assert ok, f"restore: {err}; {said}\n{mount.diagnostics()}"
        assert said.startswith("pid "), said
        restored = container.find_restored()
        assert restored is not None and said.splitlines()[0] == f"pid {restored}", said
        # The same kinds of namespaces, new ones, and what was in them.
        again = namespaces(restored)
        assert all(again[ns] != ours[ns] for ns in ours), (again, ours)
        hostname = subprocess.run(["nsenter", "--uts", "-t", str(restored), "hostname"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        assert hostname == "container", hostname
        mountinfo = read(f"/proc/{restored}/mountinfo")
        for where in ("/usr", "/etc", "/dev/null", "/dev/shm", "/proc", "/sys", library,
                      mount.work):
            assert f" {where} " in mountinfo, (where, mountinfo)
        assert container.verdict() == "PASS"
    finally:
        if container is not None:
            container.close()
        mount.close()
