"""What a gpuckptfs mount refuses, and with which errno (docs/gpuckptfs.md,
"Permissions", and fs/README.md, "Implementation"): nothing inside a
checkpoint can be changed (EROFS) nor any of the names gpuckptfs makes
(EPERM), while `rm -r` of a whole checkpoint by its owner works; someone
else's checkpoint or process is absent (ENOENT) to lookups as to listings; a
checkpoint id reused after `rm -r` is a new directory, and what still holds
the old one never sees the new one's contents; a second mount over a live
one is refused; and the control files parse what is written to them as a
shell would split it, answering --help with the synopsis.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_mount_rules.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
directory of the workloads. Needs root, /dev/fuse and CRIU; the tests are
skipped, saying why, where one of them is missing.
"""

import errno
import json
import os
import subprocess
import tempfile

import pytest

from gpuckpt_testing.build import GPUCKPTFS
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import ctl, probe, status_line, why_not_runnable

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))

MIB = "16"

def tree_of(path):
    """Relative path -> bytes (files) or None (directories) of a tree."""
    out = {}
    for root, dirs, files in os.walk(path):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), path)] = None
        for f in files:
            full = os.path.join(root, f)
            if os.path.islink(full):
                out[os.path.relpath(full, path)] = "-> " + os.readlink(full)
            else:
                with open(full, "rb") as fh:
                    out[os.path.relpath(full, path)] = fh.read()
    return out


def images_of(ckpt):
    return sorted(os.listdir(os.path.join(ckpt, "images")))


def test_reused_id_is_a_new_directory_and_old_handles_keep_the_old_one(mount):
    m = mount
    wl = m.start("wl_memory", "--mib", MIB)
    old = m.checkpoint_named(wl.pid, "reused")
    old_manifest = read(os.path.join(old, "manifest.json"))
    image = next(f for f in images_of(old) if f.startswith("core-"))
    with open(os.path.join(old, "images", image), "rb") as f:
        old_image = f.read()

    # What still holds the old checkpoint: open files in this process, and
    # a process whose current directory it is.
    manifest_fd = open(os.path.join(old, "manifest.json"))
    image_fd = open(os.path.join(old, "images", image), "rb")
    holder = subprocess.Popen(["sleep", "600"], cwd=os.path.join(old, "images"))
    try:
        r = subprocess.run(["rm", "-r", old], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(old)
        new = m.checkpoint_named(wl.pid, "reused")

        # The new checkpoint lists completely, and a copy of it is complete.
        new_manifest = read(os.path.join(new, "manifest.json"))
        assert new_manifest != old_manifest
        assert json.loads(new_manifest)["id"] == os.path.basename(new)
        assert sorted(os.listdir(new)) == ["images", "manifest.json"]
        names = images_of(new)
        assert any(n.startswith("pages-") for n in names), names
        with tempfile.TemporaryDirectory(dir=m.work) as tmp:
            copy = os.path.join(tmp, "copy")
            r = subprocess.run(["cp", "-r", new, copy], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            through_mount = tree_of(new)
            assert tree_of(copy) == through_mount
            copied = sum(len(v) for k, v in tree_of(copy).items()
                         if isinstance(v, bytes) and k != "manifest.json")
            assert copied == json.loads(new_manifest)["logical_bytes"]

        # The old handles refer to the old checkpoint, never the new one:
        # the manifest taken at open, the image read through its own reader.
        assert manifest_fd.read() == old_manifest
        assert os.pread(image_fd.fileno(), len(old_image) + 1, 0) == old_image
        # The old file's attributes: the kernel's cached ones (the old
        # inode's) or, once they expire, ENOENT; never the new file's.
        try:
            st = os.fstat(image_fd.fileno())
            assert st.st_ino != os.stat(os.path.join(new, "images", image)).st_ino
            assert st.st_size == len(old_image)
        except FileNotFoundError:
            pass
        # Through the old directory (the holder's cwd), the old checkpoint
        # is gone: nothing of the new one shows there.
        cwd = f"/proc/{holder.pid}/cwd"
        assert probe("listdir", cwd) == "ENOENT"
        assert probe("stat", os.path.join(cwd, image)) == "ENOENT"
        assert probe("read", os.path.join(cwd, image)) == "ENOENT"
    finally:
        holder.kill()
        holder.wait()
        manifest_fd.close()
        image_fd.close()

    # And the new checkpoint restores.
    wl.kill()
    m.restore(new, wl.pid)
    assert wl.verdict() == "PASS"


def test_nothing_in_the_mount_can_be_changed_but_ctl_writes_and_rm_r(mount, users):
    m = mount
    owner, _ = users
    wl = m.start("wl_memory", "--mib", MIB, user=owner)
    ckpt = m.checkpoint_named(wl.pid, "fixed", user=owner)
    images = os.path.join(ckpt, "images")
    image = next(f for f in images_of(ckpt) if f.startswith("pages-"))
    before = tree_of(ckpt)

    # The checkpoint's contents: EROFS, for root and for its owner (whom
    # the kernel lets through: the directories are theirs).
    cases = [
        ("unlink", os.path.join(ckpt, "manifest.json")),
        ("unlink", os.path.join(images, image)),
        ("rmdir", images),
        ("mkdir", os.path.join(ckpt, "new")),
        ("mkdir", os.path.join(images, "new")),
        ("create", os.path.join(images, "new")),
        ("mknod", os.path.join(images, "new")),
        ("rename", os.path.join(images, image), os.path.join(images, "moved")),
        ("rename", os.path.join(ckpt, "manifest.json"), os.path.join(ckpt, "m.json")),
        ("link", os.path.join(images, image), os.path.join(images, "hard")),
        ("symlink", image, os.path.join(images, "soft")),
        ("utime", os.path.join(images, image)),
        ("utime", ckpt),
        ("chmod", os.path.join(images, image)),
        ("chmod", ckpt),
        ("chown", os.path.join(images, image)),
        ("truncate", os.path.join(images, image)),
    ]
    for who in (None, owner):
        for op, *args in cases:
            assert probe(op, *args, user=who) == "EROFS", (who and who.name, op, args)
    # The names gpuckptfs makes (root is not stopped by the modes): EPERM.
    for op, *args in [
        ("unlink", m.path("README")),
        ("unlink", m.path("ctl")),
        ("rmdir", m.path(str(wl.pid))),
        ("rmdir", m.path("checkpoints")),
        ("mkdir", m.path("new")),
        ("mkdir", m.path("checkpoints", "new")),
        ("create", m.path("checkpoints", "new")),
        ("symlink", "fixed", m.path("checkpoints", "alias")),
        ("rename", ckpt, m.path("checkpoints", "renamed")),
        ("link", m.path("README"), m.path("checkpoints", "readme")),
        ("chmod", m.path("ctl")),
        ("utime", m.path("ctl")),
        ("utime", m.path("README")),
    ]:
        assert probe(op, *args) == "EPERM", (op, args)

    # The shell's commands say so, and fail.
    for command, message in [
        (["rm", os.path.join(images, image)], "Read-only file system"),
        (["rm", "-r", images], "Read-only file system"),
        (["rm", "-rf", images], "Read-only file system"),
        (["mkdir", os.path.join(images, "d")], "Read-only file system"),
        (["mv", os.path.join(images, image), os.path.join(ckpt, "x")], "Read-only file system"),
        (["touch", os.path.join(images, "new")], "Read-only file system"),
        (["touch", os.path.join(images, image)], "Read-only file system"),
        (["chmod", "600", os.path.join(images, image)], "Read-only file system"),
        (["ln", "-s", "x", os.path.join(images, "l")], "Read-only file system"),
        (["ln", os.path.join(images, image), os.path.join(images, "l")], "Read-only file system"),
        (["mkdir", m.path("checkpoints", "mine")], "Operation not permitted"),
        (["touch", m.path("checkpoints", "mine")], "Operation not permitted"),
    ]:
        r = owner.run(command)
        assert r.returncode != 0 and message in r.stderr, (command, r.stderr)

    # Nothing was lost, and control files still take commands (opened with
    # O_TRUNC, as a shell's `>` does).
    assert tree_of(ckpt) == before
    second = m.checkpoint_named(wl.pid, "fixed-2", user=owner)

    # The owner's rm -r of the whole checkpoint removes it.
    r = owner.run(["rm", "-r", second])
    assert r.returncode == 0, r.stderr
    assert os.path.basename(second) not in os.listdir(m.path("checkpoints"))
    assert not os.path.exists(second)

    # The checkpoint that everything above was tried on restores.
    wl.kill()
    m.restore(ckpt, wl.pid)
    assert wl.verdict() == "PASS"


def test_other_users_checkpoint_is_absent_to_lookups(mount, users):
    m = mount
    owner, other = users
    wl = m.start("wl_memory", "--mib", MIB, user=owner)
    ckpt = m.checkpoint_named(wl.pid, "private", user=owner)
    missing = m.path("checkpoints", "never-made")
    manifest = os.path.join(ckpt, "manifest.json")

    # The names are in the kernel's cache, looked up by root and the owner
    # just before: the other user is asked about all the same.
    for _ in range(2):
        os.stat(manifest)
        assert probe("stat", manifest, user=owner) == "OK"
        for op, path in [("stat", ckpt), ("lstat", ckpt), ("stat", manifest),
                         ("stat", os.path.join(ckpt, "images")), ("listdir", ckpt),
                         ("read", manifest), ("unlink", manifest), ("rmdir", ckpt)]:
            assert probe(op, path, user=other) == "ENOENT", (op, path)
        r = other.run(["ls", m.path("checkpoints")])
        assert r.returncode == 0 and os.path.basename(ckpt) not in r.stdout, r
        # What other commands answer is what a checkpoint that never was gets.
        for command in (["stat", "{}"], ["rm", "-r", "{}"], ["mkdir", "{}"], ["touch", "{}"],
                        ["ls", "{}/images"], ["cat", "{}/manifest.json"]):
            there = other.run([a.replace("{}", ckpt) for a in command])
            absent = other.run([a.replace("{}", missing) for a in command])
            assert there.returncode == absent.returncode != 0, command
            assert there.stderr.replace(ckpt, missing) == absent.stderr, (command, there.stderr)
    r = other.run(["stat", ckpt])
    assert "No such file or directory" in r.stderr and other.name not in r.stdout

    # Root sees it; the owner still has it whole.
    assert os.stat(ckpt).st_uid == owner.uid
    assert probe("listdir", ckpt, user=owner) == "OK"
    assert json.loads(read(manifest))["id"] == os.path.basename(ckpt)


def test_other_users_process_is_absent_to_lookups(mount, users):
    m = mount
    owner, other = users
    wl = m.start("wl_memory", "--mib", MIB, user=owner)
    pid_dir = m.path(str(wl.pid))
    # Looked up by root and the owner just before, so the name is in the
    # kernel's cache: the other user is asked about all the same.
    for _ in range(2):
        os.stat(os.path.join(pid_dir, "status"))
        assert probe("stat", pid_dir, user=owner) == "OK"
        for op, path in [("stat", pid_dir), ("listdir", pid_dir),
                         ("stat", os.path.join(pid_dir, "status")),
                         ("read", os.path.join(pid_dir, "status")),
                         ("stat", os.path.join(pid_dir, "ctl"))]:
            assert probe(op, path, user=other) == "ENOENT", (op, path)
        r = other.run(["ls", m.mnt])
        assert r.returncode == 0 and str(wl.pid) not in r.stdout.split(), r
    ok, err = other.write(os.path.join(pid_dir, "ctl"), "checkpoint")
    assert not ok and err == os.strerror(errno.ENOENT), err
    assert probe("listdir", pid_dir, user=owner) == "OK"


def test_second_mount_over_a_live_mount_is_refused(mount):
    m = mount
    store = tempfile.mkdtemp(prefix="second-store.", dir=m.work)
    r = subprocess.run([GPUCKPTFS, "--store", store, "--all-processes", "--work-dir",
                        os.path.join(m.work, "run2"), m.mnt],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "already a mount point" in lines[0], r.stderr
    # The first mount still serves, and is the only one there.
    assert "gpuckptfs" in read(m.path("README"))
    assert os.path.isdir(m.path("checkpoints"))
    real = os.path.realpath(m.mnt)
    with open("/proc/self/mountinfo") as f:
        assert [l.split()[4] for l in f].count(real) == 1
    # The refused daemon touched nothing: its store was never opened.
    assert os.listdir(store) == []


def test_checkpoint_help_answers_with_the_synopsis(mount):
    m = mount
    wl = m.start("wl_memory", "--mib", MIB)
    for command in ("checkpoint --help", "checkpoint -h"):
        with pytest.raises(OSError) as e:
            ctl(m.path(str(wl.pid), "ctl"), command)
        assert e.value.errno == errno.EINVAL
        last = status_line(m.mnt, wl.pid, "last")
        assert "usage: checkpoint [--kill] [--name NAME] [--lock-timeout MS]" in last, last
        assert "caught" not in last, last
    with pytest.raises(OSError) as e:
        ctl(m.path("restore"), "/nowhere --help")
    assert e.value.errno == errno.EINVAL
    assert read(m.path("restore")).startswith("error: usage: restore PATH [--gpu-map")
    assert os.listdir(m.path("checkpoints")) == []
    assert wl.alive()


def test_names_are_split_like_a_shell(mount):
    m = mount
    wl = m.start("wl_memory", "--mib", MIB)
    pid_ctl = m.path(str(wl.pid), "ctl")
    # Quoted: one word, which the name check then refuses for its space.
    for command in ('checkpoint --name="x y"', "checkpoint --name 'x y'",
                    "checkpoint --name x\\ y", 'checkpoint "--name=x y"'):
        with pytest.raises(OSError) as e:
            ctl(pid_ctl, command)
        assert e.value.errno == errno.EINVAL, command
        last = status_line(m.mnt, wl.pid, "last")
        assert "'x y'" in last and "may only hold" in last, (command, last)
        assert "not expected" not in last, (command, last)
    # Unterminated quotes are refused as such.
    for command in ('checkpoint --name "x y', "checkpoint --name 'x"):
        with pytest.raises(OSError) as e:
            ctl(pid_ctl, command)
        assert e.value.errno == errno.EINVAL
        assert "unterminated quote" in status_line(m.mnt, wl.pid, "last"), command
    assert os.listdir(m.path("checkpoints")) == []
    # Quotes around an allowed name are only quotes.
    ctl(pid_ctl, 'checkpoint --name="quoted-name"')
    ctl(pid_ctl, "checkpoint --name 'single.quoted'")
    assert sorted(os.listdir(m.path("checkpoints"))) == ["quoted-name", "single.quoted"]
