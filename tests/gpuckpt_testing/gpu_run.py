"""One run of a GPU test module (GpuWork): its options, its work directory,
the workloads' user, the daemon's mount, the summary and the logs.

Restored processes are orphans. Where PID 1 does not reap (a bare
container init) they would stay zombies that hold their pid, and the same
checkpoint could not be restored twice; so the test process makes itself a
child subreaper (`become_subreaper`) and every wait of
gpuckpt_testing.processes reaps the zombies it has (`reap`). It reaps only
inside these waits, never while a subprocess.run is in flight, so no
command's exit status is lost.
"""

import os
import shutil
import signal
import subprocess
import tempfile

from gpuckpt_testing.build import REPO_ROOT
from gpuckpt_testing.filetools import dmesg_tail, pack, read_text
from gpuckpt_testing.gpu_host import GPU_DIR, Bundle, Daemon, unpack_bundle
from gpuckpt_testing.messages import say
from gpuckpt_testing.processes import become_subreaper, end_session, stop_on_signal
from gpuckpt_testing.users import RunAs


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
