"""Checkpoints on a schedule and retention, through the mount: `checkpoint
--every` by an ordinary user takes one now and then one every interval,
each followed by the rule it was given (named checkpoints kept), shown in
status and status.json, ended by `--every off` and by the process's end;
the daemon's own rule (--keep-last) where a checkpoint gives none; the
owner rule (--owner-keep-last) over all of a user's processes.

Run by ctest under wl_reaper; needs root, /dev/fuse and CRIU (skipped,
saying why, where one is missing)."""

import json
import os
import re
import time

import pytest

from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import Mount, listdir_as, why_not_runnable
from gpuckpt_testing.processes import wait_for
from gpuckpt_testing.users import Root

pytestmark = pytest.mark.skipif(why_not_runnable("wl_memory") is not None,
                                reason=str(why_not_runnable("wl_memory")))


def status_json(mount, pid, user):
    ok, text = user.read(mount.path(str(pid), "status.json"))
    assert ok, text
    return json.loads(text)


def numbered(mount, pid, user):
    """The process's checkpoints listed under <pid>/checkpoints/ (their
    numbers), without `latest`."""
    return [n for n in listdir_as(user, mount.path(str(pid), "checkpoints")) if n != "latest"]


def test_every_with_keep_last_through_the_mount(mount, users):
    a, _ = users
    wl = mount.start("wl_memory", user=a)
    ctl = mount.path(str(wl.pid), "ctl")
    named = mount.checkpoint_named(wl.pid, "before-schedule", user=a)
    ok, err = a.write(ctl, "checkpoint --every 1s --keep-last 2")
    assert ok, f"{err}: {mount.last(wl.pid)}"
    doc = status_json(mount, wl.pid, a)
    assert doc["schedule"]["every_s"] == 1, doc["schedule"]
    assert doc["retention"] == {"keep_last": 2, "keep_within_s": None}, doc["retention"]
    ok, text = a.read(mount.path(str(wl.pid), "status"))
    assert re.search(r"^schedule: every 1s, next in \d+ s \(\d+ run, 0 failed\)$", text, re.M), text
    assert re.search(r"^retention: keep last 2$", text, re.M), text

    wait_for(lambda: status_json(mount, wl.pid, a)["schedule"]["runs"] >= 3, 60,
             "three scheduled checkpoints")
    assert status_json(mount, wl.pid, a)["schedule"]["failures"] == 0, mount.last(wl.pid)

    ok, err = a.write(ctl, "checkpoint --every off")
    assert ok, f"{err}: {mount.last(wl.pid)}"
    assert status_json(mount, wl.pid, a)["schedule"] is None
    # A checkpoint under way when it stopped still ends (its rule applied
    # after it): then nothing more.
    time.sleep(1.5)
    ids = mount.ids(a)
    time.sleep(2.5)
    assert mount.ids(a) == ids, "checkpointed after --every off"
    # Of at least four, the newest two of the series are left, and the
    # named one.
    series = sorted((i for i in ids if re.fullmatch(rf"{wl.pid}-\d+", i)),
                    key=lambda i: int(i.split("-")[1]))
    assert len(series) == 2 and int(series[1].split("-")[1]) >= 4, ids
    assert os.path.basename(named) in ids, f"the named checkpoint went: {ids}"
    # <pid>/checkpoints lists what is left; latest is the newest.
    assert len(numbered(mount, wl.pid, a)) == 3, numbered(mount, wl.pid, a)
    latest = os.path.basename(os.path.realpath(mount.path(str(wl.pid), "checkpoints", "latest")))
    assert latest == series[1], (latest, series)
    wl.assert_passes("after its scheduled checkpoints")


def test_a_schedule_ends_with_its_process(mount, users):
    a, _ = users
    wl = mount.start("wl_memory", user=a)
    ok, err = a.write(mount.path(str(wl.pid), "ctl"), "checkpoint --every 1s")
    assert ok, f"{err}: {mount.last(wl.pid)}"
    wl.kill()
    log = os.path.join(mount.state_dir, "gpuckptfs.log")
    wait_for(lambda: f"schedule pid={wl.pid} result=ended" in read(log), 30,
             "the schedule to end with its process")
    made = mount.ids(a)
    time.sleep(2.5)
    assert mount.ids(a) == made


@pytest.fixture
def keeping_one(request):
    m = Mount("gpuckpt-schedule-keep.", "--keep-last", "1")
    try:
        yield m
    finally:
        m.close()


def test_the_daemons_keep_last(keeping_one, users):
    m = keeping_one
    a, _ = users
    wl = m.start("wl_memory", user=a)
    first = m.checkpoint(wl.pid, user=a)
    second = m.checkpoint(wl.pid, user=a)
    assert m.ids(a) == [second], (first, second, m.ids(a))
    ok, text = a.read(m.path(str(wl.pid), "status"))
    assert re.search(r"^retention: keep last 1$", text, re.M), text
    # A checkpoint's own rule wins over the daemon's.
    ok, err = a.write(m.path(str(wl.pid), "ctl"), "checkpoint --keep-last 2")
    assert ok, f"{err}: {m.last(wl.pid)}"
    assert len(m.ids(a)) == 2, m.ids(a)


@pytest.fixture
def owner_keeping_two(request):
    m = Mount("gpuckpt-schedule-owner.", "--owner-keep-last", "2")
    try:
        yield m
    finally:
        m.close()


def test_the_owner_rule_bounds_a_users_checkpoints_across_processes(owner_keeping_two, users):
    """--owner-keep-last 2: of all of a user's checkpoints, of both their
    processes, the newest 2 stay (and a named one); another user's are
    not theirs to count; a checkpoint's own --owner-keep-last wins."""
    m = owner_keeping_two
    a, b = users
    first, second = m.start("wl_memory", user=a), m.start("wl_memory", user=a)
    others = m.start("wl_memory", user=b)
    theirs = [m.checkpoint(others.pid, user=b) for _ in range(3)]
    m.checkpoint(first.pid, "--name kept", user=a)
    named, = [i for i in m.ids(a) if not re.fullmatch(r"\d+-\d+", i)]
    made = [m.checkpoint(first.pid, user=a), m.checkpoint(first.pid, user=a),
            m.checkpoint(second.pid, user=a)]
    assert sorted(m.ids(a)) == sorted([named] + made[1:]), (made, m.ids(a))
    assert sorted(m.ids(b)) == sorted(theirs[1:]), (theirs, m.ids(b))
    ok, text = a.read(m.path(str(first.pid), "status"))
    assert ok and re.search(r"^owner_retention: keep last 2$", text, re.M), text
    doc = status_json(m, first.pid, a)
    assert doc["owner_retention"] == {"keep_last": 2, "keep_within_s": None}, doc
    assert doc["retention"] is None, doc
    ok, err = a.write(m.path(str(second.pid), "ctl"), "checkpoint --owner-keep-last 1")
    assert ok, f"{err}: {m.last(second.pid)}"
    assert len(m.ids(a)) == 2 and named in m.ids(a), m.ids(a)
    assert sorted(m.ids(b)) == sorted(theirs[1:]), m.ids(b)


def test_roots_schedule_of_a_users_process_is_the_users_and_theirs_to_stop(mount, users):
    a, b = users
    wl = mount.start("wl_memory", user=a)
    ctl = mount.path(str(wl.pid), "ctl")
    ok, err = Root().write(ctl, "checkpoint --every 1s --keep-last 1")
    assert ok, f"{err}: {mount.last(wl.pid)}"
    wait_for(lambda: status_json(mount, wl.pid, Root())["schedule"]["runs"] >= 2, 60,
             "two scheduled checkpoints")
    # The checkpoints are the process's owner's: listed to them, not to
    # another user.
    assert any(re.fullmatch(rf"{wl.pid}-\d+", i) for i in mount.ids(a)), mount.ids(a)
    assert not any(i.startswith(f"{wl.pid}-") for i in mount.ids(b)), mount.ids(b)
    # Another user can neither see nor stop it; its owner can.
    ok, err = b.write(ctl, "checkpoint --every off")
    assert not ok and "No such file" in err, err
    assert status_json(mount, wl.pid, a)["schedule"] is not None
    ok, err = a.write(ctl, "checkpoint --every off")
    assert ok, f"{err}: {mount.last(wl.pid)}"
    assert status_json(mount, wl.pid, a)["schedule"] is None
