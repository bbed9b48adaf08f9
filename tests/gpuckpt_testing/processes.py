"""Processes: waits, kills, what /proc says of them, sessions, and the
zombies that restores leave (this process as their child subreaper)."""

import ctypes
import os
import signal
import time


def wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


def kill_if_alive(pid):
    """SIGKILL to `pid` unless it is gone. A check of /proc/<pid> first
    would race: a process that exits (or a zombie the subreaper reaps)
    between the check and the kill raises ProcessLookupError."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def proc_status_field(pid, key):
    """The value of the `key:` line of /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def assert_runs_on(workload, within=10):
    """The process runs: within `within` seconds it is neither stopped
    (state T/t) nor traced, and it keeps waking up (the workloads sleep
    50 ms at a time), so that it was left neither frozen nor seized."""
    deadline = time.monotonic() + within
    switches = None
    state = tracer = "?"
    while time.monotonic() < deadline:
        assert workload.alive(), f"pid {workload.pid} is gone"
        with open(f"/proc/{workload.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        tracer = proc_status_field(workload.pid, "TracerPid")
        if state not in ("T", "t") and tracer == "0":
            now = int(proc_status_field(workload.pid, "voluntary_ctxt_switches"))
            if switches is not None and now > switches:
                return
            switches = now
        time.sleep(0.1)
    raise AssertionError(f"pid {workload.pid} is stopped, traced or frozen "
                         f"(state {state}, tracer {tracer}) after {within} s")


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


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name ([] if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def proc_state(pid):
    """The one-letter state of a process ("" if gone)."""
    fields = stat_fields(pid)
    return fields[0] if fields else ""


def parent_of(pid):
    """The parent's pid of a process ("" if gone)."""
    fields = stat_fields(pid)
    return fields[1] if len(fields) > 1 else ""


def session_members(sid):
    """The pids of the processes of session sid (zombies too)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(name)
        if len(fields) > 3 and fields[3] == str(sid):
            members.append(int(name))
    return members


def wait_for_path(path, seconds):
    """Until path exists, reaping meanwhile; False after `seconds`."""
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


def live_processes(match):
    """Pids of the live processes whose argument list (a list of bytes)
    `match` accepts; zombies, which nothing may reap here, do not count."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if proc_state(entry) not in ("", "Z") and match(args):
            pids.append(int(entry))
    return pids
