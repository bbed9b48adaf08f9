"""The GPU machine: its GPUs and driver (nvidia-smi), whether the GPU tests
can run there, the bundle of tests/gpu/prepare and its programs, and
gpuckptfs run from the bundle (Daemon).

The bundle (.gpu-bundle/, made by tests/gpu/prepare on the build machine)
carries gpuckptfs, CRIU, its plugins, cuda-checkpoint and the shared
libraries they need from the build machine. Those libraries are for them
alone: LD_LIBRARY_PATH is set only on the commands that run them (the
daemon, criu, cuda-checkpoint), and the workloads (CUDA programs, python
with PyTorch) run with it unset (gpuckpt_testing.workloads.workload_env).

gpu_bench uses it too, without pytest (which only the pytest paths import).
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

from gpuckpt_testing.build import REPO_ROOT
from gpuckpt_testing.filetools import read_text
from gpuckpt_testing.messages import say
from gpuckpt_testing.workloads import workload_env


BUNDLE = os.path.join(REPO_ROOT, ".gpu-bundle")

PACKED_BUNDLE = BUNDLE + ".tar.gz"

GPU_DIR = os.path.join(REPO_ROOT, "tests", "gpu")

CRIU_LOGS = "/var/lib/gpuckptfs/criu-logs"


def gpu_uuids():
    """nvidia-smi's GPU UUIDs; None when nvidia-smi is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    return [line.replace(" ", "") for line in out.stdout.splitlines() if line.strip()]


def why_not_runnable(gpus_needed=1):
    """None where the GPU tests can run, else why not (they skip saying so)."""
    if os.geteuid() != 0:
        return "needs root (CRIU, FUSE)"
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here: nvidia-smi not found (is the NVIDIA driver installed?)"
    uuids = gpu_uuids()
    # (nvidia-smi that fails is a broken driver, not a machine without a GPU:
    # the tests run and say what nvidia-smi says.)
    if uuids is not None and len(uuids) < gpus_needed:
        if gpus_needed == 1:
            return "no NVIDIA GPU here: nvidia-smi lists none"
        return f"needs {gpus_needed} GPUs; nvidia-smi lists {len(uuids)}"
    if not os.path.isdir(BUNDLE) and not os.path.isfile(PACKED_BUNDLE):
        return (f"no bundle: neither {BUNDLE}/ nor {PACKED_BUNDLE} (run tests/gpu/prepare on the "
                "build machine and copy .gpu-bundle.tar.gz here)")
    if not os.access("/dev/fuse", os.W_OK):
        return "/dev/fuse is not usable here"
    return None


def skip_unless_runnable(gpus_needed=1):
    """A skip mark, saying why, where the GPU tests cannot run. Where they
    must run (GPUCKPT_GPU_REQUIRED=1, as tests/gpu/run-suite and run-ddp
    set it), the test module does not load instead, saying why."""
    import pytest  # pylint: disable=import-outside-toplevel
    why = why_not_runnable(gpus_needed)
    if why is not None and os.environ.get("GPUCKPT_GPU_REQUIRED") == "1":
        raise RuntimeError(f"cannot run here: {why}")
    return pytest.mark.skipif(why is not None, reason=str(why))


def packed_build_info():
    """BUILD-INFO of the packed bundle (who made it, when, from what)."""
    r = subprocess.run(["tar", "-xzOf", PACKED_BUNDLE, ".gpu-bundle/BUILD-INFO"],
                       capture_output=True, check=True)
    return r.stdout


def unpack_bundle():
    """The bundle travels packed (tests/gpu/prepare): unpacked on first use,
    and again when the packed one is another make (its BUILD-INFO differs:
    an unpacked bundle left from an earlier copy of the tree must not
    shadow a newer one), into a temporary directory first, so that an
    interrupted unpack leaves no half bundle behind."""
    if not os.path.isfile(PACKED_BUNDLE):
        return
    if os.path.isdir(BUNDLE):
        try:
            with open(os.path.join(BUNDLE, "BUILD-INFO"), "rb") as f:
                if f.read() == packed_build_info():
                    return
        except FileNotFoundError:
            pass
    tmp = tempfile.mkdtemp(prefix=".gpu-bundle-unpack.", dir=REPO_ROOT)
    try:
        subprocess.run(["tar", "-C", tmp, "-xzf", PACKED_BUNDLE], check=True)
        if os.path.isdir(BUNDLE):
            os.rename(BUNDLE, os.path.join(tmp, "old"))
        os.rename(os.path.join(tmp, ".gpu-bundle"), BUNDLE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Bundle:
    """The bundle's programs, under `root`."""

    def __init__(self, root=BUNDLE):
        self.root = root
        self.lib = os.path.join(root, "lib")
        self.gpuckptfs = os.path.join(root, "bin", "gpuckptfs")
        self.criu = os.path.join(root, "sbin", "criu")
        self.criu_plugins = os.path.join(root, "lib", "criu")
        self.cuda_checkpoint = os.path.join(root, "libexec", "gpuckpt", "cuda-checkpoint")
        self.gpu_memory = os.path.join(root, "bin", "gpu_memory")
        self.wl_reaper = os.path.join(root, "bin", "wl_reaper")

    def env(self):
        """The environment of the bundle's own programs: its libraries, and
        its sbin/ first on PATH (CRIU runs the `ip` found there)."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = self.lib
        env["PATH"] = os.path.join(self.root, "sbin") + ":" + env.get("PATH", "/usr/bin:/bin")
        return env

    def run(self, argv, **kwargs):
        """Runs one of the bundle's programs with the bundle's libraries."""
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, **kwargs)

    def check(self):
        """None when the bundle is complete, its programs executable (the
        copy to the GPU machine may drop modes) and loadable; else what is
        wrong."""
        wanted = [self.gpuckptfs, os.path.join(self.root, "bin", "gpuckpt"), self.criu,
                  self.cuda_checkpoint, self.gpu_memory, self.wl_reaper,
                  os.path.join(self.criu_plugins, "cuda_plugin.so"),
                  os.path.join(self.criu_plugins, "amdgpu_plugin.so")]
        missing = [f for f in wanted if not os.path.isfile(f)]
        if missing:
            return (f"the bundle lacks: {' '.join(missing)} (run tests/gpu/prepare on the build "
                    "machine and copy .gpu-bundle.tar.gz here)")
        for sub in ("bin", "sbin", os.path.join("libexec", "gpuckpt")):
            d = os.path.join(self.root, sub)
            for name in os.listdir(d):
                os.chmod(os.path.join(d, name), 0o755)
        for f in (self.gpuckptfs, self.criu, self.cuda_checkpoint):
            out = self.run([f, "--help"], timeout=60)
            if out.returncode != 0 and "error while loading" in out.stderr:
                return f"{f} does not load: {out.stderr.strip()}"
        out = self.run([self.criu, "--version"], timeout=60)
        if out.returncode != 0:
            return f"{self.criu} --version fails: {(out.stdout + out.stderr).strip()}"
        return None

    def copy_to(self, dest):
        """A copy under `dest` (made 0755). CRIU and cuda-checkpoint run as
        the workloads' owner when an ordinary user checkpoints, so they,
        their libraries and CRIU's plugins must be where that user can
        reach them, which a repository under /root is not."""
        os.makedirs(dest, exist_ok=True)
        os.chmod(dest, 0o755)
        subprocess.run(["cp", "-a", self.root + "/.", dest + "/"], check=True)
        subprocess.run(["chmod", "-R", "go+rX", dest], check=True)
        return Bundle(dest)

    def commit(self):
        """The commit the bundle was built from (the GPU machine's copy of
        .git may be older than the working tree that travelled)."""
        try:
            with open(os.path.join(self.root, "BUILD-INFO")) as f:
                for line in f:
                    if line.startswith("commit: ") and line[8:].strip():
                        return line[8:].strip()
        except OSError:
            pass
        return "unknown"


def nvidia_smi(*args, timeout=60):
    out = subprocess.run(["timeout", str(timeout), "nvidia-smi", *args], capture_output=True,
                         text=True, errors="replace")
    return out.returncode, out.stdout, out.stderr


def driver_version():
    rc, out, _ = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    return out.split()[0] if rc == 0 and out.split() else ""


def torch_version(run_as, extra=""):
    """What `python3 -c 'import torch; ...'` prints last as the workloads'
    user (no bundle libraries)."""
    code = "import torch; print(torch.__version__" + extra + ")"
    try:
        out = subprocess.run(["timeout", "120"] + run_as.prefix + ["python3", "-c", code],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", env=workload_env())
    except OSError as e:
        return str(e)
    lines = out.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def mounted(path):
    return subprocess.run(["mountpoint", "-q", path]).returncode == 0


def unmount(path, bundle):
    """fusermount3 of the system, else the bundle's; umount as the last resort."""
    if not mounted(path):
        return
    fm = shutil.which("fusermount3") or os.path.join(bundle.root, "bin", "fusermount3")
    for argv in ([fm, "-u", path], [fm, "-u", "-z", path], ["umount", "-l", path]):
        if subprocess.run(argv, capture_output=True).returncode == 0:
            return


class Daemon:
    """gpuckptfs in the foreground, a child of this process, with the
    bundle's libraries, mounting `mnt` on a store at `store`."""

    def __init__(self, bundle, store, mnt, log, prog, extra_args=()):
        self.bundle, self.store, self.mnt, self.log, self.prog = bundle, store, mnt, log, prog
        self.extra_args = list(extra_args)  # more gpuckptfs options
        self.pid = None
        self.proc = None

    def start(self):
        """Returns None once mounted, else why not (within 60 s)."""
        os.makedirs(self.store, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        b = self.bundle
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [b.gpuckptfs, "--store", self.store, "--criu", b.criu, "--criu-plugin-dir",
                 b.criu_plugins, "--lock-timeout", "30000", *self.extra_args, "--foreground",
                 self.mnt],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=b.env())
        self.pid = self.proc.pid
        for _ in range(600):
            if mounted(self.mnt) and os.path.exists(os.path.join(self.mnt, "restore")):
                return None
            if self.proc.poll() is not None:
                self.pid = None
                return f"gpuckptfs exited before mounting {self.mnt}; its log:\n" + self.log_tail()
            time.sleep(0.1)
        return f"gpuckptfs did not mount {self.mnt} within 60 s; its log:\n" + self.log_tail()

    def log_tail(self, lines=20):
        return "\n".join(read_text(self.log).splitlines()[-lines:])

    def stop(self):
        """Unmounts, then waits (30 s) for the daemon to exit."""
        unmount(self.mnt, self.bundle)
        if self.proc is None:
            return
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            say(self.prog, f"warning: gpuckptfs {self.proc.pid} still runs 30 s after unmount; "
                "killing it")
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        self.pid = None

    def ids(self):
        """The checkpoint ids in the store, sorted."""
        try:
            return sorted(os.listdir(os.path.join(self.mnt, "checkpoints")))
        except OSError:
            return []

    def status(self, pid):
        """<pid>/status, or what reading it said."""
        try:
            with open(os.path.join(self.mnt, str(pid), "status"), errors="replace") as f:
                return f.read()
        except OSError as e:
            return f"cat: {e}"

    def status_line(self, pid, key):
        """The first line of <pid>/status that starts with key (or "")."""
        for line in self.status(pid).splitlines():
            if line.startswith(key):
                return line
        return ""

    def gpu_running(self, pid):
        return "gpu state: running" in self.status(pid).splitlines()


def manifest_get(path, key):
    """A manifest value, at the top level or in "extra" (the store's own
    fields are at the top, the engine's in extra)."""
    with open(path) as f:
        m = json.load(f)
    return m.get(key, m.get("extra", {}).get(key))


def new_ids(before, after):
    return [i for i in after if i not in set(before)]


def elapsed(t0):
    return f"{time.monotonic() - t0:.2f}"
