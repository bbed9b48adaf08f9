"""Self-checking workloads (tests/workloads/workload.h): started in their
own session, as root or as a user, asked for their verdict on SIGUSR1.
Workload is the integration tests' (a built workload, waited for with
asserts); start_session, wait_ready and verdict are the GPU tests' (any
command, as the workloads' user, without the bundle's libraries)."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

from gpuckpt_testing import build
from gpuckpt_testing.filetools import read, read_text
from gpuckpt_testing.processes import (gone, kill_if_alive, proc_state, reap, wait_for,
                                       wait_for_path)


class Workload:
    """A self-checking workload in its own session, as root or as `user`."""

    def __init__(self, work, name, *args, user=None, env=None):
        self.dir = tempfile.mkdtemp(prefix=name + "-", dir=work)
        self.result = os.path.join(self.dir, "result")
        self.user = user
        binary = os.path.join(work, name)
        if not os.path.exists(binary):
            shutil.copy(os.path.join(build.WORKLOAD_BIN, name), binary)
            os.chmod(binary, 0o755)
        log = os.path.join(self.dir, "out.log")
        open(log, "w").close()
        run_as = []
        if user is not None:
            # The workload's files are the user's own, as if they had
            # started it: a restore run as the user reopens them.
            os.chown(self.dir, user.uid, user.gid)
            os.chown(log, user.uid, user.gid)
            run_as = user.prefix()
        # Started through a shell that exits at once: the workload is then
        # an orphan that the subreaper (wl_reaper) reaps when it is killed,
        # so its pid is free again for the restore.
        subprocess.run(["sh", "-c", 'log=$1; shift; setsid "$@" </dev/null >"$log" 2>&1 &', "sh",
                        log, *run_as, binary, self.result, *args], check=True, env=env)
        ready = self.result + ".ready"
        # A large workload fills its memory first: minutes on a busy machine.
        wait_for(lambda: os.path.exists(ready), 300,
                 f"{name} to get ready ({read(log).strip()})")
        with open(ready) as f:
            self.pid = int(f.read())

    def alive(self):
        return os.path.exists(f"/proc/{self.pid}")

    def gone(self):
        """Whether the workload and every process of its session are gone
        (reaped): only then is its pid free for a restore of its tree."""
        return not self.alive() and subprocess.run(
            ["pgrep", "-s", str(self.pid)], capture_output=True).returncode != 0

    def kill(self):
        """SIGKILL to the workload's whole session (wl_tree's children
        too), then waits until all of it is gone."""
        subprocess.run(["pkill", "-KILL", "-s", str(self.pid)], capture_output=True)
        kill_if_alive(self.pid)
        wait_for(self.gone, 30, f"pid {self.pid} and its session to go")

    def verdict(self):
        if os.path.exists(self.result):
            os.unlink(self.result)
        os.kill(self.pid, signal.SIGUSR1)
        wait_for(lambda: os.path.exists(self.result), 300, "the workload's verdict")
        with open(self.result) as f:
            return f.read().strip()

    def assert_passes(self, what):
        """The workload runs, checks its state on SIGUSR1, says PASS and
        exits."""
        assert self.alive(), f"{what}: pid {self.pid} is not running"
        verdict = self.verdict()
        assert verdict == "PASS", f"{what}: {verdict}"
        wait_for(self.gone, 30, f"{what}: pid {self.pid} to go after its verdict")


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
    if not wait_for_path(result, 120):
        return False, f"no verdict from pid {pid} within 120 s (state: {proc_state(pid)})"
    said = read_text(result).rstrip("\n")
    passed = said == "PASS"
    if not gone(pid, 30):
        said = f"{said}; pid {pid} still there 30 s after its verdict"
    return passed and said == "PASS", said
