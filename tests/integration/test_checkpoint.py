"""gpuckptfs end to end with real CRIU on a real FUSE mount: the
self-checking workloads (tests/workloads/) are checkpointed through
<pid>/ctl, copied out with cp -r, killed, restored from the copy and from
the mount, and must say PASS each time; then bad input, concurrent
checkpoints, an ordinary user's view and rights, and a daemon killed with
SIGKILL in the middle of a checkpoint.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_checkpoint.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory. Needs root, /dev/fuse and CRIU; skipped, saying why, where
one of them is missing.
"""

import concurrent.futures
import errno
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from gpuckpt_testing.build import PYTHON
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, listdir_as, status_line, why_not_runnable
from gpuckpt_testing.processes import (assert_runs_on, proc_state, proc_status_field,
                                       wait_for)
from gpuckpt_testing.stopping_criu import StoppingCriu
from gpuckpt_testing.users import Root

pytestmark = pytest.mark.skipif(why_not_runnable("wl_big") is not None,
                                reason=str(why_not_runnable("wl_big")))

BIG_MIB = "1024"


def expect_error(what, errnos, path, text, user=None):
    """Writing `text` into `path` (as `user`, default root) must fail with
    one of `errnos`."""
    ok, err = (user or Root()).write(path, text)
    assert not ok, f"{what}: the write succeeded"
    assert err in [os.strerror(e) for e in errnos], f"{what}: expected {errnos}, got: {err}"


def can_read(user, path):
    """Whether `user` can read the (binary) file `path` to its end."""
    return user.run(["dd", f"if={path}", "of=/dev/null", "status=none"]).returncode == 0


def same_tree(user, a, b):
    """diff -r of two trees, as `user` sees them."""
    r = user.run(["diff", "-r", a, b], timeout=300)
    assert r.returncode == 0, f"{a} and {b} differ: {r.stdout}{r.stderr}"


# --- The matrix: every workload, both modes ----------------------------------------

CASES = [(mode, name, args)
         for mode in ("", "--kill")
         for name, args in (("wl_memory", ()), ("wl_threads", ()), ("wl_files", ()),
                            ("wl_tree", ()), ("wl_big", ("--mib", BIG_MIB)))]
CASES.append(("--name files-named", "wl_files", ()))


@pytest.mark.parametrize("mode,name,args", CASES,
                         ids=[f"{n} checkpoint {m}".strip() for m, n, a in CASES])
def test_checkpoint_copy_kill_restore_from_the_copy_and_the_mount(mount, mode, name, args):
    what = f"{name} {' '.join(args)} (checkpoint {mode})"
    wl = mount.start(name, *args)
    ckpt_id = mount.checkpoint(wl.pid, mode)
    if "--kill" in mode:
        wait_for(wl.gone, 10, f"{what}: pid {wl.pid} to end after checkpoint --kill")
    else:
        assert_runs_on(wl)
        latest = os.path.realpath(mount.path(str(wl.pid), "checkpoints", "latest"))
        assert latest == mount.path("checkpoints", ckpt_id), f"{what}: latest -> {latest}"
        assert re.search(r"^last: ", read(mount.path(str(wl.pid), "status")), re.M), \
            f"{what}: no 'last:' in status"
    if "--name" in mode:
        assert ckpt_id == mode.split("--name ")[1], f"{what}: id is {ckpt_id}"
    else:
        assert re.fullmatch(rf"{wl.pid}-\d+", ckpt_id), f"{what}: id {ckpt_id} is not <pid>-<n>"
    mount.assert_complete(ckpt_id, wl.pid)

    copy = os.path.join(mount.work, "copy")
    subprocess.run(["cp", "-r", mount.path("checkpoints", ckpt_id), copy], check=True)
    same_tree(Root(), mount.path("checkpoints", ckpt_id), copy)
    wl.kill()
    mount.restore(copy, wl.pid)
    wl.assert_passes(f"{what}, restored from a copy")
    mount.restore(mount.path("checkpoints", ckpt_id), wl.pid)
    wl.assert_passes(f"{what}, restored again from the mount")


# --- Bad input, busy pids ----------------------------------------------------------


def test_unknown_commands_and_options_fail_with_einval(mount):
    wl = mount.start("wl_memory", "--mib", "16")
    ctl = mount.path(str(wl.pid), "ctl")
    expect_error("unknown command", [errno.EINVAL], ctl, "bogus")
    expect_error("unknown option", [errno.EINVAL], ctl, "checkpoint --bogus")


def test_restore_over_a_pid_in_use_fails_with_ebusy_saying_so(mount):
    wl = mount.start("wl_memory", "--mib", "16")
    ckpt_id = mount.checkpoint(wl.pid)
    expect_error("restore over a running pid", [errno.EBUSY], mount.path("restore"),
                 mount.path("checkpoints", ckpt_id))
    said = read(mount.path("restore"))
    assert "in use" in said.lower(), f"restore over a running pid says: {said}"
    wl.assert_passes("wl_memory after a refused restore")


def test_restore_from_a_non_image_dir_is_einval_and_from_a_missing_one_enoent(mount):
    expect_error("restore of /etc", [errno.EINVAL], mount.path("restore"), "/etc")
    said = read(mount.path("restore"))
    assert said.startswith("error:"), f"restore of /etc says: {said}"
    expect_error("restore of a missing dir", [errno.ENOENT], mount.path("restore"), "/nonexistent")


# Holds an io_uring instance (io_uring_setup, syscall 425), says so, sleeps.
IO_URING_USER = """
import ctypes, os, sys, time
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
fd = ctypes.CDLL(None, use_errno=True).syscall(425, 4, params)
if fd < 0:
    sys.exit("io_uring_setup: " + os.strerror(ctypes.get_errno()))
open(sys.argv[1], "w").close()
time.sleep(600)
"""


def test_io_uring_user_is_refused_with_enotsup_saying_why_and_runs_on(mount):
    ready = os.path.join(mount.work, "uring.ready")
    before = mount.ids()
    # Its own session, so that CRIU would need no --shell-job.
    proc = subprocess.Popen([PYTHON, "-c", IO_URING_USER, ready], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(ready) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not os.path.exists(ready):
            proc.kill()
            pytest.skip(f"this kernel gives no io_uring ({proc.communicate()[0].strip()})")
        wait_for(lambda: os.path.isdir(mount.path(str(proc.pid))), 10, "the io_uring user's dir")
        expect_error("checkpoint of an io_uring user", [errno.EOPNOTSUPP],
                     mount.path(str(proc.pid), "ctl"), "checkpoint")
        status = read(mount.path(str(proc.pid), "status"))
        assert "uses io_uring" in status, f"the status of an io_uring user says: {status}"
        assert mount.ids() == before, "a refused checkpoint left a checkpoint"
        assert proc.poll() is None, "the io_uring user did not run on"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_checkpoint_through_an_open_ctl_of_a_vanished_pid_fails_with_esrch(mount):
    wl = mount.start("wl_memory", "--mib", "8")
    fd = os.open(mount.path(str(wl.pid), "ctl"), os.O_WRONLY)
    try:
        wl.kill()
        with pytest.raises(OSError) as e:
            os.write(fd, b"checkpoint\n")
        assert e.value.errno == errno.ESRCH, e.value
    finally:
        os.close(fd)


def test_concurrent_checkpoints_one_ebusy_or_both_and_each_restores(mount):
    """Two checkpoints of one pid at once: one fails with EBUSY, or both
    succeed one after the other; whatever appears is complete and restores."""
    wl = mount.start("wl_memory", "--mib", "32")
    before = set(mount.ids())
    ctl = mount.path(str(wl.pid), "ctl")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: Root().write(ctl, "checkpoint"), range(2)))
    oks = sum(ok for ok, _ in results)
    errors = [err for ok, err in results if not ok]
    assert oks in (1, 2), f"concurrent checkpoints: {results}"
    if oks == 1:
        assert errors == [os.strerror(errno.EBUSY)], f"concurrent checkpoints: {results}"
    made = sorted(set(mount.ids()) - before)
    assert len(made) == oks, f"concurrent checkpoints: {oks} succeeded, new ids: {made}"
    for ckpt_id in made:
        mount.assert_complete(ckpt_id, wl.pid)
    wl.kill()
    for ckpt_id in made:
        mount.restore(mount.path("checkpoints", ckpt_id), wl.pid)
        wl.assert_passes(f"wl_memory restored from concurrent checkpoint {ckpt_id}")


def criu_dumps(daemons):
    """{pid being dumped: CRIU pid} of the `criu dump -t PID ...` processes
    that a daemon of `daemons` started: not CRIU's own helpers, which must
    not be stopped (CRIU reads a stopped helper as a failure). One pass
    over /proc, so that a dump is caught early."""
    dumps = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid not in daemons:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if len(argv) > 1 and argv[0].endswith(b"sh") and argv[1].endswith(b"criu"):
            argv = argv[1:]  # StoppingCriu, before it execs CRIU
        if len(argv) > 3 and argv[0].endswith(b"criu") and argv[1:3] == [b"dump", b"-t"]:
            dumps[int(argv[3])] = int(entry)
    return dumps


def await_self_stopped_dumps(mount, pids, held, seconds=120):
    """Waits until the StoppingCriu dump of each of `pids` has stopped
    itself; `held`: {pid: its dump's pid}, filled in. Never sends SIGSTOP:
    a dump stopped from outside before its own `kill -STOP` would stop
    itself again once continued, and stay stopped."""
    daemons = set(mount.daemon_pids())
    assert daemons, "no daemon serves the mount"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for pid, criu in criu_dumps(daemons).items():
            if pid in pids and proc_state(criu) in ("T", "t"):
                held[pid] = criu
        if all(pid in held for pid in pids):
            return
        time.sleep(0.01)
    waiting = [pid for pid in pids if pid not in held]
    raise AssertionError(f"after {seconds} s, {len(held)} dumps stopped themselves and "
                         f"{len(waiting)} did not: {waiting}")


def hold_dumps(mount, pids, returned, held, seconds=60):
    """Stops (SIGSTOP) the CRIU dump of each of `pids` as soon as it shows,
    until each is held or its checkpoint has `returned(pid)`; `held`: {pid:
    CRIU pid}, filled in."""
    daemons = set(mount.daemon_pids())
    assert daemons, "no daemon serves the mount"
    deadline = time.monotonic() + seconds
    stopping = {}  # sent SIGSTOP, not yet seen stopped
    while time.monotonic() < deadline:
        for pid, criu in criu_dumps(daemons).items():
            if pid in pids and pid not in held and pid not in stopping:
                try:
                    os.kill(criu, signal.SIGSTOP)
                except ProcessLookupError:
                    continue  # that dump ended since the scan: its checkpoint returns
                stopping[pid] = criu
        # Held once seen stopped. A dump that ended since the scan (a zombie
        # until the daemon reaps it, which a SIGSTOP does not fail on) is
        # not held: its checkpoint returns.
        for pid, criu in list(stopping.items()):
            state = proc_state(criu)
            if state in ("T", "t"):
                held[pid] = criu
            if state != "R" and state != "S" and state != "D":
                del stopping[pid]
        if all(pid in held or returned(pid) for pid in pids):
            return
        time.sleep(0.002)
    # Not asked through the mount, which may be what does not answer.
    waiting = [pid for pid in pids if pid not in held and not returned(pid)]
    raise AssertionError(f"after {seconds} s, {len(held)} dumps held and {len(waiting)} "
                         f"checkpoints neither in CRIU nor returned: {waiting}")


def release_dumps(held):
    for c in held.values():
        try:
            os.kill(c, signal.SIGCONT)
        except ProcessLookupError:
            pass


def timed(args, what):
    """Runs `args` (at most 60 s: a mount that does not answer fails the
    test rather than hang it); its seconds."""
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{what}: {r.stderr}"
    return time.monotonic() - start


@pytest.fixture
def stopping_mount():
    """A mount whose daemon's dumps stop themselves (StoppingCriu)."""
    criu = StoppingCriu(verbs=("dump",))
    m = Mount("gpuckpt-test_checkpoint.", "--criu", criu.path)
    try:
        yield m
    finally:
        m.close()
        criu.close()


def test_the_mount_answers_while_32_checkpoints_are_held_in_their_dumps(stopping_mount):
    """32 checkpoints written at once and each held in its CRIU dump
    (stopped before CRIU starts, StoppingCriu): more commands in flight
    than the daemon has FUSE threads (16), yet listings and status files
    answer at once, since every command runs on a thread of its own;
    released, all 32 complete."""
    m = stopping_mount
    workloads = [m.start("wl_memory", "--mib", "64") for _ in range(32)]
    before = set(m.ids())
    results = {}

    def checkpoint(wl):
        results[wl.pid] = Root().write(m.path(str(wl.pid), "ctl"), "checkpoint", timeout=600)
    writers = [threading.Thread(target=checkpoint, args=(wl,)) for wl in workloads]
    held = {}
    try:
        for w in writers:
            w.start()
        await_self_stopped_dumps(m, [wl.pid for wl in workloads], held)
        in_flight = [pid for pid in held if pid not in results]
        # More held at once than there are FUSE threads: none of them
        # holds one.
        assert len(in_flight) == 32, (
            f"only {len(in_flight)} of 32 checkpoints are in flight with their dumps "
            f"stopped (returned: {sorted(results)})")
        for args, what in (
                (["ls", m.path()], "ls of the mount"),
                (["ls", m.path("checkpoints")], "ls of checkpoints/"),
                (["cat", m.path(str(in_flight[0]), "status")], "cat of a held process's status"),
                (["cat", m.path("metrics")], "cat of metrics")):
            took = timed(args, what)
            assert took < 10, f"{what} took {took:.1f} s with {len(in_flight)} commands in flight"
        assert not any(pid in results for pid in in_flight), (
            "a held checkpoint returned while its CRIU was stopped")
    finally:
        release_dumps(held)
        # Also any dump that stopped itself after a failed wait, so that
        # a failure ends the test instead of hanging it.
        for _ in range(50):
            release_dumps(criu_dumps(set(m.daemon_pids())))
            time.sleep(0.02)
        deadline = time.monotonic() + 600
        for w in writers:
            w.join(timeout=max(0, deadline - time.monotonic()))
    failed = {pid: err for pid, (ok, err) in results.items() if not ok}
    assert len(results) == 32 and not failed, f"checkpoints failed: {failed}"
    made = set(m.ids()) - before
    assert len(made) == 32, f"32 checkpoints written, {len(made)} appeared"
    for ckpt_id in sorted(made)[:4]:
        m.assert_complete(ckpt_id)


def test_status_and_restore_say_how_far_an_operation_is(users):
    """While a user's checkpoint is in flight, `status` and `status.json`
    say its stage in words, what it should read in all and how much of it
    it has; while their restore is, `cat restore` says the same of it."""
    a = users[0]
    criu = StoppingCriu()
    m = Mount("gpuckpt-test_progress.", "--criu", criu.path)
    held = []
    try:
        wl = m.start("wl_memory", "--mib", "64", user=a)
        done = {}
        writer = threading.Thread(target=lambda: done.update(
            checkpoint=a.write(m.path(str(wl.pid), "ctl"), "checkpoint")))
        writer.start()
        held.append(criu.stopped("dump"))
        ok, text = a.read(m.path(str(wl.pid), "status"))
        assert ok and re.search(r"^operation: checkpoint \(copying memory, 0\.0 of about "
                                r"(\d+)\.\d MB \(0%\), [\d.]+ s\)$", text, re.M), text
        ok, text = a.read(m.path(str(wl.pid), "status.json"))
        op = json.loads(text)["operation"]
        assert op["stage_text"] == "copying memory" and op["percent"] == 0, op
        assert op["expected_bytes"] >= 64 << 20, op
        os.kill(held.pop(), signal.SIGCONT)
        writer.join(timeout=300)
        assert done["checkpoint"][0], done
        made, = m.ids(a)
        wl.kill()

        restorer = threading.Thread(target=lambda: done.update(
            restore=a.write(m.path("restore"), m.path("checkpoints", made))))
        restorer.start()
        held.append(criu.stopped("restore"))
        ok, text = a.read(m.path("restore"))
        assert ok and re.match(rf"in flight: restore of {re.escape(made)} \(restoring memory, "
                               r"0\.0 of about \d+\.\d MB \(0%\), [\d.]+ s\)\n$", text), text
        os.kill(held.pop(), signal.SIGCONT)
        restorer.join(timeout=300)
        assert done["restore"][0], done
        ok, text = a.read(m.path("restore"))
        assert ok and text.startswith("pid "), text
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
        m.close()
        criu.close()


# One command in one write(2); the write's outcome is printed apart from the
# close's: once a stopping daemon has answered its last write it serves
# nothing more, so a close (FUSE's flush) after it fails.
WRITE_THEN_CLOSE = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
try:
    os.write(fd, os.fsencode(sys.argv[2]) + b"\\n")
    print("write: ok", flush=True)
except OSError as e:
    print("write:", os.strerror(e.errno), flush=True)
try:
    os.close(fd)
except OSError:
    pass
"""


def test_a_daemon_stopped_during_a_checkpoint_finishes_it_and_then_exits(mount):
    """SIGTERM while a checkpoint is in its dump: the daemon first lets the
    command end (a checkpoint already freezing is not given up), the writer
    gets its answer, then the daemon unmounts and exits; the checkpoint is
    in the store and the process runs on."""
    m = mount
    wl = m.start("wl_memory", "--mib", "128")
    writer = subprocess.Popen([PYTHON, "-c", WRITE_THEN_CLOSE, m.path(str(wl.pid), "ctl"),
                               "checkpoint"], stdout=subprocess.PIPE, text=True)
    held = {}
    try:
        hold_dumps(m, [wl.pid], lambda _: writer.poll() is not None, held)
        assert held, "the checkpoint ended before its dump could be held"
        daemons = m.daemon_pids()
        assert daemons, "no daemon serves the mount"
        for pid in daemons:
            os.kill(pid, signal.SIGTERM)
        time.sleep(1)
        assert m.daemon_pids(), "the daemon exited with a command still running"
        assert writer.poll() is None, "the write returned while its dump was held"
    finally:
        release_dumps(held)
        out, _ = writer.communicate(timeout=300)
    assert out.strip() == "write: ok", f"the checkpoint the daemon finished before exiting: {out}"
    wait_for(lambda: not m.daemon_pids(), 60, "the daemon to exit after its last command")
    assert not os.path.ismount(m.mnt), "the daemon exited without unmounting"
    m.start_daemon()
    made = m.ids()
    assert len(made) == 1, made
    m.assert_complete(made[0], wl.pid)
    wl.assert_passes("wl_memory after the daemon stopped during its checkpoint")


# --- Permissions: an ordinary user -------------------------------------------------


def test_user_neither_sees_checkpoints_reads_nor_restores_roots_process(mount, users):
    user = users[0]
    wl = mount.start("wl_memory", "--mib", "8")
    ckpt_id = mount.checkpoint(wl.pid)
    assert str(wl.pid) not in listdir_as(user, mount.mnt), f"the user sees root's pid {wl.pid}"
    expect_error("the user checkpoints root's process",
                 [errno.EACCES, errno.EPERM, errno.ENOENT],
                 mount.path(str(wl.pid), "ctl"), "checkpoint", user)
    assert not can_read(user, mount.path("checkpoints", ckpt_id, "images", "pstree.img")), \
        "the user reads root's images"
    wl.kill()
    # Absent to them, as in the mount's listings.
    expect_error("the user restores root's checkpoint", [errno.ENOENT],
                 mount.path("restore"), mount.path("checkpoints", ckpt_id), user)
    assert not wl.alive(), "root's process came back from the user's restore"


def test_user_sees_checkpoints_copies_and_restores_their_own_process(mount, users):
    user = users[0]
    wl = mount.start("wl_memory", "--mib", "8", user=user)
    # Listings come from a /proc scan cached for a second: a process
    # appears within one.
    wait_for(lambda: str(wl.pid) in listdir_as(user, mount.mnt), 3,
             f"the user to see their own pid {wl.pid}")
    ckpt_id = mount.checkpoint(wl.pid, user=user)
    mount.assert_complete(ckpt_id, wl.pid)
    assert can_read(user, mount.path("checkpoints", ckpt_id, "images", "pstree.img")), \
        "the user cannot read their images"
    home = os.path.join(mount.work, "user")
    os.mkdir(home, 0o700)
    os.chown(home, user.uid, user.gid)
    copy = os.path.join(home, "copy")
    r = user.run(["cp", "-r", mount.path("checkpoints", ckpt_id), copy], timeout=300)
    assert r.returncode == 0, f"the user cannot cp -r their checkpoint: {r.stderr}"
    same_tree(user, mount.path("checkpoints", ckpt_id), copy)
    wl.kill()
    mount.restore(copy, wl.pid, user)
    assert proc_status_field(wl.pid, "Uid").split()[0] == str(user.uid), \
        "the user's restored process does not run as the user"
    wl.assert_passes("the user's wl_memory restored from their copy")


# --- The daemon killed in the middle of a checkpoint -------------------------------

# One write of "checkpoint\n" into argv[1], whatever its outcome.
_CHECKPOINT_WRITER = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY)
    os.write(fd, b"checkpoint\\n")
except OSError:
    pass
"""


def test_daemon_killed_during_a_checkpoint_leaves_the_process_running(mount):
    # A checkpoint before, so that the new daemon has a complete one to show.
    small = mount.start("wl_memory", "--mib", "8")
    mount.checkpoint(small.pid)
    big = mount.start("wl_big", "--mib", BIG_MIB)
    conn = os.minor(os.stat(mount.mnt).st_dev)
    writer = subprocess.Popen([PYTHON, "-c", _CHECKPOINT_WRITER, mount.path(str(big.pid), "ctl")])
    try:
        # Killed once the checkpoint is under way (or after half a second).
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                if status_line(mount.mnt, big.pid, "operation") != "idle":
                    break
            except (OSError, AssertionError):
                pass
            time.sleep(0.01)
        daemons = mount.daemon_pids()
        assert daemons, "no daemon to kill"
        for pid in daemons:
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["fusermount3", "-u", "-z", mount.mnt], check=True)
        try:
            writer.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with open(f"/sys/fs/fuse/connections/{conn}/abort", "w") as f:
                f.write("1\n")
            raise AssertionError("the ctl write still blocks 20 s after the daemon was killed")
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
    assert_runs_on(big)

    # A new daemon on the same store: the interrupted checkpoint's id is
    # absent, or complete; so is every other.
    mount.start_daemon()
    ids = mount.ids()
    assert f"{small.pid}-1" in ids, ids
    for ckpt_id in ids:
        mount.assert_complete(ckpt_id)

    # It checkpoints and restores; wl_big still passes.
    wl = mount.start("wl_memory", "--mib", "8")
    ckpt_id = mount.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 10, f"pid {wl.pid} to end after checkpoint --kill")
    mount.restore(mount.path("checkpoints", ckpt_id), wl.pid)
    wl.assert_passes("wl_memory checkpointed by the new daemon")
    big.assert_passes("wl_big after its checkpoint's daemon was killed")
    small.assert_passes("wl_memory checkpointed by the killed daemon")

    mount.unmount()
