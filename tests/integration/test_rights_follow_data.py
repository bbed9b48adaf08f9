"""Root acting on a user's data never lends the user root's rights.

The flows administrators use every day, end to end through one mount: root
checkpoints a user's job ("before maintenance") and restores it after the
user swapped a file the job holds; root restores and imports a user's
edited copy, through a symlink into the mount, and through the mount's own
archive of it; `<pid>/checkpoints/latest` of a dead job; names; and control
files that one caller's long command never holds for another.

Images are edited with crit, as test_adversarial.py does. Every write is
bounded by a timeout. Run by ctest under wl_reaper (gpuckpt_testing.mount).
"""

import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time

import pytest

from gpuckpt_testing.build import PYTHON
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, ctl, status_line, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.stopping_criu import StoppingCriu
from gpuckpt_testing.users import Root

CRIT = shutil.which("crit") or "/usr/local/bin/crit"

pytestmark = pytest.mark.skipif(why_not_runnable("wl_files") is not None,
                                reason=str(why_not_runnable("wl_files")))

ALL_CAPS = [0xFFFFFFFF, 0x1FF]


def crit_edit(user, path, edit):
    """Decodes the image `path` with crit, lets `edit` change it, encodes it
    back, as `user`'s file."""
    out = subprocess.run([CRIT, "decode", "-i", path], capture_output=True, text=True, check=True)
    image = json.loads(out.stdout)
    edit(image)
    subprocess.run([CRIT, "encode", "-o", path], input=json.dumps(image), text=True, check=True)
    os.chown(path, user.uid, user.gid)


def claim_root(image):
    creds = image["entries"][0]["thread_core"]["creds"]
    for key in ("uid", "euid", "suid", "fsuid", "gid", "egid", "sgid", "fsgid"):
        creds[key] = 0
    creds["groups"] = [0]
    for key in ("cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb"):
        creds[key] = ALL_CAPS


def home_of(m, user):
    home = os.path.join(m.work, "home-" + user.name)
    if not os.path.isdir(home):
        os.mkdir(home, 0o755)
        os.chown(home, user.uid, user.gid)
    return home


def copy_as(m, user, checkpoint_id, name):
    dest = os.path.join(home_of(m, user), name)
    r = user.run(["cp", "-r", m.path("checkpoints", checkpoint_id), dest])
    assert r.returncode == 0, r.stderr
    return dest


def daemon_log(m):
    return read(os.path.join(m.state_dir, "gpuckptfs.log"))


def copied_job(m, user, name):
    """`user` starts a small job, checkpoints it and copies the checkpoint
    into a directory of theirs as `name`: (the job, the checkpoint's id, the
    copy)."""
    wl = m.start("wl_memory", "--mib", "4", user=user)
    made = m.checkpoint(wl.pid, user=user)
    return wl, made, copy_as(m, user, made, name)


def wait_until_settled(m):
    """Waits until the store holds no spooled checkpoint (every one is
    chunked, deduplicated and compressed)."""
    wait_for(lambda: "\ngpuckpt_store_spooled_bytes 0\n" in read(m.path("metrics")), 120,
             "the store to settle")


def made_by(m, checkpoint_id):
    manifest = json.loads(read(m.path("checkpoints", checkpoint_id, "manifest.json")))
    return manifest["extra"]["made_by"]["uid"], manifest["extra"]["owner"]["uid"]


def edited_to_claim_root(m, user, wl, checkpoint_id, name):
    """A copy of the user's checkpoint whose root task claims uid 0 and every
    capability."""
    copy = copy_as(m, user, checkpoint_id, name)
    crit_edit(user, os.path.join(copy, "images", f"core-{wl.pid}.img"), claim_root)
    return copy


def assert_refused_as_root(m, source, wl):
    ok, err, said = m.try_restore(source)
    assert not ok and err == os.strerror(13), (source, err, said)  # EACCES
    assert "claims uid 0" in said, said
    assert not wl.alive(), f"{source}: a process came back as pid {wl.pid}"


# --- 1. Root checkpoints a user's job: the checkpoint is the user's ------------------

def test_roots_checkpoint_of_a_users_job_is_theirs_and_restores_with_their_rights_only(
        mount, users):
    m = mount
    a, _ = users
    wl = m.start("wl_files", user=a)
    made = m.checkpoint(wl.pid, "--kill")
    assert made_by(m, made) == (a.uid, a.uid)
    wait_for(wl.gone, 30, "the killed job to go")

    # The user swaps the file their job held for a symlink to a root-only
    # file of the same size and mode.
    held = wl.result + ".regular"
    st = os.stat(held)
    secret = os.path.join(m.work, "root-secret")
    with open(secret, "wb") as f:
        f.write(b"s" * st.st_size)
    os.chmod(secret, st.st_mode & 0o7777)
    moved = held + ".moved"
    r = a.run(["mv", held, moved])
    assert r.returncode == 0, r.stderr
    r = a.run(["ln", "-s", secret, held])
    assert r.returncode == 0, r.stderr

    # Root's restore reopens the file as the user: refused, nothing runs.
    ok, err, said = m.try_restore(m.path("checkpoints", made))
    assert not ok, f"root's restore opened a root-only file for uid {a.uid}: {said}"
    assert "Permission denied" in said or "ermission" in said, said
    assert not wl.alive(), "the job came back holding root's file"

    # With the user's own file back, root's restore brings the job back as
    # the user, and it passes its check.
    r = a.run(["mv", "-f", moved, held])
    assert r.returncode == 0, r.stderr
    m.restore(m.path("checkpoints", made), wl.pid)
    assert os.stat(f"/proc/{wl.pid}").st_uid == a.uid
    assert wl.verdict() == "PASS"


# Root's process whose child runs as the user: a tree of two owners.
MIXED_TREE = """
import os, sys, time
uid, gid = int(sys.argv[1]), int(sys.argv[2])
child = os.fork()
if child == 0:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    while True:
        time.sleep(1)
with open(sys.argv[3] + ".tmp", "w") as f:
    f.write(str(child))
os.rename(sys.argv[3] + ".tmp", sys.argv[3])
while True:
    time.sleep(1)
"""


def test_a_tree_holding_roots_and_a_users_processes_is_roots(mount, users):
    m = mount
    a, _ = users
    ready = os.path.join(m.work, "mixed.child")
    with open(os.path.join(m.work, "mixed.log"), "w") as log:
        parent = subprocess.Popen([PYTHON, "-c", MIXED_TREE, str(a.uid), str(a.gid), ready],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True)
    try:
        wait_for(lambda: os.path.exists(ready), 30, "the mixed tree to start")
        child = int(read(ready))
        ctl(m.path("ctl"), f"track {parent.pid}")
        ok, err = Root().write(m.path(str(parent.pid), "ctl"), "checkpoint --kill")
        if not ok and "Can't get rlimit" in m.last(parent.pid):
            pytest.skip("root's CRIU cannot dump another uid's process here: it lacks "
                        "CAP_SYS_RESOURCE (prlimit); IdentifyTree's unit test covers whose a "
                        f"mixed tree is ({m.last(parent.pid)})")
        assert ok, f"{err}: {m.last(parent.pid)}"
        (made,) = m.ids()
        assert made_by(m, made) == (0, 0)
        parent.wait(timeout=30)
        wait_for(lambda: not os.path.exists(f"/proc/{child}"), 30, "the child to go")
        m.restore(m.path("checkpoints", made), parent.pid)
        assert os.stat(f"/proc/{parent.pid}").st_uid == 0
        assert os.stat(f"/proc/{child}").st_uid == a.uid
    finally:
        for pid in (parent.pid, locals().get("child")):
            if pid:
                subprocess.run(["kill", "-KILL", str(pid)], capture_output=True)


# --- 2. Copies and archives are their writer's ----------------------------------------

def test_roots_restore_of_a_users_edited_copy_runs_as_the_user(mount, users):
    m = mount
    a, _ = users
    wl = m.start("wl_memory", "--mib", "4", user=a)
    made = m.checkpoint(wl.pid, user=a)
    copy = edited_to_claim_root(m, a, wl, made, "job7")
    wl.kill()
    before = set(m.ids())
    assert_refused_as_root(m, copy, wl)
    assert set(m.ids()) == before, "the refused copy stayed in the store"


def test_roots_import_of_a_users_copy_is_the_users(mount, users):
    m = mount
    a, _ = users
    wl = m.start("wl_memory", "--mib", "4", user=a)
    made = m.checkpoint(wl.pid, user=a)
    copy = edited_to_claim_root(m, a, wl, made, "job8")
    wl.kill()
    ctl(m.path("ctl"), f"import {copy} for-a")
    imported = f"{a.uid}.for-a"
    assert imported in m.ids(a), f"root's import of a's copy is not a's: {m.ids()}"
    assert made_by(m, imported) == (a.uid, a.uid)
    assert_refused_as_root(m, m.path("checkpoints", imported), wl)


def test_a_copy_of_two_owners_is_refused_to_root_too(mount, users):
    m = mount
    a, b = users
    wl, made, copy = copied_job(m, a, "mixed")
    os.chown(os.path.join(copy, "images", "pstree.img"), b.uid, b.gid)
    before = set(m.ids())
    with pytest.raises(PermissionError):
        ctl(m.path("ctl"), f"import {copy}")
    assert set(m.ids()) == before


def planted_by(m, user, name):
    """The user's job, checkpointed, killed, and a copy of its checkpoint
    edited to claim root, which the user imported as `name`: (the job, the
    import's id)."""
    wl = m.start("wl_memory", "--mib", "4", user=user)
    made = m.checkpoint(wl.pid, user=user)
    copy = edited_to_claim_root(m, user, wl, made, name)
    wl.kill()
    ok, err = user.write(m.path("ctl"), f"import {copy} {name}")
    assert ok, err
    return wl, f"{user.uid}.{name}"


def test_a_symlink_into_the_mount_is_that_checkpoint_with_its_maker(mount, users):
    m = mount
    a, _ = users
    wl, planted = planted_by(m, a, "planted")
    link = os.path.join(home_of(m, a), "job9")
    r = a.run(["ln", "-s", m.path("checkpoints", planted), link])
    assert r.returncode == 0, r.stderr
    before = set(m.ids())
    assert_refused_as_root(m, link, wl)
    assert set(m.ids()) == before, "the checkpoint behind the symlink was imported anew"
    # Also as an import: the same checkpoint again, still the user's.
    ctl(m.path("ctl"), f"import {link} again")
    assert made_by(m, f"{a.uid}.again") == (a.uid, a.uid)


def test_roots_import_of_a_users_archive_keeps_its_maker(mount, users):
    m = mount
    a, _ = users
    wl, archived = planted_by(m, a, "archived")
    archive = m.path("archives", f"{archived}.tar")
    ctl(m.path("ctl"), f"import {archive} from-archive")
    assert made_by(m, f"{a.uid}.from-archive") == (a.uid, a.uid)
    assert_refused_as_root(m, m.path("checkpoints", f"{a.uid}.from-archive"), wl)
    # Restoring the archive's path is restoring its checkpoint.
    assert_refused_as_root(m, archive, wl)


def test_a_users_archive_names_no_mount_root_for_roots_import(mount, users):
    m = mount
    a, _ = users
    wl, made, copy = copied_job(m, a, "claims-a-root")
    manifest_path = os.path.join(copy, "manifest.json")
    manifest = json.loads(read(manifest_path))
    manifest["extra"]["mount_namespace"] = {"root": "/etc"}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    os.chown(manifest_path, a.uid, a.gid)
    archive = os.path.join(home_of(m, a), "claims-a-root.tar")
    with tarfile.open(archive, "w") as tar:
        tar.add(manifest_path, arcname="manifest.json")
        tar.add(os.path.join(copy, "images"), arcname="checkpoint")
    os.chown(archive, a.uid, a.gid)
    ctl(m.path("ctl"), f"import {archive}")
    imported = [i for i in m.ids() if i.startswith(f"{a.uid}.claims-a-root")]
    assert imported, m.ids()
    extra = json.loads(read(m.path("checkpoints", imported[0], "manifest.json")))["extra"]
    assert made_by(m, imported[0]) == (a.uid, a.uid)
    assert extra.get("mount_namespace", {}).get("root") is None, extra


# --- 4. latest never resolves to another user's checkpoint -----------------------------

def test_latest_of_a_dead_roots_job_is_roots_own_checkpoint(mount, users):
    m = mount
    a, _ = users
    job = m.start("wl_memory", "--mib", "4")
    own = m.checkpoint(job.pid)
    # The user plants a copy of their own checkpoint that claims the job's
    # pid, made after root's.
    mine = m.start("wl_memory", "--mib", "4", user=a)
    made = m.checkpoint(mine.pid, user=a)
    copy = copy_as(m, a, made, "repidded")
    images = os.path.join(copy, "images")

    def repid(image):
        entry = image["entries"][0]
        entry.update(pid=job.pid, pgid=job.pid, sid=job.pid, threads=[job.pid])
    crit_edit(a, os.path.join(images, "pstree.img"), repid)
    os.rename(os.path.join(images, f"core-{mine.pid}.img"),
              os.path.join(images, f"core-{job.pid}.img"))
    ok, err = a.write(m.path("ctl"), f"import {copy} repidded")
    assert ok, err
    job.kill()
    m.restore(m.path(str(job.pid), "checkpoints", "latest"), job.pid)
    said = status_line(m.mnt, job.pid, "last")
    assert own in said, f"latest of root's job restored {said}, not {own}"
    assert os.stat(f"/proc/{job.pid}").st_uid == 0
    assert job.verdict() == "PASS"


# --- 9. Small things ---------------------------------------------------------------------

def test_roots_auto_named_import_never_takes_a_users_id(mount, users):
    m = mount
    a, _ = users
    wl = m.start("wl_memory", "--mib", "4")
    made = m.checkpoint(wl.pid)
    archive = os.path.join(m.work, f"{a.uid}.web.tar")
    with tarfile.open(archive, "w") as tar:
        tar.add(m.path("checkpoints", made, "images"), arcname="checkpoint")
    ctl(m.path("ctl"), f"import {archive}")
    assert f"{a.uid}_web" in m.ids(), m.ids()
    assert f"{a.uid}.web" not in m.ids(), m.ids()
    with pytest.raises(OSError) as e:
        ctl(m.path(str(wl.pid), "ctl"), f"checkpoint --name {a.uid}.web")
    assert e.value.errno == 22, e.value
    # The user's own name is still theirs.
    mine = m.start("wl_memory", "--mib", "4", user=a)
    assert m.checkpoint_named(mine.pid, "web", user=a).endswith(f"{a.uid}.web")


def test_a_garbage_pstree_in_an_archive_is_bad_input(mount):
    m = mount
    bad = os.path.join(m.work, "garbage")
    os.makedirs(os.path.join(bad, "checkpoint"))
    with open(os.path.join(bad, "checkpoint", "pstree.img"), "wb") as f:
        f.write(os.urandom(300))
    archive = os.path.join(m.work, "garbage.tar")
    with tarfile.open(archive, "w") as tar:
        tar.add(os.path.join(bad, "checkpoint"), arcname="checkpoint")
    with pytest.raises(OSError) as e:
        ctl(m.path("ctl"), f"import {archive}")
    assert e.value.errno == 22, e.value  # EINVAL, not EIO


# --- 5. No caller's command holds a control file for another ---------------------------

def test_a_long_restore_holds_no_other_callers_write_to_a_control_file(users):
    a, b = users
    # a's restore is held in the middle: its CRIU stops itself before it
    # starts, however fast the restore would otherwise be.
    criu = StoppingCriu(verbs=("restore",))
    m = Mount("gpuckpt-rights-restore.", "--criu", criu.path)
    held = []
    try:
        wl = m.start("wl_memory", "--mib", "8", user=a)
        made = m.checkpoint(wl.pid, "--kill", user=a)
        wait_for(wl.gone, 30, "the killed job to go")
        slow = {}

        def restore():
            slow["ok"], slow["err"] = a.write(m.path("restore"), m.path("checkpoints", made))
        writer = threading.Thread(target=restore)
        writer.start()
        held.append(criu.stopped("restore"))
        # Meanwhile b's and root's writes to the same file, and to ctl, are
        # answered at once.
        for user, path, text in ((b, "restore", "/nonexistent"), (Root(), "ctl", "gc"),
                                 (b, "ctl", f"track {os.getpid()}")):
            start = time.monotonic()
            user.write(m.path(path), text, timeout=30)
            took = time.monotonic() - start
            assert writer.is_alive(), "a's restore ended while its CRIU was stopped"
            assert took < 10, f"{user.name}'s write to {path} waited {took:.1f} s"
        criu.resume(held.pop())
        writer.join(timeout=120)
        assert slow.get("ok"), slow
        assert wl.verdict() == "PASS"
    finally:
        for pid in held:
            criu.resume(pid)
        m.close()
        criu.close()


# A write of one command, in one write(2), that a signal can interrupt: the
# error (strerror) on stderr, KeyboardInterrupt's traceback on SIGINT.
WRITE_INTERRUPTIBLE = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
print("writing", flush=True)
os.write(fd, os.fsencode(sys.argv[2]) + b"\\n")
"""


def test_ctrl_c_cancels_the_callers_own_import(mount, users):
    m = mount
    a, _ = users
    wl, made, copy = copied_job(m, a, "big-copy")
    # 4 GiB of data (one random block over and over): seconds of reading.
    extra = os.path.join(copy, "images", "extra.img")
    block = os.urandom(64 << 20)
    with open(extra, "wb") as f:
        for _ in range(64):
            f.write(block)
    os.chown(extra, a.uid, a.gid)
    before = set(m.ids())
    writer = subprocess.Popen(a.prefix() + [PYTHON, "-c", WRITE_INTERRUPTIBLE, m.path("ctl"),
                                            f"import {copy}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    time.sleep(0.5)
    writer.send_signal(signal.SIGINT)
    start = time.monotonic()
    _, err = writer.communicate(timeout=120)
    took = time.monotonic() - start
    assert "KeyboardInterrupt" in err, err
    assert took < 3, f"the interrupted write returned {took:.1f} s after Ctrl-C"
    wait_for(lambda: "result=cancelled" in daemon_log(m), 30,
             "the daemon to log the cancelled import")
    assert set(m.ids()) == before, "the cancelled import was stored"


# --- 6. The quota charges what a user's checkpoints hold ---------------------------------

def test_a_second_import_of_the_same_bytes_is_charged_once_the_first_is_removed(users):
    a, _ = users
    m = Mount("gpuckpt-rights-quota.", "--quota", "100M")
    try:
        wl = m.start("wl_big", "--mib", "48", user=a)
        made = m.checkpoint(wl.pid, "--kill", user=a)
        copy = copy_as(m, a, made, "same-bytes")
        # Until the store settles the spooled checkpoint it holds its whole
        # size, and x1 would be all new beside it.
        wait_until_settled(m)
        for name in ("x1", "x2"):
            ok, err = a.write(m.path("ctl"), f"import {copy} {name}")
            assert ok, err
        r = a.run(["rm", "-r", m.path("checkpoints", made), m.path("checkpoints", f"{a.uid}.x1")])
        assert r.returncode == 0, r.stderr
        # x2 added nothing when it came, but holds all of it now (over 30
        # MB): a process of about 75 MB resident (wl_memory touches all but
        # 1/16 of its pages, whatever the machine's transparent huge pages)
        # does not fit in the 100 MB beside it, and fits once x2 is gone.
        other = m.start("wl_memory", "--mib", "72", user=a)
        ok, err = a.write(m.path(str(other.pid), "ctl"), "checkpoint")
        assert not ok and err == os.strerror(28), err  # ENOSPC
        last = status_line(m.mnt, other.pid, "last")
        assert "quota" in last and f"uid {a.uid}" in last, last
        r = a.run(["rm", "-r", m.path("checkpoints", f"{a.uid}.x2")])
        assert r.returncode == 0, r.stderr
        ok, err = a.write(m.path(str(other.pid), "ctl"), "checkpoint")
        assert ok, f"the checkpoint did not fit once x2 was gone: {err}"
    finally:
        m.close()


def test_checkpoints_side_by_side_never_go_beyond_the_quota_together(users):
    a, _ = users
    m = Mount("gpuckpt-rights-quota.", "--quota", "100M")
    try:
        jobs = [m.start("wl_memory", "--mib", "24", user=a) for _ in range(8)]
        results = {}

        def checkpoint(job):
            results[job.pid] = a.write(m.path(str(job.pid), "ctl"), "checkpoint")
        threads = [threading.Thread(target=checkpoint, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        made = [pid for pid, (ok, _) in results.items() if ok]
        refused = [err for ok, err in results.values() if not ok]
        assert made and refused, results
        assert all(err == os.strerror(28) for err in refused), refused
        held = 0
        for ckpt in m.ids():
            held += json.loads(read(m.path("checkpoints", ckpt, "manifest.json")))["stored_bytes"]
        assert held <= 100e6, f"{len(made)} checkpoints side by side hold {held / 1e6:.1f} MB"
    finally:
        m.close()


# --- 5. Every import is bounded before it reads -----------------------------------------

def test_a_1tb_sparse_import_is_bounded_and_holds_nobody_up(mount, users):
    m = mount
    a, b = users
    wl, made, copy = copied_job(m, a, "sparse")
    extra = os.path.join(copy, "images", "extra.img")
    with open(extra, "wb") as f:
        f.truncate(1 << 40)
        f.seek((1 << 40) - 4096)
        f.write(b"end of a terabyte\n")
    os.chown(extra, a.uid, a.gid)
    results = {}

    def run(who, user, path, text):
        start = time.monotonic()
        results[who] = user.write(m.path(path), text, timeout=120) + (time.monotonic() - start,)
    watched = m.start("wl_memory", "--mib", "4", user=b)
    threads = [threading.Thread(target=run, args=("import", a, "ctl", f"import {copy} tera")),
               threading.Thread(target=run, args=("track", b, "ctl", f"track {watched.pid}")),
               threading.Thread(target=run, args=("gc", Root(), "ctl", "gc"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    for who, (ok, err, took) in results.items():
        assert ok, (who, err)
        assert took < 30, f"{who} took {took:.1f} s"
    manifest = json.loads(read(m.path("checkpoints", f"{a.uid}.tera", "manifest.json")))
    assert manifest["logical_bytes"] > 1 << 40, manifest["logical_bytes"]
    assert manifest["stored_bytes"] < 64 << 20, manifest["stored_bytes"]
    # The hole reads as zeros, the end as written.
    with open(m.path("checkpoints", f"{a.uid}.tera", "images", "extra.img"), "rb") as f:
        assert f.read(4096) == bytes(4096)
        f.seek((1 << 40) - 4096)
        assert f.read(18) == b"end of a terabyte\n"


def zeros_tar_zst(path, gib):
    """A .tar.zst of a pstree and `gib` GiB of zeros (checkpoint/pages-1.img):
    a few hundred KB that expand thousands of times."""
    script = ('set -e; d=$(mktemp -d); mkdir "$d/checkpoint"; printf x > "$d/checkpoint/pstree.img"; '
              f'truncate -s {gib}G "$d/checkpoint/pages-1.img"; '
              f'tar -C "$d" -cf - checkpoint | zstd -q -T0 -f -o "{path}"; rm -rf "$d"')
    subprocess.run(["sh", "-c", script], check=True, timeout=600)


def test_an_archive_that_expands_a_thousand_times_is_refused_at_once(mount, users):
    m = mount
    a, _ = users
    archive = os.path.join(home_of(m, a), "bomb.tar.zst")
    zeros_tar_zst(archive, 4)
    os.chown(archive, a.uid, a.gid)
    assert os.path.getsize(archive) < 1 << 20
    start = time.monotonic()
    ok, err = a.write(m.path("ctl"), f"import {archive}", timeout=120)
    took = time.monotonic() - start
    assert not ok and err == os.strerror(22), err  # EINVAL
    assert took < 20, f"the refusal took {took:.1f} s"
    assert "expands more than" in daemon_log(m), "the import was not stopped by its expansion"
    assert m.ids(a) == []
