"""What an operator sees of operations on a real mount: the daemon's log
(one line per operation, with who, what, the result, bytes and times; a
failed CRIU run's log kept under the state directory, its path in the line
and in `status`), `<pid>/status` (the cause on one `last:` line, details on
their own keys, RFC 3339 times) and `status.json`, `metrics` (checked by
Prometheus's own `promtool check metrics`, and its counters moved by what
happened), the mtimes of generated files, and JSON that jq reads without
losing digits.

A failed checkpoint: CRIU cannot seize a process that another process
traces (ptrace), so a `sleep` started under a small tracer fails CRIU's dump
every time, with a real CRIU log.

Run by ctest under wl_reaper (restored processes are orphans), with
GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the directory
of the workloads. Needs root, /dev/fuse, CRIU, promtool and jq; skipped,
saying why, where one of them is missing.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, ctl, why_not_runnable
from gpuckpt_testing.processes import kill_if_alive, wait_for

PROMTOOL = shutil.which("promtool")
JQ = shutil.which("jq")


def _why_not():
    why = why_not_runnable()
    if why is None and PROMTOOL is None:
        why = "no promtool (Debian's prometheus package) to check the metrics with"
    if why is None and JQ is None:
        why = "no jq to read the JSON with"
    return why


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))

# Starts `sleep` traced by this script (PTRACE_TRACEME, then continued) and
# prints its pid; stays as its tracer until killed.
_TRACER = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    libc.ptrace(0, 0, None, None)
    os.execv("/bin/sleep", ["sleep", "3600"])
os.waitpid(pid, 0)
libc.ptrace(7, pid, None, None)
print(pid, flush=True)
time.sleep(3600)
"""

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class Traced:
    """A `sleep` that another process traces: CRIU cannot dump it."""

    def __init__(self):
        self.tracer = subprocess.Popen([sys.executable, "-c", _TRACER], stdout=subprocess.PIPE,
                                       text=True, start_new_session=True)
        self.pid = int(self.tracer.stdout.readline())

    def close(self):
        kill_if_alive(self.pid)
        self.tracer.kill()
        self.tracer.wait()


@pytest.fixture
def mount():
    # Chunked at once (not spooled, as on few cores by default): the
    # store's chunk counts then agree with the manifest's right away.
    m = Mount("gpuckpt-operations-test.", "--spool", "never")
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def traced(mount):
    t = Traced()
    try:
        wait_for(lambda: os.path.isdir(mount.path(str(t.pid))), 10, "the traced process's dir")
        yield t
    finally:
        t.close()


def daemon_log(m):
    """The daemon's log: it runs in the background outside systemd, so the
    log is the file in its state directory."""
    return read(os.path.join(m.state_dir, "gpuckptfs.log"))


def fields(line):
    """key=value fields of a log line (values quoted when they hold spaces)."""
    return {k: (v[1:-1] if v.startswith('"') else v)
            for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line)}


def log_line(m, *words):
    """The last line of the daemon's log holding every one of `words`."""
    lines = [l for l in daemon_log(m).splitlines() if all(w in l for w in words)]
    assert lines, f"no log line with {words}:\n{daemon_log(m)}"
    return lines[-1]


def metric(text, name, labels=""):
    """The value of one series of Prometheus text."""
    series = name + (("{" + labels + "}") if labels else "")
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no series {series} in:\n{text}")


def promtool_check(text):
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    # promtool prints lint problems (warnings) on stdout or stderr and exits 1.
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (
        f"promtool: rc {r.returncode}\n{r.stdout}\n{r.stderr}")


def jq(expr, path):
    r = subprocess.run([JQ, "-r", expr, path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_operations_logged_counted_and_shown(mount, traced):
    m = mount
    before = read(m.path("metrics"))
    promtool_check(before)
    # Every failure series is there from the start, at zero.
    assert metric(before, "gpuckpt_operations_total",
                  'operation="checkpoint",result="failed"') == 0
    assert metric(before, "gpuckpt_operations_total", 'operation="restore",result="ok"') == 0
    assert re.search(r'^gpuckpt_build_info\{version="[^"]+",commit="(?:[0-9a-f]+(?:-dirty)?|unknown)"\} 1$',
                     before, re.M), before

    # A checkpoint (--kill) and its restore.
    wl = m.start("wl_memory", "--mib", "16")
    ctl(m.path(str(wl.pid), "ctl"), "checkpoint --kill")
    wait_for(lambda: not wl.alive(), 10, "the checkpointed process to be killed")
    ckpt = f"{wl.pid}-1"
    manifest = json.loads(read(m.path("checkpoints", ckpt, "manifest.json")))
    m.restore(m.path("checkpoints", ckpt), wl.pid)
    restored = json.loads(read(m.path(str(wl.pid), "status.json")))
    assert wl.verdict() == "PASS"

    line = log_line(m, "checkpoint", f"id={ckpt}")
    f = fields(line)
    assert " info " in line, line
    assert f["uid"] == "0" and f["pid"] == str(wl.pid) and f["result"] == "ok", line
    assert int(f["logical_bytes"]) == manifest["logical_bytes"], line
    assert int(f["new_bytes"]) == manifest["new_bytes"], line
    assert int(f["stored_bytes"]) == manifest["stored_bytes"], line
    assert float(f["frozen_s"]) == pytest.approx(manifest["extra"]["stages"]["frozen_s"],
                                                 abs=1e-3), line
    assert float(f["total_s"]) == pytest.approx(manifest["duration_s"], abs=1e-3), line
    line = log_line(m, "restore", f"id={ckpt}")
    f = fields(line)
    assert f["uid"] == "0" and f["pid"] == str(wl.pid) and f["result"] == "ok", line
    assert 0 < float(f["criu_s"]) <= float(f["total_s"]), line

    # A checkpoint that CRIU fails: EIO, one `last:` line with the cause,
    # CRIU's log kept under the state directory, named in status and log.
    with pytest.raises(OSError) as e:
        ctl(m.path(str(traced.pid), "ctl"), "checkpoint")
    assert e.value.errno == 5, e.value
    status = read(m.path(str(traced.pid), "status"))
    lasts = [l for l in status.splitlines() if l.startswith("last:")]
    assert len(lasts) == 1, status
    assert lasts[0].startswith(f"last: checkpoint failed: criu dump of process {traced.pid} "
                               "failed (criu exit 1): "), status
    # The cause, not CRIU's harmless complaint about its own rlimit.
    assert "RLIMIT_NOFILE" not in lasts[0] and "FAILED" not in lasts[0], status
    keyed = dict(l.split(": ", 1) for l in status.splitlines() if ": " in l)
    assert re.fullmatch(RFC3339, keyed["last_started"]), status
    assert re.fullmatch(RFC3339, keyed["last_ended"]), status
    kept = keyed["last_criu_log"]
    assert kept.startswith(os.path.join(m.state_dir, "criu-logs") + "/"), status
    with open(kept) as log:
        text = log.read()
    assert "Dumping FAILED" in text and str(traced.pid) in text, text[-2000:]
    assert oct(os.stat(kept).st_mode & 0o777) == "0o600"
    assert any(l.startswith("last_error_detail: ") for l in status.splitlines()), status
    line = log_line(m, "checkpoint", f"pid={traced.pid}", "result=failed")
    assert " error " in line and fields(line)["criu_log"] == kept, line

    # status.json says the same, and jq reads it.
    path = m.path(str(traced.pid), "status.json")
    doc = json.loads(read(path))
    assert doc["schema_version"] == 1 and doc["pid"] == traced.pid
    assert doc["last"]["ok"] is False
    assert "last: " + doc["last"]["summary"] == lasts[0]
    assert doc["last"]["criu_log"] == kept
    assert doc["last"]["started"] == keyed["last_started"]
    assert jq(".last.criu_log", path) == kept
    assert jq(".owner.uid", path) == "0"
    assert restored["last"]["ok"] is True and restored["last"]["checkpoint"] == ckpt
    assert restored["checkpoints"] == {"count": 1, "latest": ckpt}

    # Metrics: valid for promtool, and moved by exactly what happened.
    after = read(m.path("metrics"))
    promtool_check(after)
    assert metric(after, "gpuckpt_operations_total", 'operation="checkpoint",result="ok"') == 1
    assert metric(after, "gpuckpt_operations_total", 'operation="checkpoint",result="failed"') == 1
    assert metric(after, "gpuckpt_operations_total", 'operation="restore",result="ok"') == 1
    assert metric(after, "gpuckpt_checkpoint_logical_bytes_total") == manifest["logical_bytes"]
    assert metric(after, "gpuckpt_checkpoint_new_bytes_total") == manifest["new_bytes"]
    assert metric(after, "gpuckpt_checkpoint_stored_bytes_total") == manifest["stored_bytes"]
    assert metric(after, "gpuckpt_checkpoint_frozen_seconds_count") == 1
    assert metric(after, "gpuckpt_checkpoint_frozen_seconds_bucket", 'le="+Inf"') == 1
    assert metric(after, "gpuckpt_stage_duration_seconds_count",
                  'operation="restore",stage="restore"') == 1
    assert metric(after, "gpuckpt_store_snapshots") == 1
    assert metric(after, "gpuckpt_store_logical_bytes") == manifest["logical_bytes"]
    assert metric(after, "gpuckpt_store_stored_bytes") >= manifest["stored_bytes"]
    assert metric(after, "gpuckpt_store_chunks") == manifest["new_chunks"]
    assert metric(after, "gpuckpt_store_spooled_bytes") == 0

    # Generated files carry the time of their content, not 1970.
    now = time.time()
    for name in ("metrics", "README", "restore"):
        assert os.stat(m.path(name)).st_mtime > now - 3600, name
    assert abs(os.stat(m.path("metrics")).st_mtime - now) < 60
    assert abs(os.stat(path).st_mtime - now) < 60

    # The manifest's time is a string jq keeps exactly (a 19-digit integer
    # would come back rounded); nothing else in it needs more than 2^53.
    manifest_path = m.path("checkpoints", ckpt, "manifest.json")
    created = jq(".created", manifest_path)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", created), created
    assert created == manifest["created"]
    assert "created_ns" not in manifest
    big = jq('[.. | numbers | select(. >= 9007199254740992)] | length', manifest_path)
    assert big == "0", manifest


def test_status_json_is_its_owners_alone(mount, users):
    m = mount
    a, b = users
    wl = m.start("wl_memory", "--mib", "4", user=a)
    path = m.path(str(wl.pid), "status.json")
    ok, text = a.read(path)
    assert ok and json.loads(text)["owner"]["uid"] == a.uid, text
    # Another user's process is absent, as its status is.
    for name in ("status", "status.json"):
        ok, err = b.read(m.path(str(wl.pid), name))
        assert not ok and "No such file" in err, err


def test_kept_criu_logs_are_bounded(mount, traced):
    m = mount
    for _ in range(34):
        with pytest.raises(OSError):
            ctl(m.path(str(traced.pid), "ctl"), "checkpoint")
    dirs = os.listdir(os.path.join(m.state_dir, "criu-logs"))
    assert len(dirs) == 1, dirs
    kept = os.listdir(os.path.join(m.state_dir, "criu-logs", dirs[0]))
    assert len(kept) == 32, sorted(kept)
    # The newest is kept, and is the one status names.
    status = read(m.path(str(traced.pid), "status"))
    newest = os.path.join(m.state_dir, "criu-logs", dirs[0], max(kept))
    assert f"last_criu_log: {newest}\n" in status, status
    # Work directories of failed runs are not left in the work dir.
    assert [d for d in os.listdir(m.run_dir) if d.startswith("checkpoint-")] == []
    metrics = read(m.path("metrics"))
    assert metric(metrics, "gpuckpt_operations_total",
                  'operation="checkpoint",result="failed"') == 34


def test_cat_ctl_shows_each_callers_own_last_command(mount, users):
    """`cat ctl`: the caller's own last command and how it ended (gc's
    freed bytes among them), then the commands; another user's is not
    theirs to see."""
    a, b = users
    ok, text = a.read(mount.path("ctl"))
    assert ok and text.startswith("last: none\n") and "commands: track" in text, text
    ok, err = a.write(mount.path("ctl"), "gc")
    assert not ok, "a user ran gc"
    ok, text = a.read(mount.path("ctl"))
    assert ok and re.match(r"last: gc: error: .+\n", text), text
    wl = mount.start("wl_memory", "--mib", "4")
    ckpt = mount.checkpoint(wl.pid)
    shutil.rmtree(mount.path("checkpoints", ckpt))
    ctl(mount.path("ctl"), "gc")
    text = read(mount.path("ctl"))
    m = re.match(r"last: gc: freed ([\d.]+) MB in (\d+) chunks\n", text)
    assert m and int(m.group(2)) > 0, text
    ok, text = b.read(mount.path("ctl"))
    assert ok and text.startswith("last: none\n"), text
    ok, text = a.read(mount.path("ctl"))
    assert ok and text.startswith("last: gc: error: "), text
