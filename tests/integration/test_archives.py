"""archives/<id>.tar of a real mount (docs/gpuckptfs.md, "Containers", and
fs/README.md, "Implementation"): each checkpoint as a tar in the layout of a
Podman/CRI-O checkpoint archive, made from the store on every read. GNU tar
lists exactly manifest.json, then what a Podman import keeps under
container/ at the top level, then checkpoint/ and the images; what it
extracts is byte for byte what checkpoints/<id>/ shows; reads at odd offsets
(inside headers, across data and padding) are slices of one sequential read;
the size is exact and nothing is counted by du; the archive is its owner's
alone (ENOENT to others), read-only, and goes with its checkpoint, while an
open one reads on.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_archives.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory (whose tools/gpuckpt/gpuckpt imports the Podman-like
tree). Needs root, /dev/fuse and CRIU; the tests are skipped, saying why,
where one of them is missing.
"""

import errno
import filecmp
import io
import json
import os
import random
import shutil
import stat
import subprocess
import tarfile
import tempfile

import pytest

from gpuckpt_testing.build import GPUCKPT_CLI
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, listdir_as, probe, why_not_runnable

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))

MIB = "16"


def read_sequentially(path):
    """The whole file, in 64 KiB reads from the start."""
    out = bytearray()
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(65536)
            if not chunk:
                return bytes(out)
            out += chunk


def tar_list(path):
    """Member names as GNU tar lists them; fails on any complaint."""
    r = subprocess.run(["tar", "-tf", path], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout.splitlines()


def extract(path, dest):
    r = subprocess.run(["tar", "-xf", path, "-C", dest], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def boundaries(whole):
    """Offsets where the archive changes from one part to the next: each
    member's header, data and padding, and the trailer."""
    out = {0, len(whole) - 1024, len(whole)}
    with tarfile.open(fileobj=io.BytesIO(whole)) as t:
        for member in t.getmembers():
            data_end = member.offset_data + member.size
            padded = member.offset_data + (member.size + 511) // 512 * 512
            assert whole[data_end:padded] == bytes(padded - data_end), member.name
            out |= {member.offset, member.offset_data, data_end, padded}
    return sorted(out)


def check_reads_are_slices(path, whole):
    """Reads at offsets around every boundary, of odd lengths, and at random
    offsets, all equal to the same slice of `whole`: through O_DIRECT where
    the kernel takes it (each read reaches gpuckptfs as asked), and through
    the page cache after dropping this file's pages (page-sized reads whose
    boundaries fall anywhere inside them)."""
    offsets = boundaries(whole)
    rng = random.Random(7)
    cases = [(max(0, b + d), n) for b in offsets for d in (-3, -1, 0, 1, 511)
             for n in (1, 2, 511, 513, 1025, 70001)]
    cases += [(rng.randrange(len(whole)), rng.randrange(1, 300000)) for _ in range(200)]
    cases += [(len(whole) - 5, 100), (len(whole), 10), (len(whole) + 4096, 10)]
    checked = 0
    for flags in (os.O_RDONLY | os.O_DIRECT, os.O_RDONLY):
        try:
            fd = os.open(path, flags)
        except OSError as e:
            assert e.errno == errno.EINVAL and flags & os.O_DIRECT, e
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            for off, n in cases:
                assert os.pread(fd, n, off) == whole[off:off + n], (flags, off, n)
                checked += 1
        finally:
            os.close(fd)
    assert checked >= len(cases)


def test_archive_of_a_checkpoint(mount, users):
    m = mount
    owner, other = users
    wl = m.start("wl_memory", "--mib", MIB, user=owner)
    ckpt = m.checkpoint_named(wl.pid, "arch", user=owner)
    ident = os.path.basename(ckpt)
    archives = m.path("archives")
    tar_path = os.path.join(archives, ident + ".tar")
    images = sorted(os.listdir(os.path.join(ckpt, "images")))
    assert any(n.startswith("pages-") for n in images), images

    # archives/ is in the root; the archive is listed for its owner and root.
    assert "archives" in os.listdir(m.mnt)
    assert sorted(os.listdir(archives)) == [ident + ".tar"]
    assert listdir_as(owner, archives) == [ident + ".tar"]

    # Exact size, owner-only and read-only, the checkpoint's time, no blocks.
    st = os.stat(tar_path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o400, oct(st.st_mode)
    assert (st.st_uid, st.st_gid) == (owner.uid, owner.gid)
    assert st.st_mtime_ns == os.stat(ckpt).st_mtime_ns
    assert st.st_blocks == 0, "the archive is a view: du counts the checkpoint once"
    r = subprocess.run(["du", "-s", "--block-size=1", archives], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split()[0] == "0", r.stdout
    whole = read_sequentially(tar_path)
    assert len(whole) == st.st_size
    assert whole[-1024:] == bytes(1024)
    # The same bytes again (nothing in the headers varies between reads).
    assert read_sequentially(tar_path) == whole

    # GNU tar lists exactly the members, in order, and extracts the
    # checkpoint as the mount shows it.
    assert tar_list(tar_path) == (["manifest.json", "checkpoint/"] +
                                  ["checkpoint/" + n for n in images])
    with tempfile.TemporaryDirectory(dir=m.work) as out:
        extract(tar_path, out)
        assert sorted(os.listdir(out)) == ["checkpoint", "manifest.json"]
        with open(os.path.join(out, "manifest.json"), "rb") as f:
            with open(os.path.join(ckpt, "manifest.json"), "rb") as g:
                assert f.read() == g.read()
        assert sorted(os.listdir(os.path.join(out, "checkpoint"))) == images
        for n in images:
            assert filecmp.cmp(os.path.join(out, "checkpoint", n),
                               os.path.join(ckpt, "images", n), shallow=False), n
            assert os.stat(os.path.join(out, "checkpoint", n)).st_uid == owner.uid

    check_reads_are_slices(tar_path, whole)

    # Someone else: absent, as the checkpoint is (the names were just
    # looked up by root and the owner).
    assert probe("stat", tar_path, user=owner) == "OK"
    for op in ("stat", "read", "unlink", "chmod"):
        assert probe(op, tar_path, user=other) == "ENOENT", op
    assert listdir_as(other, archives) == []
    r = other.run(["tar", "-tf", tar_path])
    assert r.returncode != 0 and "No such file or directory" in r.stderr, r.stderr

    # Read-only: the archive is the checkpoint's (EROFS), archives/ is one
    # of the names gpuckptfs makes (EPERM), as for device/.
    moved = os.path.join(archives, "moved.tar")
    for who in (None, owner):
        for op, *args in [("unlink", tar_path), ("chmod", tar_path), ("chown", tar_path),
                          ("utime", tar_path), ("link", tar_path, os.path.join(archives, "hard"))]:
            assert probe(op, *args, user=who) == "EROFS", (who and who.name, op)
        assert probe("rename", tar_path, moved, user=who) == "EPERM", who and who.name
    # Root passes the mode; the owner is stopped by it (0400) in the kernel.
    assert probe("truncate", tar_path) == "EROFS"
    assert probe("truncate", tar_path, user=owner) == "EACCES"
    with pytest.raises(OSError) as e:
        open(tar_path, "r+b")
    assert e.value.errno == errno.EROFS
    for op, *args in [("create", os.path.join(archives, "new.tar")),
                      ("mkdir", os.path.join(archives, "new")),
                      ("mknod", os.path.join(archives, "new")),
                      ("symlink", ident + ".tar", os.path.join(archives, "soft")),
                      ("rmdir", archives), ("utime", archives)]:
        assert probe(op, *args) == "EPERM", (op, args)
    r = owner.run(["rm", tar_path])
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stderr
    assert read_sequentially(tar_path) == whole

    # Gone with its checkpoint; an archive open before reads on.
    fd = os.open(tar_path, os.O_RDONLY)
    try:
        r = owner.run(["rm", "-r", ckpt])
        assert r.returncode == 0, r.stderr
        assert os.listdir(archives) == []
        assert probe("stat", tar_path) == "ENOENT"
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.fstat(fd).st_size == len(whole)
        assert os.pread(fd, len(whole) + 1, 0) == whole
    finally:
        os.close(fd)


def fake_podman_tree(root):
    """What a Podman import stores: CRIU's images under images/, the rest of
    a Podman checkpoint archive under container/; plus an older layout's
    device/, which archives leave out. Sizes around 512 bytes, and a name
    too long for a ustar header."""
    rng = random.Random(11)

    def put(rel, data):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    put("images/inventory.img", rng.randbytes(512))
    put("images/core-1.img", rng.randbytes(511))
    put("images/pagemap-1.img", rng.randbytes(513))
    put("images/pages-1.img", rng.randbytes(3 << 20))
    put("images/empty.img", b"")
    put("images/" + "x" * 140 + ".img", rng.randbytes(7))
    put("container/config.dump", json.dumps({
        "id": "0123456789abcdef0123456789abcdef", "name": "demo", "rootfsImageName":
        "quay.io/example/demo:latest", "ociRuntime": "crun",
        "createdTime": "2024-01-01T00:00:00Z"}).encode())
    put("container/spec.dump", json.dumps({
        "ociVersion": "1.0.2", "annotations": {"io.container.manager": "libpod"}}).encode())
    put("container/network.status", b"{}")
    put("container/stats-dump", rng.randbytes(100))
    put("container/ctr.log", b"hello\n")
    put("container/artifacts/checkpoint.log", rng.randbytes(2000))
    put("container/devshm-checkpoint.tar", rng.randbytes(10240))
    put("container/rootfs-diff.tar", rng.randbytes(20480))
    put("container/deleted.files", b'["/tmp/x"]')
    put("container/volumes/data.tar", rng.randbytes(1024))
    put("device/cuda-1.bin", rng.randbytes(100))


def test_archive_of_an_imported_podman_checkpoint():
    if not os.access(GPUCKPT_CLI, os.X_OK):
        pytest.skip(f"no gpuckpt CLI at {GPUCKPT_CLI}")
    work = tempfile.mkdtemp(prefix="gpuckpt-archives-src.", dir="/var/tmp")
    m = None
    try:
        src = os.path.join(work, "src")
        store = os.path.join(work, "store")
        fake_podman_tree(src)
        r = subprocess.run([GPUCKPT_CLI, "--store", store, "import", src, "--name", "podman"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        m = Mount("gpuckpt-test_archives.", store=store)
        tar_path = m.path("archives", "podman.tar")
        whole = read_sequentially(tar_path)
        assert len(whole) == os.stat(tar_path).st_size

        container = sorted(["artifacts/", "artifacts/checkpoint.log", "config.dump", "ctr.log",
                            "deleted.files", "devshm-checkpoint.tar", "network.status",
                            "rootfs-diff.tar", "spec.dump", "stats-dump", "volumes/",
                            "volumes/data.tar"])
        images = sorted(os.listdir(os.path.join(src, "images")))
        names = tar_list(tar_path)
        assert names == (["manifest.json"] + container + ["checkpoint/"] +
                         ["checkpoint/" + n for n in images])
        # What checkpointctl looks for (internal/utils.go, cmd/show.go): a
        # directory member "checkpoint", and config.dump and spec.dump.
        with tarfile.open(tar_path) as t:
            members = {x.name: x for x in t.getmembers()}
            assert members["checkpoint"].isdir()
            assert json.load(t.extractfile("config.dump"))["name"] == "demo"
            manager = json.load(t.extractfile("spec.dump"))["annotations"]
            assert manager["io.container.manager"] == "libpod"

        with tempfile.TemporaryDirectory(dir=work) as out:
            extract(tar_path, out)
            for rel in container:
                if not rel.endswith("/"):
                    assert filecmp.cmp(os.path.join(out, rel), os.path.join(src, "container", rel),
                                       shallow=False), rel
            for n in images:
                assert filecmp.cmp(os.path.join(out, "checkpoint", n),
                                   os.path.join(src, "images", n), shallow=False), n
            with open(os.path.join(out, "manifest.json")) as f:
                assert f.read() == read(m.path("checkpoints", "podman", "manifest.json"))
            assert not os.path.exists(os.path.join(out, "device"))

        check_reads_are_slices(tar_path, whole)
    finally:
        if m is not None:
            m.close()
        shutil.rmtree(work, ignore_errors=True)
