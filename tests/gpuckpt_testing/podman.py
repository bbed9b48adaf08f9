"""Podman for the container tests: Debian's podman with runc, on a storage
of its own (its --root and --runroot in a fresh directory, removed
afterwards), and an image made here from Debian's static busybox (no
registry is needed).

Three settings make Podman run on machines like the test machines: a
containers.conf without default rlimits (raising them needs
CAP_SYS_RESOURCE, which root in a container may lack), runc (crun refuses
a hybrid cgroup v1/v2 layout) and the cgroupfs manager (no systemd). And
runc runs Podman's CRIU with CRIU_FAULT=130 (system calls traced instead
of a hardware breakpoint): some virtual machines accept a breakpoint and
never fire it, and CRIU then waits forever (gpuckpt finds that out for its
own CRIU; Podman's knows nothing of it).
"""

import os
import shutil
import subprocess
import tempfile
import time

from gpuckpt_testing import build

BUSYBOX = "/bin/busybox"
IMAGE = "localhost/gpuckpt-test-busybox:1"
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"

[engine.runtimes]
runc = ["{runc}"]
"""
RUNC = """\
#!/bin/sh
CRIU_FAULT=130 exec {runc} "$@"
"""


def why_podman_cannot_run():
    """None when Podman, runc and a static busybox are here, else why not."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (tools/setup installs it)"
    if not os.access(BUSYBOX, os.X_OK):
        return f"no static busybox at {BUSYBOX} to build the test image from (busybox-static)"
    return None


class Podman:
    """`podman` on a storage of its own; `close()` removes its containers,
    unmounts and deletes the storage."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gpuckpt-podman.", dir="/var/tmp")
        runc = os.path.join(self.dir, "runc")
        with open(runc, "w") as f:
            f.write(RUNC.format(runc=shutil.which("runc")))
        os.chmod(runc, 0o755)
        conf = os.path.join(self.dir, "containers.conf")
        with open(conf, "w") as f:
            f.write(CONTAINERS_CONF.format(runc=runc))
        self.env = dict(os.environ, CONTAINERS_CONF=conf)
        self.args = ["podman", "--root", os.path.join(self.dir, "storage"),
                     "--runroot", os.path.join(self.dir, "run")]
        self._build_image()

    def run(self, *args, check=True, timeout=120):
        """Runs `podman ARGS`; its stdout, stripped."""
        r = subprocess.run(self.args + list(args), capture_output=True, text=True,
                           env=self.env, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout.strip()

    def _build_image(self):
        rootfs = os.path.join(self.dir, "rootfs")
        for d in ("bin", "tmp", "proc", "sys", "dev", "etc", "run"):
            os.makedirs(os.path.join(rootfs, d))
        shutil.copy(BUSYBOX, os.path.join(rootfs, "bin", "busybox"))
        for applet in ("sh", "sleep", "cat", "echo"):
            os.symlink("busybox", os.path.join(rootfs, "bin", applet))
        # wl_memory (workload.h) at /bin/wl_memory, with the shared
        # libraries it needs at their paths here.
        wl_memory = os.path.join(build.WORKLOAD_BIN, "wl_memory")
        shutil.copy(wl_memory, os.path.join(rootfs, "bin", "wl_memory"))
        ldd = subprocess.run(["ldd", wl_memory], capture_output=True, text=True, check=True)
        for line in ldd.stdout.splitlines():
            lib = [w for w in line.split() if w.startswith("/")]
            if lib:
                dest = os.path.join(rootfs, lib[0].lstrip("/"))
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copy(lib[0], dest)
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        r = subprocess.run(self.args + ["import", "-", IMAGE], stdin=tar.stdout,
                           capture_output=True, text=True, env=self.env, timeout=120)
        tar.stdout.close()
        assert tar.wait() == 0 and r.returncode == 0, f"podman import failed: {r.stderr}"

    def start_counter(self, name, *options):
        """A container whose init writes a number a line into /tmp/out in the
        container, one more every 0.2 s; its pid on this host."""
        script = ('exec >/tmp/out 2>&1 </dev/null; i=0; '
                  'while :; do echo $i; i=$((i+1)); sleep 0.2; done')
        self.run("run", "-d", "--name", name, *options, IMAGE, "sh", "-c", script)
        return int(self.run("inspect", "-f", "{{.State.Pid}}", name))

    def start_memory(self, name, mib, *options):
        """A container whose init is wl_memory holding `mib` MiB that do not
        change; its pid on this host, once the memory is built."""
        self.run("run", "-d", "--name", name, *options, IMAGE, "sh", "-c",
                 f"exec /bin/wl_memory /tmp/result --mib {mib} </dev/null >/dev/null 2>&1")
        rootfs = self.run("mount", name)
        ready = os.path.join(rootfs, "tmp", "result.ready")
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            assert time.monotonic() < deadline, f"wl_memory in {name} did not get ready"
            time.sleep(0.05)
        return int(self.run("inspect", "-f", "{{.State.Pid}}", name))

    def close(self):
        self.run("rm", "-af", "-t", "0", check=False)
        self.run("rmi", "-af", check=False)
        subprocess.run(["umount", "-R", "-l", os.path.join(self.dir, "storage", "overlay")],
                       capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def last_count(out_path):
    """The last number the counter wrote, or -1 before its first."""
    try:
        with open(out_path) as f:
            lines = [line for line in f.read().split("\n") if line.strip().isdigit()]
    except FileNotFoundError:
        return -1
    return int(lines[-1]) if lines else -1
