"""A checkpoint into a store whose disk fills up, through a real mount.

The store lies on a 200 MiB tmpfs, and a process holding a deleted file of
300 MiB of incompressible bytes open (wl_ghost) is checkpointed into it:
CRIU stores the file's bytes, which are no process's memory, so the check
made before anything is frozen (the tree's memory against the disk's free
space: a process whose memory alone exceeds it is refused at once, see
test_checkpoint_room.py) lets it start. The checkpoint must fail with
ENOSPC and say so in the process's `last:` status line ("no space left on
the store's disk", not CRIU's "Broken pipe"), the process must run on, and
on the still full disk `rm -r` of a checkpoint and `gc` must work and give
the space back (also the space the failed checkpoint took). Once the
filesystem has room again the next checkpoint succeeds, with nothing
restarted, and restores.

Run by ctest under wl_reaper, like the other pytest tests (gpuckpt_testing.mount).
Needs root (for the tmpfs too), /dev/fuse and CRIU; skipped, saying why,
where one of them is missing.
"""

import errno
import os
import shutil
import subprocess

import pytest

from gpuckpt_testing.filetools import free_bytes, used_bytes
from gpuckpt_testing.mount import Mount, ctl, small_tmpfs, status_line, why_not_runnable

DISK_MIB = 200
SMALL_MIB = 32
BIG_MIB = 300

pytestmark = pytest.mark.skipif(
    (why_not_runnable("wl_big") or why_not_runnable("wl_ghost")) is not None,
    reason=str(why_not_runnable("wl_big") or why_not_runnable("wl_ghost")))


@pytest.fixture
def small_disk():
    with small_tmpfs("gpuckpt-disk-full.", DISK_MIB) as disk:
        yield disk


# Both ways a checkpoint's bytes reach the disk: chunked as they come
# (never), and spooled raw (always; the default on few cores).
@pytest.fixture(params=["never", "always"])
def mount(small_disk, request):
    m = Mount("gpuckpt-disk-full-test.", "--spool", request.param,
              store=os.path.join(small_disk, "store"))
    try:
        yield m, small_disk, request.param
    finally:
        m.close()


def test_full_store_disk_fails_the_checkpoint_cleanly_and_recovers(mount):
    m, disk, spool = mount
    mnt = m.mnt
    small = m.start("wl_big", "--mib", str(SMALL_MIB))
    ctl(f"{mnt}/{small.pid}/ctl", "checkpoint")
    small_ckpt = os.path.join(mnt, "checkpoints", f"{small.pid}-1")
    assert os.path.isdir(small_ckpt)
    used_with_small = used_bytes(disk)
    spool_dir = os.path.join(m.store, "spool")
    # The small one's, while the store settles it.
    spooled_before = set(os.listdir(spool_dir)) if os.path.isdir(spool_dir) else set()

    big = m.start("wl_ghost", "--mib", str(BIG_MIB))
    with pytest.raises(OSError) as failure:
        ctl(f"{mnt}/{big.pid}/ctl", "checkpoint")
    assert failure.value.errno == errno.ENOSPC, failure.value
    last = status_line(mnt, big.pid, "last")
    assert "no space left on the store's disk" in last, last
    assert "Broken pipe" not in last, last
    assert big.alive(), "a failed checkpoint must leave the process running"
    if spool == "never":
        # What the failed checkpoint wrote stays in the packs until gc.
        assert free_bytes(disk) < (16 << 20), "the disk should be (nearly) full"
    else:
        # Its spool files go at once: nothing is left of it.
        left = set(os.listdir(spool_dir)) - spooled_before
        assert left == set(), f"spool files left by the failed checkpoint: {sorted(left)}"
        # (The small one's settling, given up when the big one began, may
        # have left up to its size in the packs until gc.)
        assert used_bytes(disk) < used_with_small + (SMALL_MIB << 20), (
            f"{used_bytes(disk)} bytes used after the failure, {used_with_small} before it")
    assert not os.path.exists(os.path.join(mnt, "checkpoints", f"{big.pid}-1"))

    # On the still full disk: rm -r of a checkpoint and gc work, and give
    # back its space and what the failed checkpoint left in the packs.
    shutil.rmtree(small_ckpt)
    assert not os.path.exists(small_ckpt)
    ctl(os.path.join(mnt, "ctl"), "gc")
    assert used_bytes(disk) < used_with_small - (SMALL_MIB << 20) // 2, (
        f"{used_bytes(disk)} bytes still used, {used_with_small} with the first checkpoint alone")

    # Space is back (the filesystem grows): the next checkpoint succeeds,
    # nothing restarted, and restores byte for byte.
    subprocess.run(["mount", "-o", f"remount,size={2 * DISK_MIB}m", disk], check=True)
    ctl(f"{mnt}/{big.pid}/ctl", "checkpoint")
    ckpt = os.path.join(mnt, "checkpoints", f"{big.pid}-1")
    assert os.path.isdir(ckpt)
    assert " ok " in status_line(mnt, big.pid, "last") + " "
    big.kill()
    m.restore(ckpt, big.pid)
    assert big.verdict() == "PASS"
