"""A store whose index is damaged (bytes flipped in the RocksDB tables under
db/) is never shown as a store by the commands that only read it: `gpuckpt
ls`, `ls --json`, `stats` and `fsck` exit non-zero and name the damaged
tables, never "0 checkpoints" or "clean"; the commands that open the store
for writing refuse a table that does not open, as before. A healthy store
lists, counts and checks as it did.

The stores are made with `gpuckpt import` of a small tree; no root, mount
or CRIU needed. Run by ctest under wl_reaper:
    wl_reaper python3 -m pytest tests/integration/test_damaged_store.py
with WORKLOAD_BIN pointing at the build directory.
"""

import json
import os
import shutil
import tempfile

import pytest

from gpuckpt_testing.mount import cli


@pytest.fixture
def store():
    """A store holding snapshots `first` and `second` of a small tree
    (random and text files), closed: its path."""
    work = tempfile.mkdtemp(prefix="gpuckpt-test_damaged_store.", dir="/var/tmp")
    try:
        src = os.path.join(work, "src")
        os.makedirs(os.path.join(src, "sub"))
        with open(os.path.join(src, "pages-1.img"), "wb") as f:
            f.write(os.urandom(1 << 20))
        with open(os.path.join(src, "sub", "notes.txt"), "w", encoding="ascii") as f:
            f.write("a line of text\n" * 20000)
        path = os.path.join(work, "store")
        for name in ("first", "second"):
            r = cli(path, "import", src, "--name", name)
            assert r.returncode == 0, r.stderr
        yield path
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tables(store_dir):
    """The store's RocksDB tables, newest first: names as messages give
    them ("db/000012.sst") and their paths."""
    names = sorted((n for n in os.listdir(os.path.join(store_dir, "db")) if n.endswith(".sst")),
                   reverse=True)
    return [(f"db/{n}", os.path.join(store_dir, "db", n)) for n in names]


def flip(path, *offsets):
    """Inverts the bytes at `offsets` of `path` (from the end when negative)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for offset in offsets:
            f.seek(offset % size)
            b = f.read(1)[0]
            f.seek(offset % size)
            f.write(bytes([b ^ 0xFF]))


def assert_refused(store_dir, damaged):
    """ls, ls --json, stats and stats --json exit 1 printing nothing on
    stdout and saying on stderr that the store is damaged and which tables;
    fsck exits 3 listing the damage, and says nowhere "clean"."""
    for args in (["ls"], ["ls", "--json"], ["stats"], ["stats", "--json"]):
        r = cli(store_dir, *args)
        assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
        assert r.stdout == "", (args, r.stdout)
        assert "is damaged" in r.stderr, (args, r.stderr)
        for name in damaged:
            assert name in r.stderr, (args, name, r.stderr)
    r = cli(store_dir, "fsck")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "is damaged" in r.stdout, r.stdout
    for name in damaged:
        assert name in r.stdout, (name, r.stdout)
    assert "clean" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_healthy_store_is_listed_counted_and_clean(store):
    r = cli(store, "ls")
    assert r.returncode == 0, r.stderr
    assert "first" in r.stdout and "second" in r.stdout, r.stdout
    r = cli(store, "ls", "--json")
    assert r.returncode == 0, r.stderr
    assert [s["id"] for s in json.loads(r.stdout)] == ["first", "second"]
    r = cli(store, "stats", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["snapshot_count"] == 2
    r = cli(store, "fsck")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "clean" in r.stderr, r.stderr


def test_bytes_flipped_in_three_tables_are_named_by_every_read_command(store):
    damaged = tables(store)[:3]
    for _, path in damaged:
        size = os.path.getsize(path)
        flip(path, size // 4, size // 2)
    assert_refused(store, [name for name, _ in damaged])


def test_a_table_that_does_not_open_is_refused_by_readers_and_writers(store):
    # The newest table's last block before its footer (its metaindex): the
    # table does not open. RocksDB's reader beside a daemon would take it as
    # missing and show the index as it was before it.
    name, path = tables(store)[0]
    flip(path, -60)
    assert_refused(store, [name])
    # The commands that open the store for writing refuse it as before.
    for args in (["gc"], ["rm", "first"]):
        r = cli(store, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "Corruption" in r.stderr, (args, r.stderr)
