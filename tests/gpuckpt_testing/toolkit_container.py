"""A self-checking workload (tests/workloads/workload.h) as the init of a
container made by tests/workloads/toolkit-container: its own mount, pid,
uts, ipc and net namespaces, the root filesystem a tmpfs on a directory of
this machine, this machine's /usr and /etc and every NVIDIA device node
and driver library bound in as the NVIDIA container toolkit does.

    c = ToolkitContainer(work, [binary, "--gib", "1"], binds=[bundle_dir])
    c.pid            # the init's pid as this machine sees it (1 inside)
    c.verdict()      # SIGUSR1, then its PASS or FAIL line
    c.close()        # kills what is left, unmounts the root filesystem

`work` is bound into the container at the same path, so both sides name
the workload's binary (put it there) and its result file alike."""

import os
import signal
import subprocess
import tempfile

from gpuckpt_testing.build import REPO_ROOT
from gpuckpt_testing.filetools import read
from gpuckpt_testing.processes import kill_if_alive, wait_for

TOOLKIT_CONTAINER = os.path.join(REPO_ROOT, "tests", "workloads", "toolkit-container")


def host_pid_of_init(needle):
    """The pid, as this machine sees it, of the process that is pid 1 of its
    own pid namespace and has `needle` in its command line; None if none."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle.encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/status") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
        except OSError:
            continue
        if len(nspid) == 2 and nspid[1] == "1":
            return int(entry)
    return None


class ToolkitContainer:
    """`argv` (a workload taking RESULT_FILE first: it is inserted) as the
    init of a new container under `work`; or, with `ready`, `argv` as it
    is, ready once it has written that file (in `work`); `binds`:
    directories bound in read-write, `files`: host files bound read-only
    over their own paths (as the toolkit binds the driver's libraries),
    `env`: its environment."""

    def __init__(self, work, argv, binds=(), files=(), env=None, ready=None):
        self.dir = tempfile.mkdtemp(prefix="container-", dir=work)
        os.chmod(self.dir, 0o755)
        self.root = os.path.join(self.dir, "root")
        os.mkdir(self.root)
        self.result = os.path.join(self.dir, "result")
        self.log = os.path.join(self.dir, "out.log")
        options = []
        for d in (work, *binds):
            options += ["--bind", d]
        for f in files:
            options += ["--file", f]
        open(self.log, "w").close()
        if ready is None:
            argv = [argv[0], self.result, *argv[1:]]
            ready = self.result + ".ready"
        # What the init's command line names, to find it by.
        self.needle = ready if ready in argv else self.result
        # The launcher's own errors go to the log too; the workload's are
        # appended to it from inside the container.
        with open(self.log, "a") as log:
            self.launcher = subprocess.Popen(
                [TOOLKIT_CONTAINER, self.root, *options, "--log", self.log, "--", *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                env=env)
        self.pid = None
        try:
            wait_for(lambda: os.path.exists(ready) or self.launcher.poll() is not None, 300,
                     f"the container's workload to get ready ({self.output()})")
            assert os.path.exists(ready), \
                f"the container ended (exit {self.launcher.returncode}): {self.output()}"
            self.pid = host_pid_of_init(self.needle)
            assert self.pid is not None, f"no container init runs {argv[0]}"
        except BaseException:
            # The caller gets no container to close: nothing of it may be
            # left running or mounted.
            self.close()
            raise

    def output(self):
        return read(self.log).strip()

    def find_restored(self):
        """The restored init's pid on this machine (it may differ from the
        first one), kept as `pid`."""
        self.pid = host_pid_of_init(self.needle)
        return self.pid

    def verdict(self):
        if os.path.exists(self.result):
            os.unlink(self.result)
        os.kill(self.pid, signal.SIGUSR1)
        wait_for(lambda: os.path.exists(self.result), 300, "the container's verdict")
        return read(self.result).strip()

    def launched_init(self):
        """The container's first init, as the launcher's child (unshare
        forks it); None once the launcher is gone."""
        try:
            with open(f"/proc/{self.launcher.pid}/task/{self.launcher.pid}/children") as f:
                children = f.read().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def close(self):
        # pid 1: its namespace's other processes go with it.
        for pid in {self.pid, self.launched_init()} - {None}:
            kill_if_alive(pid)
        if self.launcher.poll() is None:
            self.launcher.kill()
            self.launcher.wait()
        subprocess.run(["umount", "--lazy", self.root], capture_output=True)
