"""Lazy restores through a real mount and CRIU's lazy-pages server: the
tree runs before its memory is in, every page of it checks out once it is,
`cat restore`, the tree's status and the metrics say how far it is, its
checkpoint cannot be removed meanwhile, a daemon that dies meanwhile takes
the tree down with it (never leaving it to read zeros) and the next daemon
says so, an ordinary user's tree comes back eagerly, saying why,
only a lazy restore's server has the daemon copy pages into a tree, its
background batches stay small while the tree faults, and with
--direct-reads restores read the store past the page cache.

A lazy-pages server is held (StoppingCriu: stopped once it listens, before
its restore has restored anything) where a test must look at a tree still
coming in: the tree then waits at its first fault. Such a tree runs without
glibc's rseq (NO_RSEQ): CRIU writes a task's rseq area, in its lazily
restored memory, before the restore returns, which needs the server."""

import glob
import json
import os
import re
import signal
import subprocess
import threading

import pytest

from gpuckpt_testing.benchmarks import drop_caches
from gpuckpt_testing.build import PYTHON
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, why_not_runnable
from gpuckpt_testing.processes import live_processes, proc_state, wait_for
from gpuckpt_testing.stopping_criu import StoppingCriu
from gpuckpt_testing.users import Root

pytestmark = pytest.mark.skipif(why_not_runnable() is not None, reason=str(why_not_runnable()))

NO_RSEQ = dict(os.environ, GLIBC_TUNABLES="glibc.pthread.rseq=0")


def restore_text(m, user=None):
    ok, text = (user or Root()).read(m.path("restore"))
    assert ok, text
    return text


@pytest.fixture
def holding_mount():
    """Makes mounts (prefix, daemon options) whose lazy-pages servers are
    held once they listen (StoppingCriu); afterwards continues what is
    still held and closes them."""
    made = []

    def make(prefix, *options):
        criu = StoppingCriu(verbs=(), hold_lazy_pages=True)
        m = Mount(prefix, "--criu", criu.path, *options)
        m.criu, m.held = criu, set()
        made.append(m)
        return m
    yield make
    for m in made:
        for pid in m.held:
            m.criu.resume(pid)
        m.close()
        m.criu.close()


def release(m, server):
    m.held.discard(server)
    m.criu.resume(server)


def restore_held(m, made, options=" --lazy"):
    """Restores `made` (lazily, with `options`) on a holding_mount, its
    server held; the server's pid."""
    result = {}
    writer = threading.Thread(target=lambda: result.update(
        write=Root().write(m.path("restore"), m.path("checkpoints", made) + options)))
    writer.start()
    server = m.criu.held_lazy_server()
    m.held.add(server)
    writer.join(timeout=60)
    if writer.is_alive():
        release(m, server)
        raise AssertionError("the restore did not return while its server was held")
    ok, err = result["write"]
    assert ok, f"lazy restore of {made}: {err}; {restore_text(m)}"
    return server


def wait_resident(m, user=None, seconds=120):
    wait_for(lambda: "resident: all" in restore_text(m, user), seconds,
             "the lazily restored tree to be resident")


def read_ahead_line(m, pattern):
    """The match of `pattern` in the daemon's debug line on its read-ahead of
    a server's page image, which comes as the server closes the image; on a
    timeout, the log's end and any lazy-pages server still running say
    more."""
    log = os.path.join(m.state_dir, "gpuckptfs.log")
    try:
        wait_for(lambda: re.search(pattern, read(log)), 30, "the read-ahead's log line")
    except AssertionError as e:
        servers = subprocess.run(["pgrep", "-af", "criu lazy-pages"], capture_output=True,
                                 text=True).stdout
        raise AssertionError(f"{e}; servers still running: {servers!r}; "
                             f"the daemon's log ends: {read(log)[-4000:]}") from None
    return re.search(pattern, read(log))


def test_a_lazy_restore_runs_before_its_memory_is_in_and_every_page_checks_out(holding_mount,
                                                                                users):
    """With the daemon's --lazy-restore default: the restore returns while
    the server is held (so before the tree's memory is in); `cat restore`,
    the tree's status and status.json and the metrics say how far it is;
    the checkpoint cannot be removed (EBUSY); released, the tree becomes
    resident, every byte of its memory is as checkpointed, and the
    checkpoint can go. The daemon reads ahead of the server (which it does
    by default only on 4 CPUs or more), so the pages it serves from its
    read-ahead are checked too."""
    m = holding_mount("gpuckpt-lazy.", "--lazy-restore", "--lazy-read-ahead-threads", "2",
                      "--lazy-copy-batch-mib", "8", "--log-level", "debug")
    wl = m.start("wl_memory", "--mib", "512", env=NO_RSEQ)
    made = m.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 30, "the killed workload to go")
    server = restore_held(m, made, options="")
    # A CPU tree's server waits for the tree's next fault before it goes on
    # with its background pass (tools/criu-patches/0006), follows the
    # stride its faults come at (0007) and has the daemon copy its pages
    # into the tree (0008).
    with open(f"/proc/{server}/environ", "rb") as f:
        environment = f.read().split(b"\0")
    assert b"GPUCKPT_LAZY_FAULT_HOLD_MS=1" in environment
    assert b"GPUCKPT_LAZY_FOLLOW_STRIDES=1" in environment
    assert b"GPUCKPT_LAZY_COPY_BY_DAEMON=1" in environment
    # ... and, asked to, for its background pass in batches of 8 MiB (0009).
    assert b"GPUCKPT_LAZY_COPY_BATCH_MIB=8" in environment
    text = restore_text(m)
    assert re.match(rf"pid {wl.pid}\nlazy: yes\nresident: [\d.]+ of about [\d.]+ MB "
                    r"\(\d+%\), [\d.]+ s, [\d.]+ MB/s\n$", text), text
    status = read(m.path(str(wl.pid), "status"))
    assert re.search(rf"^lazy_restore: {re.escape(made)}, resident [\d.]+ of about", status,
                     re.M), status
    lazy = json.loads(read(m.path(str(wl.pid), "status.json")))["lazy_restore"]
    assert lazy["checkpoint"] == made and lazy["expected_bytes"] > 400 << 20, lazy
    assert lazy["bytes_read"] < lazy["expected_bytes"], lazy
    metrics = read(m.path("metrics"))
    assert "gpuckpt_lazy_restores_in_flight 1\n" in metrics
    r = subprocess.run(["rm", "-r", m.path("checkpoints", made)], capture_output=True, text=True)
    assert r.returncode != 0 and "busy" in r.stderr.lower(), r.stderr
    assert made in m.ids()
    # Another user learns nothing of it: root's checkpoint is absent to
    # them (not busy), and their own `restore` says nothing of root's.
    other = users[0]
    r = other.run(["rm", "-r", m.path("checkpoints", made)])
    assert r.returncode != 0 and "No such file" in r.stderr, r.stderr
    assert restore_text(m, other) == "none\n"

    release(m, server)
    wait_resident(m)
    assert re.search(r"^resident: all [\d.]+ MB, in [\d.]+ s$", restore_text(m), re.M)
    assert "lazy_restore:" not in read(m.path(str(wl.pid), "status"))
    assert wl.verdict() == "PASS"
    # The server's image of the memory was read ahead (its log line, at
    # debug level, comes as the server closes it).
    log = os.path.join(m.state_dir, "gpuckptfs.log")
    pattern = r"lazy_read_ahead file=\S*pages-\d+\.img slabs=(\d+) slab_bytes=(\d+) "
    slabs, slab_bytes = map(int, read_ahead_line(m, pattern).groups())
    assert slabs * slab_bytes > 256 << 20, read(log)
    # And the daemon copied the pages into the tree: nearly all of the page
    # images (the server reads only its small images itself).
    copied = re.search(r"lazy restore id=\S+ pid=\d+ result=resident bytes=(\d+) "
                       r"copied_by_daemon=(\d+)", read(log))
    assert copied, read(log)[-3000:]
    page_bytes, copied_bytes = map(int, copied.groups())
    assert copied_bytes >= 0.9 * page_bytes and copied_bytes >= 400 << 20, copied.group(0)
    metrics = read(m.path("metrics"))
    assert 'gpuckpt_lazy_restores_total{result="resident"} 1\n' in metrics
    # What the daemon copied, told apart: the tree's faults, and the rest.
    served = dict(re.findall(r'^gpuckpt_lazy_restore_copied_bytes_total\{served="(\w+)"\} (\d+)$',
                             metrics, re.M))
    assert int(served["fault"]) > 0 and int(served["background"]) > 0, served
    assert int(served["fault"]) + int(served["background"]) == copied_bytes, (served, copied_bytes)
    # Most of the background pass came in batches (512 MiB in batches of
    # up to 8 MiB: 64 or more, unless they went one range at a time).
    batches = int(re.search(r"^gpuckpt_lazy_restore_copy_batches_total (\d+)$", metrics,
                            re.M).group(1))
    assert batches >= 32, metrics
    assert "gpuckpt_lazy_restores_in_flight 0\n" in metrics
    subprocess.run(["rm", "-r", m.path("checkpoints", made)], check=True)
    # --eager overrides the daemon's default.
    wl = m.start("wl_memory", "--mib", "64")
    made = m.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 30, "the killed workload to go")
    ok, err = Root().write(m.path("restore"), f"{m.path('checkpoints', made)} --eager")
    assert ok, err
    assert restore_text(m) == f"pid {wl.pid}\n"
    assert wl.verdict() == "PASS"


def checkpointed_steps_job(m, mib, hot_mib):
    """wl_steps (--mib, --hot-mib) on `m`, checkpointed with --kill once it
    has made steps, and gone: (the workload, its steps file, the
    checkpoint)."""
    wl = m.start("wl_steps", "--mib", mib, "--hot-mib", hot_mib)
    steps = wl.result + ".steps"
    wait_for(lambda: os.path.exists(steps) and len(read(steps).splitlines()) >= 3, 30,
             "the job to make steps")
    made = m.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 30, "the killed workload to go")
    return wl, steps, made


def test_a_tree_that_faults_at_a_stride_is_read_ahead_along_it_and_every_page_checks_out():
    """A job whose steps read 64 KiB of every MiB (wl_steps), restored
    lazily with the daemon's defaults: its faults come at a fixed stride,
    so the daemon reads the server's image ahead along it
    (fs/stream_read_ahead.h) and the server transfers along it ahead of the
    faults (tools/criu-patches/0007). The job's steps check every page they
    read as they go, and every page once resident, and the daemon's log
    says that reads were served from the strided read-ahead."""
    m = Mount("gpuckpt-lazy-stride.", "--lazy-restore", "--log-level", "debug")
    try:
        wl, steps, made = checkpointed_steps_job(m, "256", "16")
        before = len(read(steps).splitlines())
        ok, err = Root().write(m.path("restore"), m.path("checkpoints", made))
        assert ok, f"lazy restore of {made}: {err}; {restore_text(m)}"
        assert restore_text(m).startswith(f"pid {wl.pid}\nlazy: yes\n"), restore_text(m)
        wait_resident(m)
        wait_for(lambda: len(read(steps).splitlines()) >= before + 3, 30,
                 "the restored job to make steps")
        assert wl.verdict() == "PASS"
        log = os.path.join(m.state_dir, "gpuckptfs.log")
        pattern = (r"lazy_read_ahead file=\S*pages-\d+\.img slabs=\d+ slab_bytes=\d+ "
                   r"strided_reads=(\d+) reads_from_read_ahead=(\d+)")
        strided, served = map(int, read_ahead_line(m, pattern).groups())
        # A step faults 256 times, 1 MiB apart.
        assert strided >= 100 and served >= 100, read(log)
    finally:
        m.close()


def test_without_batches_the_background_pass_comes_one_range_at_a_time():
    """With --lazy-copy-batch-mib 0 the server asks for its background pass
    one range at a time (no batch counted), and every page checks out."""
    m = Mount("gpuckpt-lazy-single.", "--lazy-restore", "--lazy-copy-batch-mib", "0")
    try:
        wl = m.start("wl_memory", "--mib", "256", env=NO_RSEQ)
        made = m.checkpoint(wl.pid, "--kill")
        wait_for(wl.gone, 30, "the killed workload to go")
        ok, err = Root().write(m.path("restore"), m.path("checkpoints", made))
        assert ok, f"lazy restore of {made}: {err}; {restore_text(m)}"
        assert restore_text(m).startswith(f"pid {wl.pid}\nlazy: yes\n"), restore_text(m)
        wait_resident(m)
        assert wl.verdict() == "PASS"
        metrics = read(m.path("metrics"))
        assert "gpuckpt_lazy_restore_copy_batches_total 0\n" in metrics, metrics
        background = re.search(r'^gpuckpt_lazy_restore_copied_bytes_total\{served="background"\} '
                               r"(\d+)$", metrics, re.M)
        assert int(background.group(1)) > 128 << 20, metrics
    finally:
        m.close()


def test_a_background_batch_grows_with_the_time_since_the_last_fault():
    """With batches of up to 32 MiB (the default on 4 CPUs or more) the
    server's background batches gather all of that only once the tree has
    gone 100 ms without a fault, and a share in proportion to the time
    since its last fault before (tools/criu-patches/0009), so that a fault
    waits behind a batch at most in proportion to the time since the one
    before. A tree whose stall meter reads a page far from the last one every
    millisecond faults all through its restore; the server's log (at debug
    level) shows when each fault and each batch came, and no batch was
    larger than that allows. Every page checks out."""
    criu = StoppingCriu(verbs=(), lazy_pages_debug=True)
    m = Mount("gpuckpt-lazy-batches.", "--criu", criu.path, "--lazy-restore", "--keep-logs",
              "--lazy-copy-batch-mib", "32")
    try:
        wl = m.start("wl_memory", "--mib", "512", "--stall", env=NO_RSEQ)
        made = m.checkpoint(wl.pid, "--kill")
        wait_for(wl.gone, 30, "the killed workload to go")
        ok, err = Root().write(m.path("restore"), m.path("checkpoints", made))
        assert ok, f"lazy restore of {made}: {err}; {restore_text(m)}"
        wait_resident(m)
        assert wl.verdict() == "PASS"
        logs = glob.glob(os.path.join(m.run_dir, "restore-*", "lazy-pages.log"))
        assert len(logs) == 1, logs
        text = read(logs[0])
        faults = [float(t) for t in re.findall(r"^\((\d+\.\d+)\).*#PF at ", text, re.M)]
        batches = [(float(t), int(size), int(limit)) for t, size, limit in re.findall(
            r"^\((\d+\.\d+)\).*gpuckpt batch: \d+ ranges, (\d+) bytes, limit (\d+), ",
            text, re.M)]
        assert len(faults) >= 50, f"{len(faults)} faults: {text[-3000:]}"
        assert batches, text[-3000:]
        full, quiet_s = 32 << 20, 0.1
        # A fault's line comes just after the server notes its time: a
        # little slack for that.
        slack_s = 0.005
        for at, size, limit in batches:
            before = [t for t in faults if t <= at]
            since = at - before[-1] + slack_s if before else quiet_s
            assert limit <= full * min(1.0, since / quiet_s), (at, size, limit, before[-1:])
            # The last range gathered may go past the limit: at most 4 MiB.
            assert size <= limit + (4 << 20), (at, size, limit)
        # Some came while the tree faulted, and were held small.
        assert min(limit for _, _, limit in batches) < full // 4, batches[:10]
    finally:
        m.close()
        criu.close()


def test_a_daemon_that_dies_before_the_tree_is_resident_takes_the_tree_down(holding_mount):
    """The daemon is killed while a lazily restored tree's server is held:
    released, the server cannot read the mount any more, and kills the tree
    (which never runs on with pages it did not get); the next daemon's log
    says what became of it, and the checkpoint restores again."""
    m = holding_mount("gpuckpt-lazy-killed.")
    wl = m.start("wl_memory", "--mib", "512", env=NO_RSEQ)
    made = m.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 30, "the killed workload to go")
    server = restore_held(m, made)
    assert proc_state(wl.pid) not in ("", "Z"), "the tree is not running"
    for pid in m.daemon_pids():
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not m.daemon_pids(), 30, "the killed daemon to go")
    release(m, server)
    # wl_memory checks its memory only on SIGUSR1: asked now, it would
    # answer FAIL if it ran on with zeros where its pages were.
    try:
        os.kill(wl.pid, signal.SIGUSR1)
    except ProcessLookupError:
        pass
    wait_for(lambda: proc_state(wl.pid) in ("", "Z"), 30, "the tree to be killed")
    assert not os.path.exists(wl.result), f"the tree answered: {read(wl.result)}"
    (work,) = glob.glob(os.path.join(m.run_dir, f"restore-{made}-*"))
    log = read(os.path.join(work, "lazy-pages.log"))
    assert f"Killing lazily restored task {wl.pid}" in log, log[-2000:]

    subprocess.run(["fusermount3", "-u", m.mnt], check=False)
    m.start_daemon()
    daemon_log = read(os.path.join(m.state_dir, "gpuckptfs.log"))
    assert re.search(rf"recovery: lazy restore id={re.escape(made)} pid={wl.pid} was still "
                     r"coming in when a previous daemon stopped, so its lazy-pages server "
                     r"killed the tree", daemon_log), daemon_log[-3000:]
    ok, err = Root().write(m.path("restore"), m.path("checkpoints", made))
    assert ok, err
    assert wl.verdict() == "PASS"


def test_a_stopped_daemon_serves_until_its_lazy_trees_are_resident(holding_mount):
    """SIGTERM to the daemon while a lazily restored tree's server is held:
    the daemon serves on (the mount answers, its log says why), and exits
    by itself once the tree is resident; the tree checks out."""
    m = holding_mount("gpuckpt-lazy-stop.")
    wl = m.start("wl_memory", "--mib", "256", env=NO_RSEQ)
    made = m.checkpoint(wl.pid, "--kill")
    wait_for(wl.gone, 30, "the killed workload to go")
    server = restore_held(m, made)
    daemons = m.daemon_pids()
    for pid in daemons:
        os.kill(pid, signal.SIGTERM)
    log = os.path.join(m.state_dir, "gpuckptfs.log")
    wait_for(lambda: "stopping: waiting up to 600 s for 1 lazily restored tree(s)" in read(log),
             30, "the daemon to say it waits")
    assert m.daemon_pids() == daemons, "the daemon exited with a tree still coming in"
    assert restore_text(m).startswith(f"pid {wl.pid}\nlazy: yes\nresident: ")
    release(m, server)
    wait_for(lambda: not m.daemon_pids(), 60, "the daemon to exit once the tree is resident")
    assert "result=resident" in read(log), read(log)[-2000:]
    assert wl.verdict() == "PASS"


def test_a_users_tree_is_restored_eagerly_and_says_why(users):
    """An ordinary user's tree (restored as its owner, also when root asks)
    comes back eagerly, whole, and `cat restore` says why it was not lazy:
    the kernel lets only a holder of CAP_SYS_PTRACE follow a lazily
    restored process's forks."""
    a = users[0]
    m = Mount("gpuckpt-lazy-user.", "--lazy-restore")
    try:
        wl = m.start("wl_memory", "--mib", "64", user=a)
        made = m.checkpoint(wl.pid, "--kill", user=a)
        wait_for(wl.gone, 30, "the killed workload to go")
        ok, err = a.write(m.path("restore"), m.path("checkpoints", made))
        assert ok, err
        text = restore_text(m, a)
        assert text.startswith(f"pid {wl.pid}\nlazy: no (an ordinary user's tree is restored "
                               "eagerly: ") and "CAP_SYS_PTRACE" in text, text
        assert not live_processes(lambda argv: len(argv) > 1 and argv[1] == b"lazy-pages")
        assert wl.verdict() == "PASS"
        # Root restoring the user's checkpoint restores it as its owner:
        # eagerly too.
        wl = m.start("wl_memory", "--mib", "64", user=a)
        made = m.checkpoint(wl.pid, "--kill", user=a)
        wait_for(wl.gone, 30, "the killed workload to go")
        ok, err = Root().write(m.path("restore"), m.path("checkpoints", made) + " --lazy")
        assert ok, err
        text = restore_text(m)
        assert text.startswith(f"pid {wl.pid}\nlazy: no (an ordinary user's tree"), text
        assert wl.verdict() == "PASS"
    finally:
        m.close()


# What a lazy restore's server asks the daemon with: _IOWR('g', 1, 48 bytes)
# for a range, _IOWR('g', 2, 1296 bytes) for a batch of them
# (fs/lazy_page_copy.h).
LAZY_COPY_IOCTL = (3 << 30) | (48 << 16) | (ord("g") << 8) | 1
LAZY_COPY_BATCH_IOCTL = (3 << 30) | (1296 << 16) | (ord("g") << 8) | 2


def test_an_image_opened_by_anyone_but_a_lazy_server_copies_nothing(mount, users):
    """The daemon copies pages into a task only for the lazy-pages server
    that opened the image: root's reader, or a user's of their own
    checkpoint, asking the same of an open page image (a range, or a batch
    of them) gets ENOTTY, as from any file that takes no ioctl, and the
    image reads on as before; so does anyone asking it of a directory or a
    control file."""
    user = users[0]
    for owner in (None, user):
        wl = mount.start("wl_memory", "--mib", "16", user=owner)
        made = mount.checkpoint(wl.pid, "--kill", user=owner)
        wait_for(wl.gone, 30, "the killed workload to go")
        pages = sorted(glob.glob(mount.path("checkpoints", made, "images", "pages-*.img")))
        assert pages, os.listdir(mount.path("checkpoints", made, "images"))
        script = ("import fcntl, errno, struct, sys\n"
                  "f = open(sys.argv[1], 'rb')\n"
                  "one = struct.pack('<QQQiiQII', 4096, 0, 4096, 0, 0, 0, 0, 0)\n"
                  "batch = struct.pack('<iIQQQQQiI', 0, 1, 0, 4096, 0, 4096, 0, 0, 0)\n"
                  "for cmd, request in ((sys.argv[2], one), (sys.argv[3], batch)):\n"
                  "    try:\n"
                  "        fcntl.ioctl(f, int(cmd), bytearray(request.ljust(int(cmd) >> 16 & 0x3fff, b'\\0')))\n"
                  "        print('copied')\n"
                  "    except OSError as e:\n"
                  "        print(errno.errorcode[e.errno])\n"
                  "print(len(f.read(4096)))\n")
        reader = owner or Root()
        r = reader.run([PYTHON, "-c", script, pages[0], str(LAZY_COPY_IOCTL),
                        str(LAZY_COPY_BATCH_IOCTL)])
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["ENOTTY", "ENOTTY", "4096"], (reader.name, r.stdout,
                                                                 r.stderr)
    # Nor does a directory of the mount, nor a control file.
    script = ("import fcntl, errno, os, struct, sys\n"
              "for path in sys.argv[2:]:\n"
              "    fd = os.open(path, os.O_RDONLY)\n"
              "    try:\n"
              "        fcntl.ioctl(fd, int(sys.argv[1]), bytes(48))\n"
              "        print('copied')\n"
              "    except OSError as e:\n"
              "        print(errno.errorcode[e.errno])\n")
    r = Root().run([PYTHON, "-c", script, str(LAZY_COPY_IOCTL), mount.path("checkpoints", made),
                    mount.path("checkpoints"), mount.path("restore")])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ENOTTY"] * 3, r.stdout
    assert os.listdir(mount.path("checkpoints")), "the daemon answers on"


def test_a_restore_with_both_lazy_and_eager_is_refused(mount):
    ok, err = Root().write(mount.path("restore"), "/nonexistent --lazy --eager")
    assert not ok and "Invalid argument" in err, err
    assert "excludes" in restore_text(mount), restore_text(mount)


def packs_cached_share(m):
    """The share of the store's pack files that is in the page cache."""
    packs = glob.glob(os.path.join(m.store, "packs", "*.pack"))
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *packs],
                       capture_output=True, text=True, check=True)
    cached = size = 0
    for line in r.stdout.splitlines():
        res, total = map(int, line.split())
        cached, size = cached + res, size + total
    assert size > 0, r.stdout
    return cached / size


def test_direct_reads_restore_cold_eagerly_and_lazily_past_the_page_cache():
    """With --direct-reads, a job restored with the page cache dropped,
    eagerly and then lazily, comes back with every page as checkpointed,
    and the store's packs stay out of the page cache (read straight from
    the disk): a daemon without the option would have read them all into
    it."""
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        pytest.skip("cannot drop the page cache here (/proc/sys/vm/drop_caches is not writable)")
    m = Mount("gpuckpt-direct.", "--direct-reads")
    try:
        wl, steps, made = checkpointed_steps_job(m, "192", "8")
        spool = os.path.join(m.store, "spool")  # its images settled into the packs
        wait_for(lambda: not os.path.isdir(spool) or not os.listdir(spool), 120,
                 "the store to settle")
        for how in ("--eager", "--lazy"):
            drop_caches()
            ok, err = Root().write(m.path("restore"), m.path("checkpoints", made) + " " + how)
            assert ok, f"{how} restore of {made}: {err}; {restore_text(m)}"
            if how == "--lazy":
                wait_resident(m)
            before = len(read(steps).splitlines())
            wait_for(lambda: len(read(steps).splitlines()) >= before + 2, 30,
                     "the restored job to make steps")
            assert packs_cached_share(m) < 0.25, f"{how}: the packs went into the page cache"
            assert wl.verdict() == "PASS", how  # every page checked; then it exits
            wait_for(wl.gone, 30, "the restored job to go")
    finally:
        m.close()
