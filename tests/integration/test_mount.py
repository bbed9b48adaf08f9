"""gpuckptfs on a real FUSE mount of a store filled with the gpuckpt CLI: an
imported tree is served under checkpoints/<id>/images/, byte for byte,
read-only, with its manifest and with 8 MiB of kernel read-ahead; the
mount's type is fuse.gpuckptfs and its source the store's path; a second
daemon (or the CLI) on the same store is refused; unmounting stops the
daemon and frees the store.

Run by ctest under wl_reaper:
    wl_reaper python3 -m pytest tests/integration/test_mount.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory (its tools/gpuckpt/gpuckpt is the CLI). Needs root and
/dev/fuse (CRIU too, as every test of the mount); skipped, saying why, where
one of them is missing.
"""

import json
import os
import subprocess

import pytest

from gpuckpt_testing.build import GPUCKPTFS
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, cli, why_not_runnable

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))

PAGES_SIZE = 3 * 1024 * 1024 + 17
CORE_SIZE = 100000


@pytest.fixture(scope="module")
def imported():
    """A mount of a store into which the CLI imported a tree as ckpt-a
    before the daemon started: (the mount, the source tree's images/). One
    for the whole file, the tests only read it; the last one unmounts."""
    m = Mount("gpuckpt-test_mount.", mounted=False)
    try:
        # A snapshot's files appear under checkpoints/<id>/ as they were
        # imported; the engine's checkpoints keep CRIU's files in images/.
        src = os.path.join(m.work, "src", "images")
        os.makedirs(os.path.join(src, "sub"))
        with open(os.path.join(src, "pages-1.img"), "wb") as f:
            f.write(os.urandom(PAGES_SIZE))
        with open(os.path.join(src, "sub", "core-1.img"), "wb") as f:
            f.write(os.urandom(CORE_SIZE))
        open(os.path.join(src, "empty.img"), "w").close()
        os.chmod(os.path.join(src, "sub", "core-1.img"), 0o640)
        os.symlink("sub/core-1.img", os.path.join(src, "link"))
        r = cli(m.store, "import", os.path.dirname(src), "--name", "ckpt-a")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "ckpt-a", f"import printed {r.stdout!r}"
        m.start_daemon()
        yield m, src
    finally:
        m.close()


def test_imported_tree_is_served_byte_for_byte_with_its_manifest(imported):
    m, src = imported
    assert os.path.isfile(m.path("README")), "no README"
    assert os.listdir(m.path("checkpoints")) == ["ckpt-a"]
    images = m.path("checkpoints", "ckpt-a", "images")
    for name in ("pages-1.img", "sub/core-1.img", "empty.img"):
        assert read_bytes(os.path.join(images, name)) == read_bytes(os.path.join(src, name)), \
            f"{name} differs"
    assert os.readlink(os.path.join(images, "link")) == "sub/core-1.img"
    assert os.stat(os.path.join(images, "sub", "core-1.img")).st_mode & 0o7777 == 0o640
    assert os.stat(os.path.join(images, "pages-1.img")).st_size == PAGES_SIZE
    # A read at an offset inside a chunk and across the end.
    with open(os.path.join(images, "pages-1.img"), "rb") as f:
        f.seek(-4097, os.SEEK_END)
        assert f.read() == read_bytes(os.path.join(src, "pages-1.img"))[-4097:]
    # Images are served only to root (the store's owner): the snapshot dir
    # is 0700.
    assert os.stat(m.path("checkpoints", "ckpt-a")).st_mode & 0o7777 == 0o700
    manifest = json.loads(read(m.path("checkpoints", "ckpt-a", "manifest.json")))
    assert manifest["id"] == "ckpt-a" and manifest["logical_bytes"] > 3000000, manifest
    # du: what the checkpoint added (random data: about its size).
    du_kib = int(subprocess.run(["du", "-sk", images], capture_output=True, text=True,
                                check=True).stdout.split()[0])
    assert 3000 < du_kib < 4000, f"du of images is {du_kib} KiB"
    # cp -r of a checkpoint is byte-identical to the source.
    copy = os.path.join(m.work, "copy")
    subprocess.run(["cp", "-r", images, copy], check=True)
    r = subprocess.run(["diff", "-r", src, copy], capture_output=True, text=True)
    assert r.returncode == 0, f"cp -r copy differs: {r.stdout}{r.stderr}"


def test_cold_sequential_reads_get_8_mib_of_read_ahead(imported):
    m, _ = imported
    # Not the 128 KiB the kernel gives a FUSE mount by default.
    device = next(line.split()[2] for line in read("/proc/self/mountinfo").splitlines()
                  if line.split()[4] == os.path.realpath(m.mnt))
    read_ahead = read(f"/sys/class/bdi/{device}/read_ahead_kb").strip()
    assert read_ahead == "8192", f"read-ahead of the mount (bdi {device}) is {read_ahead} KiB"


def test_second_daemon_and_cli_on_a_store_in_use_are_refused(imported):
    m, _ = imported
    other = os.path.join(m.work, "other-mnt")
    os.mkdir(other)
    r = subprocess.run([GPUCKPTFS, "--store", m.store, other], capture_output=True, text=True,
                       timeout=60)
    if r.returncode == 0:
        subprocess.run(["fusermount3", "-u", other])
    assert r.returncode != 0, "a second daemon mounted"
    assert "in use" in r.stdout + r.stderr, f"the second daemon's message: {r.stdout}{r.stderr}"
    r = cli(m.store, "gc")
    assert r.returncode != 0, "the CLI changed a store in use"
    assert "in use" in r.stdout + r.stderr, f"the CLI's message: {r.stdout}{r.stderr}"


def test_the_mount_is_a_gpuckptfs_whose_source_is_its_store(imported, tmp_path):
    """findmnt tells two daemons apart: the type is fuse.gpuckptfs, the
    source the store's path (a comma and a space in it included)."""
    m, _ = imported
    other = Mount("gpuckpt-test_mount.", store=str(tmp_path / "st,ore x"))
    try:
        for mount in (m, other):
            r = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "--mountpoint",
                                mount.mnt], capture_output=True, text=True, check=True)
            fstype, source = r.stdout.strip().split(" ", 1)
            assert (fstype, source) == ("fuse.gpuckptfs", mount.store), r.stdout
    finally:
        other.close()


def test_images_are_read_only(imported):
    m, _ = imported
    images = m.path("checkpoints", "ckpt-a", "images")
    with pytest.raises(OSError):
        with open(os.path.join(images, "pages-1.img"), "w") as f:
            f.write("x\n")
    with pytest.raises(OSError):
        open(os.path.join(images, "new"), "w").close()


# Last: it ends the mount the others read.
def test_unmount_stops_the_daemon_and_frees_the_store(imported):
    m, _ = imported
    m.unmount()
    r = cli(m.store, "fsck")
    assert r.returncode == 0, f"fsck after unmount: {r.stdout}{r.stderr}"


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()
