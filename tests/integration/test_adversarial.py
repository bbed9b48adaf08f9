"""Two ordinary users and root against one gpuckptfs mount: what one user
can make the daemon (running as root) do for them, or to the others.

Images are edited with CRIU's own image tool, crit (tools/install-criu
installs it). Each case says what must be refused, with which errno, and
checks that nothing leaked, hung (every write is bounded by a timeout) or
was lost.

Run by ctest under wl_reaper, like the other pytest tests (gpuckpt_testing.mount).
"""

import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from gpuckpt_testing.build import PYTHON
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, ctl, status_line, why_not_runnable
from gpuckpt_testing.processes import kill_if_alive, wait_for
from gpuckpt_testing.stopping_criu import StoppingCriu

CRIT = shutil.which("crit") or "/usr/local/bin/crit"

pytestmark = pytest.mark.skipif(why_not_runnable("wl_threads") is not None,
                                reason=str(why_not_runnable("wl_threads")))

# Opens argv[1], says "open", waits for a line, then reads the whole file
# with read() and through mmap and prints the SHA-256 of each (a reader
# that mmap reads a file the daemon cannot serve dies of SIGBUS).
HOLD_THEN_READ = """
import hashlib, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("open", flush=True)
sys.stdin.readline()
size = os.fstat(fd).st_size
data = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
print(hashlib.sha256(data).hexdigest())
with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
    print(hashlib.sha256(mapped[:]).hexdigest())
"""

# Every capability, as CRIU's creds record holds them (two 32-bit words).
ALL_CAPS = [0xFFFFFFFF, 0x1FF]
CAP_SETPCAP_ONLY = [1 << 8, 0]


def crit_decode(path):
    out = subprocess.run([CRIT, "decode", "-i", path], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def crit_encode(image, path):
    subprocess.run([CRIT, "encode", "-o", path], input=json.dumps(image), text=True, check=True)


def copy_as(m, user, checkpoint_id, name):
    """A `cp -r` of a checkpoint into a directory of `user`'s own."""
    home = os.path.join(m.work, "home-" + user.name)
    if not os.path.isdir(home):
        os.mkdir(home, 0o700)
        os.chown(home, user.uid, user.gid)
    dest = os.path.join(home, name)
    r = user.run(["cp", "-r", m.path("checkpoints", checkpoint_id), dest])
    assert r.returncode == 0, r.stderr
    return dest


def copied_checkpoint(m, user, workload, name, *args):
    """`user` starts `workload`, checkpoints it and copies the checkpoint
    into a directory of theirs: (the workload, the checkpoint's id, the copy)."""
    wl = m.start(workload, *args, user=user)
    made = m.checkpoint(wl.pid, user=user)
    return wl, made, copy_as(m, user, made, name)


def edit_as(user, path, edit):
    """Decodes the image `path` with crit, lets `edit` change it, encodes it
    back; the file stays the user's (as if they had done it)."""
    image = crit_decode(path)
    edit(image)
    crit_encode(image, path)
    os.chown(path, user.uid, user.gid)


# --- Provenance: a planted checkpoint never runs as root ---------------------------

def test_import_claiming_root_and_a_root_jobs_pid_is_not_that_jobs_and_never_runs_as_root(
        mount, users):
    m = mount
    a, _ = users
    job = m.start("wl_memory", "--mib", "8")  # root's job
    mine = m.start("wl_memory", "--mib", "8", user=a)
    made = m.checkpoint(mine.pid, user=a)
    copy = copy_as(m, a, made, "planted")
    images = os.path.join(copy, "images")

    # The user's edit: the tree's root is now root's job, running as uid 0
    # with every capability.
    old = mine.pid
    def claim_root_job(image):
        entry = image["entries"][0]
        entry.update(pid=job.pid, pgid=job.pid, sid=job.pid, threads=[job.pid])
    edit_as(a, os.path.join(images, "pstree.img"), claim_root_job)
    def as_root(image):
        creds = image["entries"][0]["thread_core"]["creds"]
        for key in ("uid", "euid", "suid", "fsuid", "gid", "egid", "sgid", "fsgid"):
            creds[key] = 0
        creds["groups"] = [0]
        for key in ("cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb"):
            creds[key] = ALL_CAPS
    core = os.path.join(images, f"core-{job.pid}.img")
    os.rename(os.path.join(images, f"core-{old}.img"), core)
    edit_as(a, core, as_root)

    before = set(m.ids(a))
    ok, err = a.write(m.path("ctl"), f"import {copy}")
    assert ok, err
    (planted,) = set(m.ids(a)) - before
    manifest = json.loads(read(m.path("checkpoints", planted, "manifest.json")))
    assert manifest["extra"]["made_by"]["uid"] == a.uid
    assert manifest["extra"]["pid"] == job.pid

    # Root's job does not list it.
    listed = os.listdir(m.path(str(job.pid), "checkpoints"))
    assert listed == [], f"root's job lists {listed}"

    # Root restores it by id: refused (EACCES), nothing comes back as root.
    job.kill()
    with pytest.raises(PermissionError):
        ctl(m.path("restore"), m.path("checkpoints", planted))
    said = read(m.path("restore"))
    assert "claims uid 0" in said, said
    assert not os.path.exists(f"/proc/{job.pid}"), f"a process came back as pid {job.pid}"
    # Through the job's own directory once the job is gone: the job had no
    # checkpoint, and the user's import is none of its (EINVAL).
    with pytest.raises(OSError) as e:
        ctl(m.path("restore"), m.path(str(job.pid), "checkpoints", "latest"))
    assert e.value.errno == 22, e.value
    said = read(m.path("restore"))
    assert "has 0 checkpoints" in said, said
    assert not os.path.exists(f"/proc/{job.pid}"), f"a process came back as pid {job.pid}"


def test_thread_holding_a_capability_is_refused_and_the_refused_copy_leaves_nothing(
        mount, users):
    m = mount
    a, _ = users
    wl, made, copy = copied_checkpoint(m, a, "wl_threads", "threads")
    images = os.path.join(copy, "images")
    tree = crit_decode(os.path.join(images, "pstree.img"))["entries"][0]
    thread = [t for t in tree["threads"] if t != tree["pid"]][-1]
    def ambient_setpcap(image):
        creds = image["entries"][0]["thread_core"]["creds"]
        for key in ("cap_inh", "cap_prm", "cap_amb"):
            creds[key] = CAP_SETPCAP_ONLY
    edit_as(a, os.path.join(images, f"core-{thread}.img"), ambient_setpcap)

    wl.kill()
    before = set(m.ids(a))
    ok, err, said = m.try_restore(copy, a)
    assert not ok and "Permission denied" in err, (err, said)
    assert f"thread {thread} of process {tree['pid']}" in said and "capabilities" in said, said
    assert not wl.alive(), "the process came back with a capability"
    assert set(m.ids(a)) == before, "the refused copy's import stayed in the store"

    # The user's own, unedited checkpoint still restores.
    ok, err, said = m.try_restore(m.path("checkpoints", made), a)
    assert ok, f"{err}: {said}"
    assert wl.verdict() == "PASS"


# --- Nothing a user hands in is opened as root to their benefit ---------------------

def test_swapped_criu_log_is_never_read_through(users):
    a, _ = users
    # The user's CRIU (it runs as them) stops itself before it starts; the
    # user then puts a symlink to a root-only file where its log and its
    # stderr are, and kills it, so that the dump fails and the daemon reads
    # both to say why.
    criu = StoppingCriu(verbs=("dump",))
    m = Mount("gpuckpt-adversarial-log.", "--criu", criu.path)
    held = None
    try:
        wl = m.start("wl_big", "--mib", "64", user=a)
        result = {}

        def checkpoint():
            result["ok"], result["err"] = a.write(m.path(str(wl.pid), "ctl"), "checkpoint")
        writer = threading.Thread(target=checkpoint)
        writer.start()
        held = criu.stopped("dump")
        (work,) = glob.glob(os.path.join(m.run_dir, f"checkpoint-{wl.pid}-*"))
        assert os.stat(work).st_uid == a.uid, "CRIU runs as the user in a directory not theirs"
        r = a.run(["ln", "-sfn", "/etc/shadow", os.path.join(work, "dump.log")])
        assert r.returncode == 0, r.stderr
        r = a.run(["ln", "-sfn", "/etc/shadow", os.path.join(work, "criu.stderr")])
        assert r.returncode == 0, r.stderr
        r = a.run(["kill", "-KILL", str(held)])
        assert r.returncode == 0, r.stderr
        held = None
        writer.join(timeout=120)
        assert not writer.is_alive(), "the checkpoint never returned"
        assert not result["ok"], "the dump of a killed CRIU succeeded"
        last = status_line(m.mnt, wl.pid, "last")
        with open("/etc/shadow") as f:
            shadow = [line.strip() for line in f if line.strip()]
        leaked = [line for line in shadow if line in last]
        assert not leaked, f"last: shows /etc/shadow: {last}"
        assert wl.alive(), "the process did not run on"
    finally:
        if held is not None:
            kill_if_alive(held)
        m.close()
        criu.close()


def fifo_in(directory, name, user):
    path = os.path.join(directory, name)
    os.mkfifo(path, 0o600)
    os.chown(path, user.uid, user.gid)


def test_fifos_and_symlinks_in_a_restore_or_import_fail_at_once(mount, users):
    m = mount
    a, _ = users
    home = os.path.join(m.work, "home-" + a.name)
    os.mkdir(home, 0o700)
    os.chown(home, a.uid, a.gid)
    cases = []
    # A CRIU image directory whose pstree.img is a FIFO.
    plain = os.path.join(home, "fifo-pstree")
    os.mkdir(plain)
    os.chown(plain, a.uid, a.gid)
    fifo_in(plain, "pstree.img", a)
    cases.append((plain, "not a regular file"))
    # A copy of a checkpoint whose manifest.json is a FIFO.
    wl = m.start("wl_memory", "--mib", "4", user=a)
    made = m.checkpoint(wl.pid, user=a)
    copy = copy_as(m, a, made, "fifo-manifest")
    os.unlink(os.path.join(copy, "manifest.json"))
    fifo_in(copy, "manifest.json", a)
    cases.append((copy, "manifest.json is not a regular file"))
    # ... and one whose manifest.json is a symlink to a root-only file.
    linked = copy_as(m, a, made, "symlink-manifest")
    os.unlink(os.path.join(linked, "manifest.json"))
    r = a.run(["ln", "-s", "/etc/shadow", os.path.join(linked, "manifest.json")])
    assert r.returncode == 0, r.stderr
    cases.append((linked, "manifest.json is a symlink"))

    before = set(m.ids(a))
    for path, why in cases:
        start = time.monotonic()
        ok, err, said = m.try_restore(path, a, timeout=30)
        assert not ok and "Invalid argument" in err, (path, err)
        assert why in said, (path, said)
        ok, err = a.write(m.path("ctl"), f"import {path}", timeout=30)
        assert not ok and "Invalid argument" in err, (path, err)
        assert time.monotonic() - start < 20, f"{path} took {time.monotonic() - start:.1f} s"
    assert set(m.ids(a)) == before, "a refused import stayed in the store"
    # Root's own restore is not held up behind them.
    wl.kill()
    ctl(m.path("restore"), m.path("checkpoints", made))
    assert wl.verdict() == "PASS"


def test_oversized_manifest_is_refused_without_reading_it(mount, users):
    m = mount
    a, _ = users
    wl, made, copy = copied_checkpoint(m, a, "wl_memory", "big-manifest", "--mib", "4")
    manifest = os.path.join(copy, "manifest.json")
    # 64 MB of JSON: one array of small objects, which a JSON parser turns
    # into far more memory than its size.
    with open(manifest, "w") as f:
        f.write('{"extra": {"gpus": [')
        f.write(",".join(['{"uuid": "x"}'] * (64_000_000 // 14)))
        f.write("]}}")
    os.chown(manifest, a.uid, a.gid)
    daemon = int(subprocess.run(["pgrep", "-o", "-f", f"gpuckptfs.*{m.mnt}"], capture_output=True,
                                text=True, check=True).stdout.split()[0])
    def rss_mb():
        for line in read(f"/proc/{daemon}/status").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")
    peak_before = rss_mb()
    wl.kill()
    ok, err, said = m.try_restore(copy, a)
    assert not ok and "Invalid argument" in err, err
    assert "manifest.json is too large" in said, said
    assert rss_mb() - peak_before < 32, f"peak RSS grew from {peak_before} to {rss_mb()} MB"


def test_paths_in_root_only_directories_say_no_more_than_to_the_user(mount, users):
    m = mount
    a, _ = users
    secret = os.path.join(m.work, "root-only")
    os.mkdir(secret, 0o700)
    os.mkdir(os.path.join(secret, "exists"))
    answers = []
    for name in ("exists", "missing"):
        ok, err, said = m.try_restore(os.path.join(secret, name), a)
        assert not ok and "Permission denied" in err, err
        answers.append(said.replace(name, "NAME"))
    assert answers[0] == answers[1], answers


# --- Names ---------------------------------------------------------------------------

def test_one_users_names_never_block_anothers(mount, users):
    m = mount
    a, b = users
    wl_a = m.start("wl_memory", "--mib", "4", user=a)
    wl_b = m.start("wl_memory", "--mib", "4", user=b)
    # The automatic form is the engine's: refused, whoever asks.
    ok, err = a.write(m.path(str(wl_a.pid), "ctl"), f"checkpoint --name {wl_b.pid}-999999999")
    assert not ok and "Invalid argument" in err, err
    assert "form PID-N" in status_line(m.mnt, wl_a.pid, "last")
    # The same name by both users: each gets their own checkpoint.
    id_a = m.checkpoint(wl_a.pid, "--name before-upgrade", user=a)
    id_b = m.checkpoint(wl_b.pid, "--name before-upgrade", user=b)
    assert id_a == f"{a.uid}.before-upgrade" and id_b == f"{b.uid}.before-upgrade", (id_a, id_b)
    # And b's automatic checkpoints go on.
    m.checkpoint(wl_b.pid, user=b)
    m.checkpoint(wl_b.pid, user=b)
    assert sorted(os.listdir(m.path(str(wl_b.pid), "checkpoints"))) == ["1", "2", "3", "latest"]


# --- Bytes are bytes -------------------------------------------------------------------

def test_latin1_arguments_and_paths_checkpoint_and_restore(mount, users):
    m = mount
    a, _ = users
    # The result file (the workload's first argument) lies in a directory
    # whose name is Latin-1, not UTF-8.
    base = os.fsencode(os.path.join(m.work, "home-" + a.name))
    os.mkdir(base, 0o700)
    os.chown(base, a.uid, a.gid)
    here = base + b"/caf\xe9"
    os.mkdir(here, 0o700)
    os.chown(here, a.uid, a.gid)
    result = here + b"/result"
    binary = os.path.join(m.work, "wl_memory")
    if not os.path.exists(binary):
        shutil.copy(os.path.join(os.environ["WORKLOAD_BIN"], "wl_memory"), binary)
        os.chmod(binary, 0o755)
    subprocess.run([b"sh", b"-c", b'setsid "$@" </dev/null >/dev/null 2>&1 &', b"sh",
                    *[os.fsencode(x) for x in a.prefix()], os.fsencode(binary), result,
                    b"--mib", b"4"], check=True)
    wait_for(lambda: os.path.exists(result + b".ready"), 60, "the workload")
    pid = int(read(result + b".ready"))
    try:
        wait_for(lambda: os.path.isdir(m.path(str(pid))), 10, "its directory")
        assert "caf\\xE9" in status_line(m.mnt, pid, "command")
        ok, err = a.write(m.path(str(pid), "ctl"), "checkpoint")
        assert ok, f"{err}: {status_line(m.mnt, pid, 'last')}"
        made = os.listdir(m.path(str(pid), "checkpoints"))
        manifest = json.loads(read(m.path(str(pid), "checkpoints", "latest", "manifest.json")))
        assert "caf\\xE9" in manifest["extra"]["command"], manifest["extra"]["command"]
        assert made
        # A copy under a Latin-1 name restores, and `restore` says so.
        copy = here + b"/copy\xff"
        r = subprocess.run([*a.prefix(), "cp", "-r",
                            m.path(str(pid), "checkpoints", "latest") + "/", os.fsdecode(copy)])
        assert r.returncode == 0
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the workload to go")
        m.restore(os.fsdecode(copy), pid, user=a)
        os.kill(pid, signal.SIGUSR1)
        wait_for(lambda: os.path.exists(result), 60, "the verdict")
        assert read(result).strip() == "PASS"
    finally:
        kill_if_alive(pid)


# --- Dedup domains and quotas -------------------------------------------------------------

def manifest_of(m, checkpoint_id):
    return json.loads(read(m.path("checkpoints", checkpoint_id, "manifest.json")))


def new_bytes_of_two_users(m, users):
    """Both users checkpoint a process with the same 48 MB of pattern pages
    (wl_big's pages depend only on their index): each one's new bytes."""
    a, b = users
    new = []
    for user in (a, b):
        wl = m.start("wl_big", "--mib", "64", user=user)
        new.append(manifest_of(m, m.checkpoint(wl.pid, user=user))["new_bytes"])
    return new


# The manifest's new bytes are counted as a checkpoint is chunked: these
# daemons chunk at once (a spooled checkpoint, the default on few cores,
# counts every byte new when it is made, whoever's data it repeats).
def test_one_users_new_bytes_do_not_depend_on_anothers_data(users):
    m = Mount("gpuckpt-own-dedup.", "--spool", "never")
    try:
        new_a, new_b = new_bytes_of_two_users(m, users)
        # Each owner's chunks are their own: b's identical pages are new to b.
        assert new_a > 40e6, new_a
        assert new_b > 0.9 * new_a, (new_a, new_b)
    finally:
        m.close()


def test_shared_dedup_is_the_daemons_choice_and_shares_across_owners(users):
    m = Mount("gpuckpt-shared-dedup.", "--shared-dedup", "--spool", "never")
    try:
        new_a, new_b = new_bytes_of_two_users(m, users)
        assert new_a > 40e6, new_a
        assert new_b < 0.2 * new_a, (new_a, new_b)
    finally:
        m.close()


def test_quota_refuses_a_checkpoint_that_could_exceed_it_before_anything_is_frozen(users):
    a, _ = users
    m = Mount("gpuckpt-quota.", "--quota", "48M")
    try:
        small = m.start("wl_memory", "--mib", "4", user=a)
        m.checkpoint(small.pid, user=a)
        big = m.start("wl_big", "--mib", "64", user=a)
        ok, err = a.write(m.path(str(big.pid), "ctl"), "checkpoint")
        assert not ok and "No space left" in err, err
        last = status_line(m.mnt, big.pid, "last")
        assert "quota" in last and f"uid {a.uid}" in last, last
        assert big.alive()
        assert not os.listdir(m.path(str(big.pid), "checkpoints")), "a refused checkpoint is listed"
        # Root is not limited, also for the user's process.
        ctl(m.path(str(big.pid), "ctl"), "checkpoint")
        assert len(os.listdir(m.path(str(big.pid), "checkpoints"))) == 2  # 1 and latest
    finally:
        m.close()


# --- What held up, and must keep holding ---------------------------------------------------

def test_another_users_checkpoint_can_be_neither_read_nor_removed(mount, users):
    m = mount
    a, b = users
    wl = m.start("wl_memory", "--mib", "4", user=a)
    made = m.checkpoint(wl.pid, user=a)
    ckpt = m.path("checkpoints", made)
    for path in (ckpt, os.path.join(ckpt, "manifest.json"), os.path.join(ckpt, "images")):
        ok, said = b.read(path)
        assert not ok and "No such file" in said, (path, said)
    r = b.run(["rm", "-rf", ckpt])
    assert os.path.isdir(ckpt), f"b removed a's checkpoint: {r.stderr}"
    # Nor restored by b.
    ok, err, said = m.try_restore(ckpt, b)
    assert not ok, said
    assert made in set(m.ids(a))


def test_a_file_of_someone_else_in_a_copy_is_refused(mount, users):
    m = mount
    a, _ = users
    wl, made, copy = copied_checkpoint(m, a, "wl_memory", "with-a-root-file", "--mib", "4")
    # A hard link to a root-only file (where protected_hardlinks is off, a
    # user can make one; here root makes it for them).
    secret = os.path.join(m.work, "root-secret")
    with open(secret, "w") as f:
        f.write("root's\n")
    os.chmod(secret, 0o600)
    os.link(secret, os.path.join(copy, "images", "extra.img"))
    before = set(m.ids(a))
    wl.kill()
    ok, err, said = m.try_restore(copy, a)
    assert not ok and "Permission denied" in err, err
    assert "belongs to uid 0" in said, said
    assert set(m.ids(a)) == before


def test_open_files_of_a_removed_checkpoint_read_the_same_bytes_from_the_store(mount):
    m = mount
    wl = m.start("wl_big", "--mib", "32")
    made = m.checkpoint(wl.pid)
    pages = sorted(f for f in os.listdir(m.path("checkpoints", made, "images"))
                   if f.startswith("pages-"))[0]
    path = m.path("checkpoints", made, "images", pages)
    with open(path, "rb") as f:
        expected = hashlib.sha256(f.read()).hexdigest()
    # A reader that holds the file open, and reads it (with read and with
    # mmap) only after the checkpoint was removed, collected, and the page
    # cache dropped: every byte then comes from the daemon.
    reader = subprocess.Popen([PYTHON, "-c", HOLD_THEN_READ, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "open"
        r = subprocess.run(["rm", "-r", m.path("checkpoints", made)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        ctl(m.path("ctl"), "gc")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        out, _ = reader.communicate("go\n", timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
    assert reader.returncode == 0, f"the reader died (signal {-reader.returncode})"
    assert out.split() == [expected, expected], out


def test_concurrent_reads_during_checkpoints_rm_and_gc_never_see_wrong_bytes(mount):
    m = mount
    wl = m.start("wl_big", "--mib", "32")
    first = m.checkpoint(wl.pid)
    files = [m.path("checkpoints", first, "images", f)
             for f in os.listdir(m.path("checkpoints", first, "images"))]
    expected = {}
    for p in files:
        with open(p, "rb") as f:
            expected[p] = hashlib.sha256(f.read()).hexdigest()
    stop = threading.Event()
    counts = {"reads": 0, "mismatches": []}
    def reader():
        while not stop.is_set():
            for p in files:
                with open(p, "rb") as f:
                    got = hashlib.sha256(f.read()).hexdigest()
                counts["reads"] += 1
                if got != expected[p]:
                    counts["mismatches"].append(p)
    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        second = m.checkpoint(wl.pid)
        m.checkpoint(wl.pid)
        subprocess.run(["rm", "-r", m.path("checkpoints", second)], check=True)
        ctl(m.path("ctl"), "gc")
        m.checkpoint(wl.pid)
        ctl(m.path("ctl"), "gc")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert counts["reads"] > 3 * len(files), counts["reads"]
    assert counts["mismatches"] == [], counts["mismatches"][:5]


# --- TCP connections: repair mode only for what gpuckpt's own dump recorded ----------

def tree_of_checkpoint(m, checkpoint_id):
    return manifest_of(m, checkpoint_id)["extra"]["tree"]


def kill_tree(wl, pids):
    """Kills the workload's tree (its members follow their root) and waits
    until none of `pids` is in use, so that they can be restored."""
    wl.kill()
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 10,
             f"the tree {pids} to go")


def test_users_tree_with_a_tcp_connection_checkpoints_and_restores_from_mount_and_copy(
        mount, users):
    # wl_tree's child 3 talks to the root over an established loopback TCP
    # connection: CRIU dumps and restores it in TCP repair mode, which an
    # unprivileged CRIU may use only with CAP_NET_ADMIN.
    m = mount
    a, _ = users
    wl, made, copy = copied_checkpoint(m, a, "wl_tree", "tree-copy")
    assert glob.glob(os.path.join(copy, "images", "tcp-stream-*.img")), "no TCP connection dumped"
    pids = tree_of_checkpoint(m, made)
    for source in (copy, m.path("checkpoints", made)):
        kill_tree(wl, pids)
        ok, err, said = m.try_restore(source, a)
        assert ok, (source, err, said)
        # The copy's restore also names the checkpoint it imported.
        assert said.splitlines()[0] == f"pid {wl.pid}", said
        assert os.stat(f"/proc/{wl.pid}").st_uid == a.uid
        assert wl.verdict() == "PASS", source


def test_copy_with_changed_tcp_connections_is_refused_and_leaves_nothing(mount, users):
    m = mount
    a, _ = users
    wl, made, copy = copied_checkpoint(m, a, "wl_tree", "changed-tcp")
    pids = tree_of_checkpoint(m, made)
    stream = sorted(glob.glob(os.path.join(copy, "images", "tcp-stream-*.img")))[0]
    # Another sequence number: what repair mode would let a crafted copy
    # make up (here the edit only has to differ from what was dumped).
    edit_as(a, stream, lambda image: image["entries"][0].update(
        inq_seq=(image["entries"][0]["inq_seq"] + 1) % (1 << 32)))
    kill_tree(wl, pids)
    before = set(m.ids(a))
    ok, err, said = m.try_restore(copy, a)
    assert not ok and err == os.strerror(13), err  # EACCES
    assert "holds TCP connections" in said and "tcp-stream-" in said, said
    assert set(m.ids(a)) == before
    assert not os.path.exists(f"/proc/{wl.pid}")
    # The unchanged copy restores; once its original checkpoint is gone
    # from the store, nothing vouches for its connections any more.
    pristine = copy_as(m, a, made, "pristine")
    ok, err, said = m.try_restore(pristine, a)
    assert ok, (err, said)
    assert wl.verdict() == "PASS"
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 10, "the tree to go")
    r = a.run(["rm", "-r", m.path("checkpoints", made)])
    assert r.returncode == 0, r.stderr
    for imported in set(m.ids(a)) - before:
        r = a.run(["rm", "-r", m.path("checkpoints", imported)])
        assert r.returncode == 0, r.stderr
    ok, err, said = m.try_restore(pristine, a)
    assert not ok and "holds TCP connections" in said, said
    assert set(m.ids(a)) == before - {made}
