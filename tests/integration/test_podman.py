"""Podman containers and gpuckpt (docs/gpuckptfs.md, "Containers"), with the
real Podman and runc from Debian on an image made here from a static busybox
(podman.py): a running container's init checkpointed through `<pid>/ctl` of
a real mount and restored through `restore` into new namespaces on the
container's root filesystem, its output going on where it stopped.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_podman.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
directory of the workloads. Needs root, /dev/fuse, CRIU, Podman, runc and
busybox-static; the tests are skipped, saying why, where one is missing.
"""

import errno
import json
import os
import shutil
import subprocess

import pytest

from gpuckpt_testing.filetools import read, tree_differences
from gpuckpt_testing.mount import ctl, why_not_runnable
from gpuckpt_testing.podman import Podman, last_count, why_podman_cannot_run
from gpuckpt_testing.processes import kill_if_alive, wait_for

pytestmark = [
    pytest.mark.skipif(why_not_runnable() is not None, reason=str(why_not_runnable())),
    pytest.mark.skipif(why_podman_cannot_run() is not None, reason=str(why_podman_cannot_run())),
]


@pytest.fixture(scope="module")
def podman():
    p = Podman()
    try:
        yield p
    finally:
        p.close()


def test_container_checkpointed_and_restored_through_the_mount(mount, podman):
    # Without a network of its own: a veth's other end, on the host, is the
    # container engine's to make again (docs/gpuckptfs.md, "Containers").
    pid = podman.start_counter("through-mount", "--network", "none")
    rootfs = podman.run("mount", "through-mount")
    out = os.path.join(rootfs, "tmp", "out")
    wait_for(lambda: last_count(out) >= 3, 30, "the container's counter")
    wait_for(lambda: os.path.isdir(mount.path(str(pid))), 10, "its directory")
    ctl(mount.path(str(pid), "ctl"), "checkpoint --kill")
    stopped_at = last_count(out)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the container's init to go")
    ckpt = mount.path("checkpoints", f"{pid}-1")
    manifest = json.loads(read(os.path.join(ckpt, "manifest.json")))
    assert manifest["extra"]["mount_namespace"] == {"root": rootfs}

    # The container is stopped now; its root filesystem stays mounted
    # (podman mount) for the restore.
    assert podman.run("inspect", "-f", "{{.State.Running}}", "through-mount") == "false"
    assert podman.run("mount", "through-mount") == rootfs
    ctl(mount.path("restore"), ckpt)
    answer = read(mount.path("restore")).strip()
    assert answer.startswith("pid "), answer
    restored = int(answer.split()[1])
    try:
        wait_for(lambda: last_count(out) >= stopped_at + 5, 30, "the counter to go on")
        lines = [int(x) for x in read(out).split()]
        # It went on from where it stopped: no number twice, none left out.
        assert lines == list(range(len(lines))), lines[-20:]
        status = read(f"/proc/{restored}/status")
        assert [int(p) for p in status.split("NSpid:")[1].split("\n")[0].split()][-1] == 1
        # Its root is the container's root filesystem.
        inside, outside = os.stat(f"/proc/{restored}/root/tmp/out"), os.stat(out)
        assert (inside.st_dev, inside.st_ino) == (outside.st_dev, outside.st_ino)
    finally:
        kill_if_alive(restored)


def export(podman, container, path, compress="none", leave_running=True):
    """`podman container checkpoint --export` of `container` into `path`."""
    args = ["container", "checkpoint", "--export", path, "--compress", compress]
    if leave_running:
        args.append("--leave-running")
    podman.run(*args, container)


def tar_members(path):
    r = subprocess.run(["tar", "-tf", path], capture_output=True, text=True, check=True)
    return [m.rstrip("/") for m in r.stdout.splitlines()]


def extract(path, dest):
    os.makedirs(dest)
    subprocess.run(["tar", "-C", dest, "-xf", path], check=True)
    return dest


def manifest(mount, ckpt_id):
    return json.loads(read(mount.path("checkpoints", ckpt_id, "manifest.json")))


def test_podman_archive_imported_and_restored_by_podman_from_the_mount(mount, podman, tmp_path):
    podman.start_counter("archive", "--network", "none")
    out = os.path.join(podman.run("mount", "archive"), "tmp", "out")
    wait_for(lambda: last_count(out) >= 3, 30, "the container's counter")
    archive = str(tmp_path / "archive.tar")
    export(podman, "archive", archive, leave_running=False)
    stopped_at = last_count(out)

    ctl(mount.path("ctl"), f"import {archive} ctr")
    ckpt = mount.path("checkpoints", "ctr")
    extra = manifest(mount, "ctr")["extra"]
    assert extra["container"]["name"] == "archive"
    assert extra["pid"] == 1 and extra["imported_from"] == archive
    # Its CRIU images became images/, the rest container/, byte for byte.
    original = extract(archive, str(tmp_path / "original"))
    assert sorted(os.listdir(ckpt)) == ["container", "images", "manifest.json"]
    assert tree_differences(os.path.join(original, "checkpoint"),
                            os.path.join(ckpt, "images")) == []
    shutil.rmtree(os.path.join(original, "checkpoint"))
    assert tree_differences(original, os.path.join(ckpt, "container")) == []

    # archives/ctr.tar gives it back: the same members (in path order, with
    # gpuckpt's manifest first), and the same bytes.
    from_mount = mount.path("archives", "ctr.tar")
    members = tar_members(from_mount)
    assert members[0] == "manifest.json"
    assert sorted(members[1:]) == sorted(m for m in tar_members(archive) if m != ".")
    out_of_mount = extract(from_mount, str(tmp_path / "b"))
    assert tree_differences(extract(archive, str(tmp_path / "a")),
                            out_of_mount) == ["manifest.json"]
    # What checkpointctl's layout check asks for (internal/utils.go and
    # lib/metadata.go of checkpoint-restore/checkpointctl): a checkpoint
    # directory member, and config.dump and spec.dump that parse as JSON.
    assert "checkpoint" in members
    for name in ("config.dump", "spec.dump"):
        with open(os.path.join(out_of_mount, name)) as f:
            assert isinstance(json.load(f), dict), name

    # Its bind mounts are named for the engine's restore: the mount's own
    # restore refuses it, saying what to do instead.
    with pytest.raises(OSError) as refused:
        ctl(mount.path("restore"), ckpt)
    assert refused.value.errno == errno.EINVAL
    assert "podman container restore --import" in read(mount.path("restore"))

    # Podman restores it straight from the mount; the counter goes on.
    podman.run("rm", "-f", "archive")
    podman.run("container", "restore", "--import", from_mount)
    assert podman.run("inspect", "-f", "{{.State.Running}}", "archive") == "true"
    out = os.path.join(podman.run("mount", "archive"), "tmp", "out")
    wait_for(lambda: last_count(out) >= stopped_at + 5, 30, "the restored counter to go on")
    lines = [int(x) for x in read(out).split()]
    assert lines == list(range(len(lines))), lines[-20:]
    podman.run("rm", "-f", "archive")


def test_compressed_and_extracted_archives_deduplicate(mount, podman, tmp_path):
    podman.start_memory("unchanged", 64, "--network", "none")
    exports = {"plain.tar": "none", "again.tar": "none", "zstd.tar.zst": "zstd",
               "gzip.tar.gz": "gzip"}
    for name, compress in exports.items():
        export(podman, "unchanged", str(tmp_path / name), compress)
    extracted = extract(str(tmp_path / "plain.tar"), str(tmp_path / "extracted"))
    for name in list(exports) + ["extracted"]:
        ctl(mount.path("ctl"), f"import {tmp_path / name}")
    first = manifest(mount, "plain")
    assert first["logical_bytes"] > 64 << 20
    # A second checkpoint of the unchanged container adds less than 1%,
    # uncompressed, zstd or gzip; the extracted directory of the first adds
    # nothing but its manifest's worth.
    for ckpt_id in ("again", "zstd", "gzip", "extracted"):
        m = manifest(mount, ckpt_id)
        assert m["new_bytes"] < m["logical_bytes"] / 100, (ckpt_id, m["new_bytes"])
    # What a compressed archive held is stored as it was, decompressed.
    for name, ckpt_id in (("zstd.tar.zst", "zstd"), ("gzip.tar.gz", "gzip")):
        inside = extract(str(tmp_path / name), str(tmp_path / (ckpt_id + "-x")))
        assert tree_differences(os.path.join(inside, "checkpoint"),
                                mount.path("checkpoints", ckpt_id, "images")) == []
    assert tree_differences(os.path.join(extracted, "checkpoint"),
                            mount.path("checkpoints", "extracted", "images")) == []
    podman.run("rm", "-f", "unchanged")
