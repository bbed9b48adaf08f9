"""gpuckptfs under systemd: readiness, stop, and the units in contrib/.

No systemd runs as PID 1 here, so the protocol is checked at its ends:

- readiness (Type=notify): gpuckptfs --foreground with NOTIFY_SOCKET set
  sends READY=1 once the mount is visible, and STOPPING=1 once it has
  unmounted, both on SIGTERM (systemctl stop) and on an outside umount;
  it then exits 0;
- a SIGTERM while a checkpoint is in flight (what the unit's stop timeout
  and KillMode=process rest on): the checkpoint runs to its end and is
  stored, the process runs on, unfrozen (PASS), and only then does the
  daemon unmount and exit;
- the unit `cmake --install` puts in <prefix>/lib/systemd/system names the
  installed gpuckptfs, and `systemd-analyze verify` (which needs no
  running systemd) finds nothing to say about it nor about
  contrib/mnt-gpuckpt.mount, while it does about a unit with a mistake.

Run by ctest under wl_reaper, like the other pytest tests (gpuckpt_testing.mount).
Needs root, /dev/fuse and CRIU (and systemd-analyze, cmake for the unit
checks); skipped, saying why, where one is missing.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading

import pytest

from gpuckpt_testing import build, processes
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import ctl, mounted_at, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.workloads import Workload

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# WORKLOAD_BIN is the build directory (the workloads are built at its top).
BUILD_DIR = build.WORKLOAD_BIN

needs_daemon = pytest.mark.skipif(why_not_runnable("wl_memory") is not None,
                                  reason=str(why_not_runnable("wl_memory")))


class NotifiedDaemon:
    """gpuckptfs --foreground on a fresh store, with NOTIFY_SOCKET naming a
    datagram socket of ours, as systemd starts a Type=notify service."""

    def __init__(self):
        self.work = tempfile.mkdtemp(prefix="gpuckpt-systemd-test.", dir="/var/tmp")
        os.chmod(self.work, 0o755)
        self.mnt = os.path.join(self.work, "mnt")
        os.mkdir(self.mnt)
        self.socket_path = os.path.join(self.work, "notify")
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(self.socket_path)
        env = dict(os.environ, NOTIFY_SOCKET=self.socket_path)
        self.log = open(os.path.join(self.work, "daemon.log"), "w")
        self.process = subprocess.Popen(
            [build.GPUCKPTFS, "--foreground", "--store", os.path.join(self.work, "store"),
             "--work-dir", os.path.join(self.work, "run"), "--all-processes",
             # Little staging memory: a checkpoint waits on the store, and
             # lasts long enough to be signalled in the middle of.
             "--staging-memory", "16M", self.mnt],
            stdout=self.log, stderr=self.log, env=env)

    def message(self, timeout):
        """The next notification, as text."""
        self.socket.settimeout(timeout)
        return self.socket.recv(4096).decode()

    def close(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=120)
        self.socket.close()
        self.log.close()
        if mounted_at(self.mnt):
            subprocess.run(["umount", "-l", self.mnt])
        shutil.rmtree(self.work, ignore_errors=True)


@pytest.fixture
def daemon():
    d = NotifiedDaemon()
    try:
        yield d
    finally:
        d.close()


@needs_daemon
@pytest.mark.parametrize("stop", ["sigterm", "umount"])
def test_ready_once_mounted_and_stopping_once_unmounted(daemon, stop):
    assert daemon.message(120) == "READY=1"
    # Ready means mounted: the tree is there to read at once.
    assert mounted_at(daemon.mnt)
    assert "checkpoints" in os.listdir(daemon.mnt)
    if stop == "sigterm":
        daemon.process.send_signal(signal.SIGTERM)
    else:
        assert subprocess.run(["umount", daemon.mnt], timeout=60).returncode == 0
    assert daemon.message(120) == "STOPPING=1"
    assert not mounted_at(daemon.mnt)
    assert daemon.process.wait(timeout=60) == 0


@needs_daemon
def test_sigterm_lets_a_checkpoint_in_flight_finish(daemon):
    assert daemon.message(120) == "READY=1"
    wl = Workload(daemon.work, "wl_big", "--mib", "384")
    try:
        wait_for(lambda: os.path.isdir(os.path.join(daemon.mnt, str(wl.pid))), 10,
                 "the process to appear")
        outcome = {}

        def checkpoint():
            try:
                ctl(os.path.join(daemon.mnt, str(wl.pid), "ctl"), "checkpoint")
                outcome["ok"] = True
            except OSError as e:
                outcome["error"] = e

        writer = threading.Thread(target=checkpoint)
        writer.start()
        status = os.path.join(daemon.mnt, str(wl.pid), "status")
        wait_for(lambda: "operation: checkpoint" in read(status) or "ok" in outcome, 60,
                 "the checkpoint to start")
        assert "ok" not in outcome, "the checkpoint ended before SIGTERM: make it larger"
        daemon.process.send_signal(signal.SIGTERM)
        writer.join(timeout=300)
        assert outcome == {"ok": True}, outcome
        assert daemon.message(300) == "STOPPING=1"
        assert daemon.process.wait(timeout=60) == 0
        assert not mounted_at(daemon.mnt)
        # The process runs on, not stopped, and whole.
        with open(f"/proc/{wl.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] in ("R", "S"), "not stopped"
        assert wl.verdict() == "PASS"
        # The checkpoint was stored: a new daemon on the store shows it.
        m = subprocess.run([build.GPUCKPTFS, "--store", os.path.join(daemon.work, "store"),
                            "--work-dir", os.path.join(daemon.work, "run"), daemon.mnt],
                           capture_output=True, text=True, timeout=120)
        assert m.returncode == 0, m.stderr
        try:
            manifest = json.loads(read(os.path.join(daemon.mnt, "checkpoints", f"{wl.pid}-1",
                                                    "manifest.json")))
            # All of it: wl_big touches 6 of every 8 pages (with transparent
            # huge pages always on, the holes are dumped too).
            assert manifest["logical_bytes"] > (384 << 20) * 6 // 8
        finally:
            subprocess.run(["umount", daemon.mnt])
    finally:
        processes.kill_if_alive(wl.pid)


def systemd_analyze_verify(unit, manpath=None):
    """What `systemd-analyze verify` says of `unit` (stdout and stderr). It
    also runs `man` for each man: page in Documentation=, looked up in
    `manpath` when given."""
    env = dict(os.environ)
    if manpath is not None:
        env["MANPATH"] = str(manpath)
    r = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True,
                       timeout=60, env=env)
    return (r.stdout + r.stderr).strip()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="no systemd-analyze (Debian package systemd)")
@pytest.mark.skipif(shutil.which("cmake") is None or not BUILD_DIR,
                    reason="no cmake, or WORKLOAD_BIN does not name the build directory")
def test_installed_unit_and_mount_unit_verify(tmp_path):
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", BUILD_DIR, "--prefix", str(prefix)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    unit = prefix / "lib/systemd/system/gpuckptfs.service"
    text = unit.read_text()
    exec_start = [l for l in text.splitlines() if l.startswith("ExecStart=")]
    assert exec_start == [f"ExecStart={prefix}/bin/gpuckptfs --foreground --store "
                          "/var/lib/gpuckpt --work-dir /run/gpuckpt /mnt/gpuckpt"], exec_start
    assert os.access(prefix / "bin/gpuckptfs", os.X_OK)
    for setting in ("Type=notify", "KillMode=process", "TimeoutStopSec=15min",
                    "StateDirectory=gpuckpt gpuckptfs", "RuntimeDirectory=gpuckpt",
                    "RuntimeDirectoryPreserve=yes", "LimitNOFILE=1048576"):
        assert setting in text.splitlines(), setting
    # Its Documentation= names gpuckptfs(8), which the install put beside it.
    assert "Documentation=man:gpuckptfs(8)" in text.splitlines()
    assert systemd_analyze_verify(str(unit), manpath=prefix / "share/man") == ""
    assert systemd_analyze_verify(os.path.join(SOURCE_DIR, "contrib/mnt-gpuckpt.mount")) == ""

    # The check can fail: a misspelt setting is reported.
    broken = tmp_path / "gpuckptfs.service"
    broken.write_text(text.replace("KillMode=process", "KillMode=proces"))
    assert "kill mode" in systemd_analyze_verify(str(broken), manpath=prefix / "share/man")
