"""What the GPU tests (test_suite.py, test_ddp.py) share: the bundle's
programs and how to run them, the mount, the workloads' user, the
workloads, waits.

gpu_bench uses it too, without pytest (which only the pytest paths import).

The bundle (.gpu-bundle/, made by tests/gpu/prepare on the build machine)
carries gpuckptfs, CRIU, its plugins, cuda-checkpoint and the shared
libraries they need from the build machine. Those libraries are for them
alone: LD_LIBRARY_PATH is set only on the commands that run them (the
daemon, criu, cuda-checkpoint), and the workloads (CUDA programs, python
with PyTorch) run with it unset.

Restored processes are orphans. Where PID 1 does not reap (a bare
container init) they would stay zombies that hold their pid, and the same
checkpoint could not be restored twice; so the test process makes itself a
child subreaper (`become_subreaper`) and every wait here reaps the zombies
it has (`reap`). It reaps only inside these waits, never while a
subprocess.run is in flight, so no command's exit status is lost.
"""

import ctypes
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLE = os.path.join(REPO_ROOT, ".gpu-bundle")
PACKED_BUNDLE = BUNDLE + ".tar.gz"
GPU_DIR = os.path.join(REPO_ROOT, "tests", "gpu")
CRIU_LOGS = "/var/lib/gpuckptfs/criu-logs"
USER_NAME_RE = re.compile(r"[a-z_][a-z0-9_-]*")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]


DEFAULTS = {"reps": 5, "gib": 2, "steps": 50, "ddp_steps": 100, "ddp_gpus": 2,
            "time_budget": 500, "as_user": "gpuckpt-gpu-suite", "out": None, "keep": False}

# The PASS/FAIL lines of the run, repeated at the end of pytest's report.
RESULT_LINES = []


def option(config, name):
    """An option's value (its default where tests/gpu/conftest.py was loaded
    too late to register the options, e.g. `pytest tests`)."""
    return config.getoption(name, default=DEFAULTS[name])


def out_dir(config, default_name):
    """--out, else $OUT, else out/<default_name> under the repository root."""
    d = option(config, "out") or os.environ.get("OUT") or os.path.join(
        REPO_ROOT, "out", default_name)
    return os.path.realpath(d)


class Failure(AssertionError):
    """A check failed; the message says why."""


def fail(why):
    raise Failure(why)


def say(prog, text):
    print(f"{prog}: {text}", file=sys.stderr, flush=True)


# --- where the tests can run ------------------------------------------------------------


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


def unpack_bundle():
    """The bundle travels packed (tests/gpu/prepare): unpacked on first use,
    into a temporary directory first, so that an interrupted unpack leaves
    no half bundle behind."""
    if os.path.isdir(BUNDLE) or not os.path.isfile(PACKED_BUNDLE):
        return
    tmp = tempfile.mkdtemp(prefix=".gpu-bundle-unpack.", dir=REPO_ROOT)
    try:
        subprocess.run(["tar", "-C", tmp, "-xzf", PACKED_BUNDLE], check=True)
        os.rename(os.path.join(tmp, ".gpu-bundle"), BUNDLE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def become_subreaper():
    """Orphans below this process (restored trees) become its children."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    if libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"PR_SET_CHILD_SUBREAPER: {os.strerror(err)}")


def stop_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def reap():
    """Reaps every zombie child (exited workloads, restored orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# --- the bundle ---------------------------------------------------------------------------


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
        """The environment of the bundle's own programs."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = self.lib
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


# --- the workloads' user ------------------------------------------------------------------


class RunAs:
    """Who the workloads belong to: an ordinary user (made when there is no
    such user, removed by `cleanup`), with their own groups, HOME and no
    capabilities, or root (`name` "root")."""

    def __init__(self, name, home):
        self.name = name
        self.created = False
        self.uid = self.gid = 0
        self.prefix = []
        if name == "root":
            return
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            made = subprocess.run(["useradd", "--system", "--user-group", "--home-dir", home,
                                   "--shell", "/usr/sbin/nologin", name],
                                  capture_output=True, text=True)
            if made.returncode != 0:
                fail(f"cannot make user {name} (useradd failed: {made.stderr.strip()})")
            self.created = True
        self.uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True,
                                      check=True).stdout)
        self.gid = int(subprocess.run(["id", "-g", name], capture_output=True, text=True,
                                      check=True).stdout)
        os.makedirs(home, exist_ok=True)
        os.chown(home, self.uid, self.gid)
        self.prefix = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
                       "--inh-caps=-all", "env", f"HOME={home}", f"USER={name}", f"LOGNAME={name}"]

    def cleanup(self):
        if self.created:
            subprocess.run(["userdel", self.name], capture_output=True)
            self.created = False

    def give(self, *dirs):
        """The directories (made if missing) belong to the workloads' user."""
        for d in dirs:
            os.makedirs(d, exist_ok=True)
            if self.uid != 0:
                os.chown(d, self.uid, self.gid)

    def run(self, argv, timeout=60):
        """argv as this user; stdout and stderr together, as text."""
        try:
            out = subprocess.run(self.prefix + argv, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace",
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, f"no answer within {timeout} s"
        return out.returncode, out.stdout

    def cat(self, path):
        """What `cat path` prints as this user (errors too), trailing newlines
        dropped."""
        return self.run(["cat", path])[1].rstrip("\n")

    def write(self, path, text, seconds):
        """Writes text + newline into a control file as this user, waiting at
        most `seconds`. Returns (exit status, what the shell said)."""
        argv = ["timeout", "-k", "5", str(seconds)] + self.prefix + [
            "bash", "-c", 'printf "%s\\n" "$2" >"$1"', "_", path, text]
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace")
        said = out.stdout.rstrip("\n")
        if out.returncode in (124, 137):
            said = f"no answer within {seconds} s (write of '{text}' to {path})"
        return out.returncode, said


ROOT = None  # RunAs("root"), made on first use by as_root()


def as_root():
    global ROOT
    if ROOT is None:
        ROOT = RunAs("root", "/root")
    return ROOT


# --- processes ----------------------------------------------------------------------------


def proc_state(pid):
    """The one-letter state of a process ("" if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def parent_of(pid):
    """The parent's pid of a process ("" if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def session_members(sid):
    """The pids of the processes of session sid (zombies too)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[3] == str(sid):
            members.append(int(name))
    return members


def wait_for(path, seconds):
    """Until path exists; False after `seconds`."""
    for _ in range(int(seconds * 10)):
        if os.path.exists(path):
            return True
        reap()
        time.sleep(0.1)
    return os.path.exists(path)


def gone(pid, seconds):
    """Until no process of session pid is left (zombies reaped)."""
    for _ in range(int(seconds * 10)):
        reap()
        if not os.path.exists(f"/proc/{pid}") and not session_members(pid):
            return True
        time.sleep(0.1)
    return False


def end_session(pid):
    """Kills the session of pid (the workloads lead their own sessions,
    restored ones too) and waits (30 s) until it is gone."""
    pid = int(pid)
    if pid <= 1 or pid == os.getsid(0):
        return True
    for member in session_members(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except OSError:
            pass
    return gone(pid, 30)


def workload_env():
    """The workloads use the machine's own libraries, never the bundle's."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    return env


def start_session(run_as, directory, argv):
    """Starts argv as the workloads' user in its own session (so CRIU needs
    no --shell-job), in `directory` (made theirs), stdin from /dev/null,
    output to directory/out.log (theirs), without the bundle's libraries. Its pid
    goes to directory/launch.pid and is returned."""
    run_as.give(directory)
    with open(os.path.join(directory, "out.log"), "wb") as out:
        # Theirs too: a process of the job may keep it open (the resource
        # tracker of torch.multiprocessing does), and a restore, run as
        # the user, must open it again.
        if run_as.uid != 0:
            os.fchown(out.fileno(), run_as.uid, run_as.gid)
        p = subprocess.Popen(run_as.prefix + argv, cwd=directory, stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT, env=workload_env(),
                             start_new_session=True)
    with open(os.path.join(directory, "launch.pid"), "w") as f:
        f.write(f"{p.pid}\n")
    # The child is reaped by reap(); the Popen object is not waited on.
    p.returncode = 0
    return p.pid


def read_text(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def tail(path, n):
    """The last n characters of a file ("" when it cannot be read)."""
    return read_text(path)[-n:]


def wait_ready(ready, seconds, launch_pid_file=None):
    """Until the workload announced itself: its pid (from the ready file), or
    None on timeout, or at once when the launched process has exited
    without announcing itself."""
    launched = read_text(launch_pid_file).strip() if launch_pid_file else ""
    for _ in range(int(seconds * 10)):
        if os.path.exists(ready):
            break
        reap()
        if launched and not os.path.exists(f"/proc/{launched}"):
            time.sleep(0.2)  # (it may have written the file just before it exited)
            if os.path.exists(ready):
                break
            return None
        time.sleep(0.1)
    if not os.path.exists(ready):
        return None
    pid = read_text(ready).strip()
    return int(pid) if pid.isdigit() else None


def verdict(pid, result):
    """SIGUSR1, then the verdict within 120 s and the process gone. Returns
    (passed, what happened)."""
    try:
        os.unlink(result)
    except FileNotFoundError:
        pass
    if not os.path.exists(f"/proc/{pid}"):
        return False, f"pid {pid} is not running"
    os.kill(pid, signal.SIGUSR1)
    if not wait_for(result, 120):
        return False, f"no verdict from pid {pid} within 120 s (state: {proc_state(pid)})"
    said = read_text(result).rstrip("\n")
    passed = said == "PASS"
    if not gone(pid, 30):
        said = f"{said}; pid {pid} still there 30 s after its verdict"
    return passed and said == "PASS", said


# --- the mount ----------------------------------------------------------------------------


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


def file_bytes(tree):
    """The bytes of the regular files under tree."""
    total = 0
    for d, _, names in os.walk(tree):
        for n in names:
            st = os.lstat(os.path.join(d, n))
            if (st.st_mode & 0o170000) == 0o100000:
                total += st.st_size
    return total


def first_difference(a, b, lines=4):
    """Where two text files first differ, and up to `lines` differing lines."""
    ta, tb = read_text(a).splitlines(), read_text(b).splitlines()
    where = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    diff = [d for d in difflib.unified_diff(ta, tb, lineterm="", n=0)
            if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    return f"{a} {b} differ: line {where + 1}; " + "|".join(diff[:lines])


def same_file(a, b):
    return subprocess.run(["cmp", "-s", a, b]).returncode == 0


def dmesg_tail(dest, lines):
    out = subprocess.run(["dmesg"], capture_output=True, text=True, errors="replace")
    with open(dest, "w") as f:
        f.write("\n".join(out.stdout.splitlines()[-lines:]) + "\n")


def pack(tarball, work, name):
    """tar.gz of work/name (the logs)."""
    with tarfile.open(tarball, "w:gz") as t:
        t.add(os.path.join(work, name), arcname=name)


def elapsed(t0):
    return f"{time.monotonic() - t0:.2f}"


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


def nvidia_smi(*args, timeout=60):
    out = subprocess.run(["timeout", str(timeout), "nvidia-smi", *args], capture_output=True,
                         text=True, errors="replace")
    return out.returncode, out.stdout, out.stderr


def driver_version():
    rc, out, _ = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    return out.split()[0] if rc == 0 and out.split() else ""


# --- a run ----------------------------------------------------------------------------------


class GpuWork:
    """A run's work directory under /var/tmp (removed at the end unless
    --keep): the bundle copied where the workloads' user reaches it, that
    user, the daemon's mount and store, the logs; at the end the summary and
    the logs tarball go into the output directory."""

    def __init__(self, config, prog, prefix, out_name, summary_name, tarball_name, dmesg_lines):
        self.prog = prog
        self.keep = option(config, "keep")
        self.out = out_dir(config, out_name)
        self.summary_name, self.tarball_name, self.dmesg_lines = (summary_name, tarball_name,
                                                                  dmesg_lines)
        import pytest  # pylint: disable=import-outside-toplevel
        unpack_bundle()
        why = Bundle().check()
        if why:
            pytest.fail(why, pytrace=False)
        # Restored processes are orphans: this process reaps them.
        become_subreaper()
        # A SIGTERM (a timeout's) ends the run as Ctrl-C does: through the
        # fixtures' teardown, which ends the workloads and unmounts.
        signal.signal(signal.SIGTERM, stop_on_signal)
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
        self.mnt = os.path.join(self.work, "mnt")
        self.logs = os.path.join(self.work, "logs")
        self.summary = os.path.join(self.logs, "summary.txt")
        self.sessions = []
        self.user = None
        self.daemon = None
        self.closed = False
        os.makedirs(self.mnt)
        os.makedirs(self.logs)
        # The workloads' user reaches the mount, its programs and its
        # directories through the work directory, but lists nothing in it.
        os.chmod(self.work, 0o711)
        try:
            self.user = RunAs(option(config, "as_user"), os.path.join(self.work, "home"))
            # The workloads, CRIU and cuda-checkpoint run from the work
            # directory: the repository may sit where that user cannot reach it.
            self.bundle = Bundle().copy_to(os.path.join(self.work, "bundle"))
            self.daemon = Daemon(self.bundle, os.path.join(self.work, "store"), self.mnt,
                                 os.path.join(self.logs, "daemon.log"), prog)
        except BaseException:
            self.close()
            raise

    def install(self, name):
        """A file of tests/gpu copied beside the bundle's programs (0644)."""
        dest = os.path.join(self.bundle.root, name)
        shutil.copyfile(os.path.join(GPU_DIR, name), dest)
        os.chmod(dest, 0o644)
        return dest

    def say(self, text):
        say(self.prog, text)

    def note(self, text):
        """Into the summary, and to stderr."""
        with open(self.summary, "a") as f:
            f.write(text + "\n")
        self.say(text)

    def session(self, pid):
        """A workload's session, killed at the end if still there."""
        self.sessions.append(int(pid))

    def start_daemon(self):
        import pytest  # pylint: disable=import-outside-toplevel
        why = self.daemon.start()
        if why:
            pytest.fail(f"gpuckptfs does not mount: {why}", pytrace=False)
        self.say(f"gpuckptfs mounted on {self.mnt}, store {self.daemon.store}, "
                 f"daemon pid {self.daemon.pid}")

    def launched_pids(self):
        """The pids of every workload launched under the work directory."""
        pids = []
        skip = {self.mnt, os.path.join(self.work, "store"), os.path.join(self.work, "bundle")}
        for d, dirs, names in os.walk(self.work):
            dirs[:] = [x for x in dirs if os.path.join(d, x) not in skip]
            if "launch.pid" in names:
                text = read_text(os.path.join(d, "launch.pid")).strip()
                if text.isdigit():
                    pids.append(int(text))
        return pids

    def close(self):
        if self.closed:
            return
        self.closed = True
        for sid in self.sessions + self.launched_pids():
            end_session(sid)
        if self.daemon:
            self.daemon.stop()
        if self.user:
            self.user.cleanup()
        try:
            shutil.copyfile(self.summary, os.path.join(self.out, self.summary_name))
        except OSError:
            pass
        dmesg_tail(os.path.join(self.logs, "dmesg-tail.txt"), self.dmesg_lines)
        tarball = os.path.join(self.out, self.tarball_name)
        try:
            pack(tarball, self.work, "logs")
        except OSError as e:
            self.say(f"warning: could not write {tarball}: {e}")
        if self.keep:
            self.say(f"work dir kept: {self.work}")
        else:
            # (--one-file-system: a mount that would not go away is left alone.)
            subprocess.run(["rm", "-rf", "--one-file-system", "--", self.work])
