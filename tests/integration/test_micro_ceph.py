"""tools/micro-ceph and its Python helper (micro_ceph.py): a cluster
started, an object written and read back with the rados CLI, a second
cluster beside the first, the OSD stopped and started again with the data
kept, and nothing of either cluster left running after stop. Root and
Ceph's daemons needed (tools/setup installs them); skips, saying why,
without them."""

import os
import shutil

import pytest

from gpuckpt_testing.micro_ceph import MicroCeph, daemons_of

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run Ceph's daemons"),
    pytest.mark.skipif(shutil.which("ceph-osd") is None or shutil.which("rados") is None,
                       reason="Ceph is not installed (ceph-osd, rados: tools/setup installs them)"),
]


def test_write_read_and_stop(tmp_path):
    payload = os.urandom(100000)
    source = tmp_path / "payload"
    source.write_bytes(payload)
    with MicroCeph(tmp_path / "cluster", pools=("gpuckpt", "other")) as ceph:
        assert len(ceph.daemons()) == 3
        ceph.rados("put", "object", str(source))
        assert ceph.rados("get", "object", "-") == payload
        assert ceph.rados("ls").split() == [b"object"]
        assert ceph.rados("ls", pool="other").split() == []
        conf = ceph.conf
    assert daemons_of(conf) == []
    assert (tmp_path / "cluster" / "log").is_dir()  # stop leaves the directory


def test_two_clusters_side_by_side_and_an_osd_restart(tmp_path):
    with MicroCeph(tmp_path / "one") as one, MicroCeph(tmp_path / "two") as two:
        one.rados("put", "mine", "-", input=b"one")
        two.rados("put", "mine", "-", input=b"two")
        assert one.rados("get", "mine", "-") == b"one"
        assert two.rados("get", "mine", "-") == b"two"

        one.stop_osd()
        assert len(one.daemons()) == 2
        assert two.rados("get", "mine", "-") == b"two"  # the other is untouched
        one.start_osd()
        assert one.rados("get", "mine", "-") == b"one"  # memstore kept it
    assert one.daemons() == [] and two.daemons() == []


def test_start_failure_says_why_and_leaves_nothing_running(tmp_path, monkeypatch):
    # The monitor and the manager start; then an OSD that cannot be made.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake_osd = fake_bin / "ceph-osd"
    fake_osd.write_text("#!/bin/sh\necho 'no OSD here' >&2\nexit 1\n")
    fake_osd.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    cluster = tmp_path / "cluster"
    with pytest.raises(RuntimeError, match=r"ceph-osd --mkfs failed .*/log/"):
        MicroCeph(cluster)
    assert daemons_of(str(cluster / "ceph.conf")) == []
    assert "no OSD here" in (cluster / "log" / "setup.out").read_text()
