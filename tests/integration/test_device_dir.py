"""device/<id>/ of a real mount (docs/gpuckptfs.md, "device/"): a
checkpoint's device memory shown as views of its images, outside
checkpoints/<id>/, so that a `cp -r` of a checkpoint is its logical size.
Without a GPU, a checkpoint of wl_memory stands in for a CUDA one: a copy of
it whose manifest records one of its mappings as device memory
(extra.device.cuda_host_ranges, as cuda-checkpoint records them), with a
device/ as older versions copied it, is imported. The import leaves that
device/ out, unread; the mount shows the range under device/<id>/, with the
process's bytes, to its owner alone, read-only; the copy restores.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_device_dir.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
directory of the workloads. Needs root, /dev/fuse and CRIU; the tests are
skipped, saying why, where one of them is missing.
"""

import errno
import json
import hashlib
import os
import subprocess

import pytest

from gpuckpt_testing.build import PYTHON
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import ctl, listdir_as, probe, why_not_runnable
from gpuckpt_testing.users import Root

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))

MIB = 16
SHA256 = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"


def private_mapping(pid):
    """(start, end) of the largest private anonymous mapping of `pid`: the
    workload's memory, whose pages CRIU dumps (some of them holes)."""
    best = (0, 0)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) != 5 or fields[1] != "rw-p":
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start > best[1] - best[0]:
                best = (start, end)
    assert best[1] - best[0] >= MIB << 20, f"no {MIB} MiB mapping in /proc/{pid}/maps"
    return best


def memory_of(pid, start, end):
    with open(f"/proc/{pid}/mem", "rb") as f:
        f.seek(start)
        return f.read(end - start)


def cuda_like_copy(ckpt, dest, owner, ranges):
    """A `cp -r` copy of `ckpt`, owned by `owner`, whose manifest records
    `ranges` [(pid, start, end)] as device memory, with a device/ as older
    versions copied it: stale bytes, and a file that is not the owner's
    (an import that read it would be refused)."""
    subprocess.run(["cp", "-r", ckpt, dest], check=True)
    manifest_path = os.path.join(dest, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["extra"]["device"] = {"cuda_host_ranges": [
        {"pid": pid, "start": start, "end": end} for pid, start, end in ranges]}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    device = os.path.join(dest, "device")
    os.mkdir(device)
    for pid, start, end in ranges:
        with open(os.path.join(device, f"cuda-{pid}-{start:x}.bin"), "wb") as f:
            f.write(b"stale" * ((end - start) // 5))
    subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", dest], check=True)
    with open(os.path.join(device, "cuda-ranges.json"), "w") as f:
        f.write("{}\n")  # root's
    return manifest


def import_as(m, user, path, name):
    """Imports `path` as `user`; the new checkpoint's id."""
    ok, err = user.write(m.path("ctl"), f"import {path} {name}")
    assert ok, err
    return f"{user.uid}.{name}"


def test_device_dir_shows_an_imported_copy_and_the_copy_restores(mount, users):
    m = mount
    owner, other = users
    wl = m.start("wl_memory", "--mib", str(MIB), user=owner)
    ckpt = m.checkpoint_named(wl.pid, "plain", user=owner)
    start, end = private_mapping(wl.pid)
    expected = memory_of(wl.pid, start, end)
    original = json.loads(read(os.path.join(ckpt, "manifest.json")))

    # A checkpoint without device state: no device/ anywhere.
    assert sorted(os.listdir(ckpt)) == ["images", "manifest.json"]
    assert "device" in os.listdir(m.mnt)
    assert os.listdir(m.path("device")) == []
    assert probe("listdir", m.path("device", os.path.basename(ckpt))) == "ENOENT"

    copy = os.path.join(m.work, "copy")
    manifest = cuda_like_copy(ckpt, copy, owner, [(wl.pid, start, end)])
    # A range edited by hand into nonsense (end before start): left out of
    # the import, which says so, rather than refusing the whole copy.
    manifest["extra"]["device"]["cuda_host_ranges"].append(
        {"pid": wl.pid, "start": end, "end": start})
    with open(os.path.join(copy, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    ident = import_as(m, owner, copy, "cuda")

    # The import took the images and the ranges, not the copy's device/.
    imported = json.loads(read(m.path("checkpoints", ident, "manifest.json")))
    assert imported["logical_bytes"] == original["logical_bytes"]
    assert imported["files"] == original["files"]
    assert imported["extra"]["device"]["cuda_host_ranges"] == [
        {"pid": wl.pid, "start": start, "end": end}]
    assert imported["extra"]["import_dropped"] == ["device.cuda_host_ranges[1]"]
    assert sorted(os.listdir(m.path("checkpoints", ident))) == ["images", "manifest.json"]
    # And a copy of it is its logical size.
    recopy = os.path.join(m.work, "recopy")
    subprocess.run(["cp", "-r", m.path("checkpoints", ident), recopy], check=True)
    copied = sum(os.path.getsize(os.path.join(root, f))
                 for root, _, files in os.walk(recopy) for f in files if f != "manifest.json")
    assert copied == original["logical_bytes"]

    # device/ lists it for its owner and root, for nobody else.
    assert listdir_as(owner, m.path("device")) == [ident]
    assert sorted(os.listdir(m.path("device"))) == [ident]
    assert listdir_as(other, m.path("device")) == []
    device = m.path("device", ident)
    name = f"cuda-{wl.pid}-{start:x}.bin"
    assert sorted(os.listdir(device)) == [name, "cuda-ranges.json"]
    st = os.stat(device)
    assert (st.st_mode, st.st_uid) == (0o40700, owner.uid)
    bin_path = os.path.join(device, name)
    st = os.stat(bin_path)
    assert (st.st_mode, st.st_uid, st.st_size) == (0o100600, owner.uid, end - start)
    assert st.st_blocks == 0, "device files are views: nothing is stored twice"
    # The process's bytes (holes as zeros), not the copy's stale ones.
    with open(bin_path, "rb") as f:
        assert f.read() == expected
    r = owner.run([PYTHON, "-c", SHA256, bin_path])
    assert r.returncode == 0 and r.stdout.strip() == hashlib.sha256(expected).hexdigest(), r
    listing = json.loads(read(os.path.join(device, "cuda-ranges.json")))
    assert [(x["file"], x["start"], x["end"]) for x in listing["ranges"]] == [(name, start, end)]

    # Absent to another user, as the checkpoint is.
    for op, path in [("stat", device), ("listdir", device), ("stat", bin_path),
                     ("read", bin_path), ("rmdir", device), ("unlink", bin_path)]:
        assert probe(op, path, user=other) == "ENOENT", (op, path)

    # Read-only, for its owner and root; device/ itself is gpuckpt's.
    for who in (None, owner):
        for op, *args in [
            ("unlink", bin_path),
            ("rmdir", device),
            ("mkdir", os.path.join(device, "new")),
            ("create", os.path.join(device, "new")),
            ("mknod", os.path.join(device, "new")),
            ("rename", bin_path, os.path.join(device, "moved")),
            ("link", bin_path, os.path.join(device, "hard")),
            ("symlink", name, os.path.join(device, "soft")),
            ("utime", bin_path),
            ("utime", device),
            ("chmod", bin_path),
            ("chown", bin_path),
            ("truncate", bin_path),
        ]:
            assert probe(op, *args, user=who) == "EROFS", (who and who.name, op, args)
    with pytest.raises(OSError) as e:
        open(bin_path, "r+b")
    assert e.value.errno == errno.EROFS
    for op, *args in [("mkdir", m.path("device", "new")), ("create", m.path("device", "new")),
                      ("rmdir", m.path("device")),
                      ("rename", device, m.path("device", "renamed"))]:
        assert probe(op, *args) == "EPERM", (op, args)
    # `rm -r device/<id>` deletes no checkpoint.
    r = owner.run(["rm", "-r", device])
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stderr
    assert os.path.isdir(m.path("checkpoints", ident))
    assert sorted(os.listdir(device)) == [name, "cuda-ranges.json"]

    # The copy restores (imported again, its device/ left out again).
    wl.kill()
    m.restore(copy, wl.pid, user=owner)
    assert wl.verdict() == "PASS"


def test_removed_checkpoints_device_dir_stays_gone(mount):
    m = mount
    wl = m.start("wl_memory", "--mib", str(MIB))
    ckpt = m.checkpoint_named(wl.pid, "plain")
    start, end = private_mapping(wl.pid)
    half = start + ((end - start) // 2 & ~0xfff)
    first = os.path.join(m.work, "first")
    second = os.path.join(m.work, "second")
    cuda_like_copy(ckpt, first, Root(), [(wl.pid, start, half)])
    cuda_like_copy(ckpt, second, Root(), [(wl.pid, half, end)])
    ctl(m.path("ctl"), f"import {first} again")
    device = m.path("device", "again")
    old_name = f"cuda-{wl.pid}-{start:x}.bin"
    old_bytes = memory_of(wl.pid, start, half)

    # What holds the old device/<id>: an open file, a process's cwd.
    old_file = open(os.path.join(device, old_name), "rb")
    holder = subprocess.Popen(["sleep", "600"], cwd=device)
    try:
        subprocess.run(["rm", "-r", m.path("checkpoints", "again")], check=True)
        assert not os.path.exists(device)
        ctl(m.path("ctl"), f"import {second} again")
        assert sorted(os.listdir(device)) == [f"cuda-{wl.pid}-{half:x}.bin", "cuda-ranges.json"]
        # The open file reads on in the removed checkpoint.
        assert os.pread(old_file.fileno(), len(old_bytes) + 1, 0) == old_bytes
        # Through the old directory, the old checkpoint is gone, and
        # nothing of the new one shows there.
        cwd = f"/proc/{holder.pid}/cwd"
        assert probe("listdir", cwd) == "ENOENT"
        assert probe("stat", os.path.join(cwd, "cuda-ranges.json")) == "ENOENT"
    finally:
        holder.kill()
        holder.wait()
        old_file.close()
    with open(os.path.join(device, f"cuda-{wl.pid}-{half:x}.bin"), "rb") as f:
        assert f.read() == memory_of(wl.pid, half, end)
