"""CRIU's image tool crit (installed by tools/install-criu with Debian's
python3-protobuf) reads a checkpoint's images in the mount as they are:
a workload checkpointed through `ctl`, then `crit show` of its pstree.img
must decode the workload's pid, and `crit x DIR ps` of its images
directory must list it with its command. The manifest there names the
gpuckpt that wrote it (`written_by`, as --version says). Real mount, real
CRIU; skips, saying why, without root, FUSE, CRIU or crit.
"""

import json
import os
import shutil
import subprocess

import pytest

from gpuckpt_testing.build import GPUCKPTFS
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import ctl, status_line, why_not_runnable

CRIT = shutil.which("crit") or "/usr/local/bin/crit"


def why_not():
    reason = why_not_runnable()
    if reason is None and not os.access(CRIT, os.X_OK):
        reason = f"no crit at {CRIT}: tools/install-criu installs it"
    return reason


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def crit(*args):
    r = subprocess.run([CRIT, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"crit {' '.join(args)}: exit {r.returncode}: {r.stderr}"
    return r.stdout


def test_crit_reads_a_checkpoint_in_the_mount(mount):
    wl = mount.start("wl_memory", "--mib", "8")
    ctl(mount.path(str(wl.pid), "ctl"), "checkpoint")
    assert status_line(mount.mnt, wl.pid, "last").startswith(f"checkpoint {wl.pid}-1 ok")
    checkpoint = mount.path("checkpoints", f"{wl.pid}-1")
    images = os.path.join(checkpoint, "images")

    # crit show: the image decoded, as JSON; the tree's root is the workload.
    shown = json.loads(crit("show", os.path.join(images, "pstree.img")))
    assert shown["magic"] == "PSTREE"
    assert [e["pid"] for e in shown["entries"]] == [wl.pid]

    # crit x DIR ps: the process list of the whole images directory.
    rows = [line.split() for line in crit("x", images, "ps").splitlines()]
    assert rows[0][:2] == ["PID", "PGID"], rows
    listed = {int(r[0]): r[-1] for r in rows[1:]}
    assert listed.get(wl.pid) == "wl_memory", f"pid {wl.pid} not listed as wl_memory: {rows}"

    # The manifest names the gpuckpt that wrote it, as its --version does.
    version = subprocess.run([GPUCKPTFS, "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    manifest = json.loads(read(os.path.join(checkpoint, "manifest.json")))
    assert "gpuckpt " + version.split(" ", 1)[1] == manifest["written_by"]
    assert wl.verdict() == "PASS"
