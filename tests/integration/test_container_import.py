"""`import` of container checkpoint archives through a real mount
(docs/gpuckptfs.md, "Containers"), without a container engine: archives in
Podman's layout (checkpoint/ holding CRIU's images, config.dump and the
engine's other files beside it) are made here from a real checkpoint's
images with Python's tarfile, as tar, tar.gz and tar.zst, and as a
directory. An import stores the images as images/ and the rest as
container/, owned by the importer whatever the archive claims, and the
checkpoint restores from the mount; archives that could write outside the
tree, hold hard links or devices, are no tar, lack pstree.img or are cut
short are refused (EINVAL) and store nothing; a user cannot import someone
else's archive; a FIFO is refused without blocking.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_container_import.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
directory of the workloads. Needs root, /dev/fuse and CRIU; the tests are
skipped, saying why, where one of them is missing.
"""

import errno
import io
import json
import os
import shutil
import subprocess
import tarfile
import time

import pytest

from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import ctl, why_not_runnable
from gpuckpt_testing.users import Root

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))

CONFIG = {"name": "made-here", "id": "0123abcd", "rootfsImageName": "localhost/none:1"}


def add_bytes(tar, name, data, mode=0o600, **fields):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 1700000000
    for k, v in fields.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data))


def podman_layout(images_dir, path, mode="w", extra=None):
    """A tar in Podman's layout of the images in `images_dir` at `path`
    (mode "w", "w:gz"), its members claiming uid 0; `extra(tar)` may add
    more."""
    with tarfile.open(path, mode) as tar:
        add_bytes(tar, "config.dump", json.dumps(CONFIG).encode(), uid=0, gid=0)
        add_bytes(tar, "spec.dump", b"{}", uid=0, gid=0)
        info = tarfile.TarInfo("checkpoint")
        info.type = tarfile.DIRTYPE
        info.mode = 0o700
        tar.addfile(info)
        for name in sorted(os.listdir(images_dir)):
            with open(os.path.join(images_dir, name), "rb") as f:
                add_bytes(tar, "checkpoint/" + name, f.read(), mode=0o644, uid=0, gid=0)
        if extra:
            extra(tar)
    return path


@pytest.fixture
def made(mount, tmp_path):
    """A checkpoint of wl_memory (killed), and its images copied out."""
    wl = mount.start("wl_memory", "--mib", "8")
    ckpt = mount.checkpoint_named(wl.pid, "made")
    wl.kill()
    images = str(tmp_path / "images")
    shutil.copytree(os.path.join(ckpt, "images"), images)
    return wl, images


def test_archives_and_directories_in_podman_layout(mount, made, tmp_path):
    wl, images = made
    plain = podman_layout(images, str(tmp_path / "plain.tar"))
    gz = podman_layout(images, str(tmp_path / "gz.tar.gz"), "w:gz")
    zst = str(tmp_path / "zst.tar.zst")
    subprocess.run(["zstd", "-q", "-o", zst, plain], check=True)
    directory = str(tmp_path / "dir")
    os.makedirs(directory)
    subprocess.run(["tar", "-C", directory, "-xf", plain], check=True)
    for path, name in ((plain, "plain"), (gz, "gz"), (zst, "zst"), (directory, "dir")):
        ctl(mount.path("ctl"), f"import {path} {name}")
        ckpt = mount.path("checkpoints", name)
        assert sorted(os.listdir(ckpt)) == ["container", "images", "manifest.json"]
        assert sorted(os.listdir(os.path.join(ckpt, "container"))) == ["config.dump",
                                                                       "spec.dump"]
        for image in os.listdir(images):
            with open(os.path.join(images, image), "rb") as a, \
                    open(os.path.join(ckpt, "images", image), "rb") as b:
                assert a.read() == b.read(), (name, image)
        manifest = json.loads(read(os.path.join(ckpt, "manifest.json")))
        assert manifest["extra"]["container"] == {"name": "made-here", "id": "0123abcd",
                                                  "image": "localhost/none:1"}
        assert manifest["extra"]["pid"] == wl.pid
        # Not a namespace's tree: nothing asks for a root directory.
        assert "mount_namespace" not in manifest["extra"]
        # Stored once: the second and later imports add next to nothing.
        if name != "plain":
            assert manifest["new_bytes"] < manifest["logical_bytes"] / 100, manifest
    # A name of its own when none is given: the file's, without extensions.
    ctl(mount.path("ctl"), f"import {gz}")
    assert "gz-2" in mount.ids()
    # Handed to restore, an archive is imported and restored in one step.
    mount.restore(zst, wl.pid)
    assert "zst-2" in mount.ids()
    assert wl.verdict() == "PASS"


def test_bad_archives_are_refused_and_store_nothing(mount, made, tmp_path):
    _, images = made

    def member(name, **fields):
        return lambda tar: add_bytes(tar, name, b"x", **fields)

    def link(name, target, kind):
        def add(tar):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = target
            tar.addfile(info)
        return add

    def device(tar):
        info = tarfile.TarInfo("dev-null")
        info.type = tarfile.CHRTYPE
        info.devmajor, info.devminor = 1, 3
        tar.addfile(info)

    cases = {
        "climbs": podman_layout(images, str(tmp_path / "climbs.tar"),
                                extra=member("../outside")),
        "absolute": podman_layout(images, str(tmp_path / "absolute.tar"),
                                  extra=member("/etc/gpuckpt-test")),
        "hardlink": podman_layout(images, str(tmp_path / "hardlink.tar"),
                                  extra=link("checkpoint/again.img", "checkpoint/pstree.img",
                                             tarfile.LNKTYPE)),
        "device": podman_layout(images, str(tmp_path / "device.tar"), extra=device),
        "twice": podman_layout(images, str(tmp_path / "twice.tar"),
                               extra=member("config.dump")),
    }
    no_pstree = str(tmp_path / "no-pstree")
    shutil.copytree(images, no_pstree)
    os.unlink(os.path.join(no_pstree, "pstree.img"))
    cases["no-pstree"] = podman_layout(no_pstree, str(tmp_path / "no-pstree.tar"))
    whole = podman_layout(images, str(tmp_path / "whole.tar.gz"), "w:gz")
    with open(whole, "rb") as f:
        data = f.read()
    cut = str(tmp_path / "cut.tar.gz")
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2])
    cases["cut"] = cut
    not_tar = str(tmp_path / "not-a-tar")
    with open(not_tar, "wb") as f:
        f.write(os.urandom(4096))
    cases["not-tar"] = not_tar
    fifo = str(tmp_path / "fifo.tar")
    os.mkfifo(fifo)
    cases["fifo"] = fifo

    before = mount.ids()
    for case, path in cases.items():
        start = time.monotonic()
        with pytest.raises(OSError) as refused:
            ctl(mount.path("ctl"), f"import {path} {case}")
        assert refused.value.errno == errno.EINVAL, (case, refused.value)
        assert time.monotonic() - start < 20, case
        # The restore of the same path goes through the same import and
        # says why.
        with pytest.raises(OSError):
            ctl(mount.path("restore"), path)
        assert read(mount.path("restore")).startswith("error: "), case
    assert mount.ids() == before, "a refused archive left a checkpoint behind"
    said = {}
    for case in ("climbs", "hardlink", "device", "twice", "no-pstree"):
        with pytest.raises(OSError):
            ctl(mount.path("restore"), cases[case])
        said[case] = read(mount.path("restore"))
    assert "outside the archive's tree" in said["climbs"]
    assert "hard link" in said["hardlink"]
    assert "not a regular file, directory or symlink" in said["device"]
    assert "twice" in said["twice"]
    assert "no checkpoint/pstree.img" in said["no-pstree"]


def test_users_import_their_own_archives_only(mount, made, users):
    _, images = made
    a, _ = users
    # Where the user may read (the mount's work directory is 0755).
    shared = os.path.join(mount.work, "archives")
    os.mkdir(shared)
    archive = podman_layout(images, os.path.join(shared, "roots.tar"))
    os.chmod(archive, 0o644)
    assert a.run(["test", "-r", archive]).returncode == 0, "the test user cannot read it at all"
    ok, err = a.write(mount.path("ctl"), f"import {archive} theirs")
    # Someone else's checkpoint is absent to them, as in the mount.
    assert not ok and "No such file or directory" in err, err
    # Their own copy of it: imported, every entry theirs, whatever the
    # archive says (uid 0).
    own = os.path.join(shared, "own.tar")
    shutil.copy(archive, own)
    os.chown(own, a.uid, a.gid)
    ok, err = a.write(mount.path("ctl"), f"import {own} mine")
    assert ok, err
    (mine,) = [i for i in mount.ids() if i.endswith("mine")]
    ckpt = mount.path("checkpoints", mine)
    for sub in ("images", "images/pstree.img", "container", "container/config.dump"):
        st = os.stat(os.path.join(ckpt, sub))
        assert (st.st_uid, st.st_gid) == (a.uid, a.gid), sub
    assert Root().read(os.path.join(ckpt, "container", "config.dump"))[0]


def test_archive_of_a_ctl_checkpoint_imports_as_the_same_checkpoint(mount, made, tmp_path):
    wl, images = made
    copy = str(tmp_path / "made.tar")
    shutil.copyfile(mount.path("archives", "made.tar"), copy)
    ctl(mount.path("ctl"), f"import {copy} again")
    again = mount.path("checkpoints", "again")
    # No container files: a plain checkpoint again, images byte for byte.
    assert sorted(os.listdir(again)) == ["images", "manifest.json"]
    for image in os.listdir(images):
        with open(os.path.join(images, image), "rb") as a, \
                open(os.path.join(again, "images", image), "rb") as b:
            assert a.read() == b.read(), image
    original = json.loads(read(mount.path("checkpoints", "made", "manifest.json")))["extra"]
    manifest = json.loads(read(os.path.join(again, "manifest.json")))
    extra = manifest["extra"]
    assert "container" not in extra and extra["pid"] == wl.pid
    # What a restore needs was taken over from the archive's manifest.json.
    for key in ("gpu_backend", "shell_job"):
        assert extra[key] == original[key], key
    # Stored once: the import adds next to nothing.
    assert manifest["new_bytes"] < manifest["logical_bytes"] / 100, manifest
    ctl(mount.path("restore"), again)
    assert wl.verdict() == "PASS"
