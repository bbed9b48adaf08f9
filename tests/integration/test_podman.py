"""Podman containers and gpuckpt (docs/gpuckptfs.md, "Containers"), with the
real Podman and runc from Debian on an image made here from a static busybox
(podman.py): a running container's init checkpointed through `<pid>/ctl` of
a real mount and restored through `restore` into new namespaces on the
container's root filesystem, its output going on where it stopped; Podman's
checkpoint archives imported and given back by archives/<id>.tar, which
Podman restores and checkpointctl reads as it reads Podman's own; and a
checkpoint archive in the layout CRI-O writes for the kubelet, imported and
given back member for member.

Run by ctest under wl_reaper (restored processes are orphans):
    wl_reaper python3 -m pytest tests/integration/test_podman.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
directory of the workloads. Needs root, /dev/fuse, CRIU, Podman, runc and
busybox-static; the tests are skipped, saying why, where one is missing.
The checkpointctl tests also need checkpointctl (1.3.0, Debian 13's, which
`tools/setup --test` installs): without it they fail, saying so.
"""

import datetime
import errno
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import types

import pytest

from gpuckpt_testing.filetools import read, tree_differences
from gpuckpt_testing.mount import ctl, why_not_runnable
from gpuckpt_testing.podman import IMAGE, Podman, last_count, why_podman_cannot_run
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


# checkpointctl (checkpoint-restore/checkpointctl) reads container checkpoint
# archives: `show` tabulates them, `inspect` draws each as a tree (or JSON),
# `list` tabulates a kubelet's checkpoint directory. The tests use the
# tables and trees of 1.3.0, which tools/setup --test installs.

def checkpointctl(*args, check=True):
    """`checkpointctl ARGS`, its completed process. Fails the test where
    checkpointctl is missing, saying where it comes from, and (`check`)
    where it fails."""
    if shutil.which("checkpointctl") is None:
        pytest.fail("no checkpointctl on PATH: tools/setup --test installs it "
                    "(Debian 13's checkpointctl 1.3.0, run on Debian 13's own libc)")
    r = subprocess.run(["checkpointctl", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, f"checkpointctl {' '.join(args)}: {r.stderr.strip()}"
    return r


def without_source(out):
    """checkpointctl's output without the lines that name what it read."""
    return "\n".join(line for line in out.splitlines()
                     if not line.startswith(("Displaying container checkpoint",
                                             "Listing checkpoints in path")))


def table(out):
    """The rows of the table in checkpointctl's output, each a dict from its
    column's header to its cell."""
    cells = [[c.strip() for c in line.strip("|").split("|")]
             for line in out.splitlines() if line.startswith("|")]
    assert cells, out
    return [dict(zip(cells[0], row)) for row in cells[1:]]


def tree_view(out):
    """An `inspect --ps-tree-cmd` tree: its lines but the processes', and
    its processes, pid -> (parent's pid or None, command line). checkpointctl
    draws a process's children in any order (go-crit keeps them in a map),
    so only what they are can be compared, not their order."""
    lines, procs, parents = [], {}, []
    for line in without_source(out).splitlines():
        start = line.find("[")
        pid, _, cmdline = line[start + 1:].partition("]")
        if start < 0 or not pid.isdigit():
            lines.append(line)
            continue
        # A child is drawn right of its parent.
        while parents and parents[-1][0] >= start:
            parents.pop()
        procs[int(pid)] = (parents[-1][1] if parents else None, cmdline.strip())
        parents.append((start, int(pid)))
    return lines, procs


def in_order(node):
    """checkpointctl's JSON with its lists per process (children, open
    files, sockets) in the order of their pids: checkpointctl gives them in
    any order."""
    if isinstance(node, list):
        return [in_order(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: in_order(v) for k, v in node.items()}
    for key in ("children", "file_descriptors", "sockets"):
        if isinstance(out.get(key), list):
            out[key] = sorted(out[key], key=lambda x: x.get("pid", 0))
    return out


def archive_entries(path):
    """Each member of the tar at `path` but manifest.json: name -> (type,
    mode, size)."""
    with tarfile.open(path) as t:
        return {m.name.rstrip("/"): (m.type, m.mode, m.size) for m in t.getmembers()
                if m.name != "manifest.json"}


TREE_SCRIPT = "echo ready >/tmp/ready; sleep 100000 & sleep 100001 & wait"


@pytest.fixture(scope="module")
def tree_export(podman, tmp_path_factory):
    """A container of three processes (its init, `sh`, and two `sleep`s)
    that has written a file into its root filesystem, exported by `podman
    container checkpoint --export --leave-running --keep` (which leaves
    CRIU's log of the dump in the container's directory): the archive and
    its extracted tree, CRIU's log, the container's id. The container runs
    on until the module's tests are done, so the host files its spec binds
    stay there."""
    name = "tree"
    podman.run("run", "-d", "--name", name, "--network", "none", IMAGE, "sh", "-c", TREE_SCRIPT)
    try:
        pid = int(podman.run("inspect", "-f", "{{.State.Pid}}", name))
        wait_for(lambda: len(read(f"/proc/{pid}/task/{pid}/children").split()) == 2, 30,
                 "the container's two sleeps")
        work = tmp_path_factory.mktemp("tree")
        archive = str(work / "tree.tar")
        podman.run("container", "checkpoint", "--export", archive, "--compress", "none",
                   "--leave-running", "--keep", name)
        dump_log = str(work / "dump.log")
        static_dir = podman.run("inspect", "-f", "{{.StaticDir}}", name)
        shutil.copy(os.path.join(static_dir, "dump.log"), dump_log)
        yield types.SimpleNamespace(
            id=podman.run("inspect", "-f", "{{.Id}}", name), archive=archive,
            extracted=extract(archive, str(work / "extracted")), dump_log=dump_log)
    finally:
        podman.run("rm", "-f", "-t", "0", name, check=False)


def test_checkpointctl_reads_the_mounts_archive_as_podmans(mount, tree_export):
    """checkpointctl says of archives/<id>.tar of an imported Podman export
    what it says of Podman's own archive: the container, its engine, image,
    id and checkpoint size (`show`), its process tree with each process's
    command line (`inspect --ps-tree-cmd`), and all `inspect --all` finds in
    the images (open files, sockets, mounts, environment, CRIU's
    statistics)."""
    ctl(mount.path("ctl"), f"import {tree_export.archive} tree")
    ours, podmans = mount.path("archives", "tree.tar"), tree_export.archive

    shown = checkpointctl("show", ours).stdout
    [row] = table(shown)
    assert (row["CONTAINER"], row["ENGINE"], row["IMAGE"], row["ID"], row["RUNTIME"]) == (
        "tree", "Podman", IMAGE, tree_export.id[:12], "runc"), shown
    assert row["CHKPT SIZE"].endswith("KiB"), shown
    assert without_source(shown) == without_source(checkpointctl("show", podmans).stdout)

    inspected = checkpointctl("inspect", "--ps-tree-cmd", ours).stdout
    lines, procs = tree_view(inspected)
    assert procs.pop(1) == (None, f"sh -c {TREE_SCRIPT}"), inspected
    assert sorted(procs.values()) == [(1, "sleep 100000"), (1, "sleep 100001")], inspected
    assert "├── Engine: Podman" in lines and "├── Image: " + IMAGE in lines, inspected
    assert tree_view(inspected) == tree_view(
        checkpointctl("inspect", "--ps-tree-cmd", podmans).stdout)

    everything = in_order(json.loads(
        checkpointctl("inspect", "--all", "--format", "json", ours).stdout))
    assert everything == in_order(json.loads(
        checkpointctl("inspect", "--all", "--format", "json", podmans).stdout))
    [node] = everything
    images = os.path.join(tree_export.extracted, "checkpoint")
    assert node["checkpoint_size"]["total_size"] == sum(
        os.path.getsize(os.path.join(images, n)) for n in os.listdir(images))
    assert node["process_tree"]["command"] == "sh"
    assert sorted(c["cmdline"].strip() for c in node["process_tree"]["children"]) == [
        "sleep 100000", "sleep 100001"]


def test_checkpointctl_refuses_the_archive_of_a_process_checkpoint(mount):
    """The archive of a checkpoint made through `<pid>/ctl` holds CRIU's
    images under checkpoint/ but no config.dump or spec.dump, which
    checkpointctl reads before anything else: it refuses it, naming
    config.dump (docs/gpuckptfs.md, "Archives out")."""
    wl = mount.start("wl_memory", "--mib", "4")
    ckpt = mount.checkpoint_named(wl.pid, "plain")
    tar_path = mount.path("archives", os.path.basename(ckpt) + ".tar")
    assert "checkpoint" in tar_members(tar_path)
    for command in (["show"], ["inspect", "--ps-tree"]):
        r = checkpointctl(*command, tar_path, check=False)
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert "config.dump: no such file or directory" in r.stderr, (command, r.stderr)


CRIO_IMAGE = "docker.io/library/busybox:1.36"
CRIO_IP = "10.85.0.12"


def crio_checkpoint_archive(export, directory, pod, namespace, container, when):
    """A checkpoint archive as CRI-O writes it when the kubelet's checkpoint
    API (POST /checkpoint/NAMESPACE/POD/CONTAINER) asks, named as the
    kubelet names it in /var/lib/kubelet/checkpoints:
    DIRECTORY/checkpoint-POD_NAMESPACE-CONTAINER-TIMESTAMP.tar. Its members,
    in CRI-O's order (cri-o/cri-o, internal/lib/checkpoint.go):

      stats-dump, dump.log  CRIU's statistics and log of the dump
      checkpoint/           CRIU's images
      config.dump           CRI-O's container config (checkpointctl's
                            lib/metadata.go, ContainerConfig): id, the
                            kubelet's name of the container, image, runtime,
                            when it was made and checkpointed
      spec.dump             the container's OCI runtime spec, with the
                            annotations CRI-O gives a container (cri-o's
                            internal/factory/container/container.go):
                            io.container.manager=cri-o, the
                            io.kubernetes.cri-o.* keys, and the kubelet's
                            labels and annotations (io.kubernetes.pod.name,
                            .pod.namespace, .container.name, ...)
      bind.mounts           the spec's bind mounts outside the engine's own,
                            each with its file type and permissions
      rootfs-diff.tar       what the container changed in its root
                            filesystem
      io.kubernetes.cri-o.LogPath
                            the container's log, in the CRI's log format,
                            under the name of the annotation that gave its
                            path

    What only CRI-O and the kubelet make (ids, names, the image, the pod,
    the log) is made up here in their forms; the rest comes from `export`,
    a real Podman export of a running container: CRIU's images, statistics
    and log, the OCI spec and the root filesystem diff."""
    src = export.extracted
    with open(os.path.join(src, "spec.dump")) as f:
        spec = json.load(f)
    with open(os.path.join(src, "config.dump")) as f:
        created = json.load(f)["createdTime"]

    def hex_id(what):
        return hashlib.sha256(f"{what}/{namespace}/{pod}/{container}".encode()).hexdigest()

    ctr_id, sandbox_id, image_id = hex_id("container"), hex_id("sandbox"), hex_id("image")
    pod_uid = "3f1c2b7e-8a4d-4c55-9e0b-6d2f1a9c7e21"
    kube_name = f"k8s_{container}_{pod}_{namespace}_{pod_uid}_0"
    labels = {"io.kubernetes.container.name": container, "io.kubernetes.pod.name": pod,
              "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.uid": pod_uid}
    kube_annotations = {"io.kubernetes.container.hash": "5e4b9a1d",
                        "io.kubernetes.container.restartCount": "0",
                        "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                        "io.kubernetes.container.terminationMessagePolicy": "File",
                        "io.kubernetes.pod.terminationGracePeriod": "30"}
    crio = "io.kubernetes.cri-o."
    spec["annotations"] = {
        "io.container.manager": "cri-o",
        crio + "Annotations": json.dumps(kube_annotations),
        crio + "ContainerID": ctr_id,
        crio + "ContainerType": "container",
        crio + "Created": created,
        crio + "IP.0": CRIO_IP,
        crio + "Image": CRIO_IMAGE,
        crio + "ImageName": CRIO_IMAGE,
        crio + "ImageRef": image_id,
        crio + "Labels": json.dumps(labels),
        crio + "LogPath": f"/var/log/pods/{namespace}_{pod}_{pod_uid}/{container}/0.log",
        crio + "Metadata": json.dumps({"name": container}),
        crio + "MountPoint": f"/var/lib/containers/storage/overlay/{ctr_id}/merged",
        crio + "Name": kube_name,
        crio + "ResolvPath": f"/run/containers/storage/overlay-containers/{sandbox_id}"
                             "/userdata/resolv.conf",
        crio + "SandboxID": sandbox_id,
        crio + "SandboxName": f"k8s_{pod}_{namespace}_{pod_uid}_0",
        crio + "SeccompProfilePath": "",
        crio + "Stdin": "false",
        crio + "StdinOnce": "false",
        crio + "TTY": "false",
        crio + "Volumes": "[]",
        **kube_annotations,
        **labels,
    }
    config = {"id": ctr_id, "name": kube_name, "rootfsImage": CRIO_IMAGE,
              "rootfsImageRef": image_id, "rootfsImageName": CRIO_IMAGE, "runtime": "runc",
              "createdTime": created, "checkpointedTime": when.isoformat().replace("+00:00", "Z"),
              "restoredTime": "0001-01-01T00:00:00Z", "restored": False}
    engine_own = {"/dev", "/dev/shm", "/proc", "/run", "/run/.containerenv", "/run/secrets",
                  "/sys"}
    binds = []
    for m in spec["mounts"]:
        if m["type"] == "bind" and m["destination"] not in engine_own:
            mode = os.stat(m["source"]).st_mode
            binds.append({"source": m["source"], "destination": m["destination"],
                          "file_type": "directory" if stat.S_ISDIR(mode) else "file",
                          "permissions": stat.S_IMODE(mode)})
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    log = "".join(f"{stamp[:-1]}.{i:09d}Z stdout F line {i}\n" for i in range(3))
    path = os.path.join(directory, f"checkpoint-{pod}_{namespace}-{container}-{stamp}.tar")

    def add(t, name, data=None, src=None, mode=0o600):
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = mode, int(when.timestamp())
        if src is not None:
            info.mode = stat.S_IMODE(os.stat(src).st_mode)
            with open(src, "rb") as f:
                data = f.read()
        if data is None:
            info.type = tarfile.DIRTYPE
            t.addfile(info)
        else:
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        add(t, "stats-dump", src=os.path.join(src, "stats-dump"))
        add(t, "dump.log", src=export.dump_log)
        add(t, "checkpoint", mode=0o700)
        for name in sorted(os.listdir(os.path.join(src, "checkpoint"))):
            add(t, "checkpoint/" + name, src=os.path.join(src, "checkpoint", name))
        add(t, "config.dump", json.dumps(config, indent=4).encode())
        add(t, "spec.dump", json.dumps(spec, indent=4).encode())
        add(t, "bind.mounts", json.dumps(binds, indent=4).encode())
        add(t, "rootfs-diff.tar", src=os.path.join(src, "rootfs-diff.tar"))
        add(t, crio + "LogPath", log.encode(), mode=0o640)
    return path


def test_crio_checkpoint_archive_imported_and_given_back(mount, tree_export, tmp_path):
    """A checkpoint archive in the layout CRI-O writes for the kubelet
    (crio_checkpoint_archive) goes into the store under its file's name
    and comes back out of archives/<id>.tar with the same members, modes
    and bytes (gpuckpt's manifest.json added first); checkpointctl reads
    both as CRI-O's checkpoint of the same container of the same pod.

    There is no CRI-O or Kubernetes here: the archive is CRI-O's layout
    around a Podman export's real CRIU images, and neither it nor the copy
    given back is restored as a container. That is CRI-O's to do (the
    kubelet creates a container whose image is the archive), and the
    mount's own `restore` refuses container archives."""
    kubelet = tmp_path / "var" / "lib" / "kubelet" / "checkpoints"
    kubelet.mkdir(parents=True)
    pod, namespace, container = "web-5d8f7c9b4-q7x2m", "shop", "app"
    when = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    archive = crio_checkpoint_archive(tree_export, str(kubelet), pod, namespace, container, when)
    assert tar_members(archive)[:3] == ["stats-dump", "dump.log", "checkpoint"]

    # Named after its file, without .tar; the ':'s of the kubelet's
    # timestamp, which a checkpoint's name cannot hold, become '_'.
    ctl(mount.path("ctl"), f"import {archive}")
    ckpt_id = os.path.basename(archive)[:-len(".tar")].replace(":", "_")
    assert mount.ids() == [ckpt_id]
    with tarfile.open(archive) as t:
        config = json.load(t.extractfile("config.dump"))
    assert config["name"].startswith(f"k8s_{container}_{pod}_{namespace}_"), config
    assert manifest(mount, ckpt_id)["extra"]["container"] == {
        "id": config["id"], "image": CRIO_IMAGE, "name": config["name"]}
    assert sorted(os.listdir(mount.path("checkpoints", ckpt_id, "container"))) == [
        "bind.mounts", "config.dump", "dump.log", "io.kubernetes.cri-o.LogPath",
        "rootfs-diff.tar", "spec.dump", "stats-dump"]

    # Given back: every member, with its type, mode and size, and its bytes.
    from_mount = mount.path("archives", ckpt_id + ".tar")
    assert tar_members(from_mount)[0] == "manifest.json"
    assert archive_entries(from_mount) == archive_entries(archive)
    assert tree_differences(extract(archive, str(tmp_path / "original")),
                            extract(from_mount, str(tmp_path / "given-back"))) == ["manifest.json"]

    # checkpointctl: CRI-O's container, the same from both.
    shown = checkpointctl("show", from_mount).stdout
    [row] = table(shown)
    assert (row["CONTAINER"], row["ENGINE"], row["IMAGE"], row["IP"], row["RUNTIME"]) == (
        container, "CRI-O", CRIO_IMAGE, CRIO_IP, "runc"), shown
    assert without_source(shown) == without_source(checkpointctl("show", archive).stdout)
    for path in (archive, from_mount):
        meta = checkpointctl("inspect", "--metadata", path).stdout
        assert f"Pod name: {pod}\n" in meta and f"Kubernetes namespace: {namespace}\n" in meta, meta
        assert "Engine: CRI-O" in meta, meta
    tree = checkpointctl("inspect", "--ps-tree-cmd", from_mount).stdout
    assert tree_view(tree)[1][1] == (None, f"sh -c {TREE_SCRIPT}"), tree
    assert tree_view(tree) == tree_view(checkpointctl("inspect", "--ps-tree-cmd", archive).stdout)
    # `list` reads a directory as the kubelet's checkpoints: archives/ of the
    # mount is one, its archive's name starting with "checkpoint-" too.
    listed = []
    for directory in (str(kubelet), mount.path("archives")):
        [row] = table(checkpointctl("list", directory).stdout)
        assert (row["NAMESPACE"], row["POD"], row["CONTAINER"], row["ENGINE"]) == (
            namespace, pod, container, "CRI-O"), row
        listed.append(row)
    assert listed[0]["CHECKPOINT NAME"] == os.path.basename(archive)
    assert listed[1]["CHECKPOINT NAME"] == ckpt_id + ".tar"
    assert listed[0]["TIME CHECKPOINTED"] == listed[1]["TIME CHECKPOINTED"]
