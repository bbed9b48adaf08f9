"""A one-node Ceph cluster for the integration tests, through
tools/micro-ceph: one monitor, manager and OSD as root, every file under
one directory, no authentication, pools of one replica.

    with MicroCeph(tmpdir) as ceph:          # started; stopped on leaving
        ceph.rados("put", "name", "/etc/hostname")
        ceph.stop_osd()                      # the pools stop answering
        ceph.start_osd()                     # they answer again

`store` is "memstore" (the default; starts in a few seconds) or
"bluestore" (a file in the directory). The daemons' logs are in
<dir>/log/, and a failure to start names them.
"""

import os
import subprocess

from gpuckpt_testing.build import REPO_ROOT
from gpuckpt_testing.processes import live_processes
from gpuckpt_testing.script_cluster import ScriptCluster

MICRO_CEPH = os.path.join(REPO_ROOT, "tools", "micro-ceph")
# How long one rados command may wait for the cluster.
RADOS_TIMEOUT_S = 30


def daemons_of(conf):
    """Pids of the live ceph-mon, ceph-mgr and ceph-osd processes started
    with `-c conf`."""
    return live_processes(
        lambda args: len(args) >= 3 and os.path.basename(args[0]).decode(errors="replace") in
        ("ceph-mon", "ceph-mgr", "ceph-osd") and args[1] == b"-c" and args[2] == os.fsencode(conf))


class MicroCeph(ScriptCluster):
    """A cluster started in `dir` at construction; stop() (or leaving the
    `with` block) stops it and leaves `dir`."""

    SCRIPT = MICRO_CEPH

    def __init__(self, dir, store="memstore", pools=("gpuckpt",)):
        self.conf = os.path.join(os.path.abspath(dir), "ceph.conf")
        self.pools = tuple(pools)
        args = ["--store", store]
        for pool in self.pools:
            args += ["--pool", pool]
        super().__init__(dir, *args)

    def stop_osd(self):
        self._run("stop-osd", self.dir)

    def start_osd(self):
        self._run("start-osd", self.dir)

    def set_quota(self, pool, max_bytes):
        self._run("set-quota", self.dir, pool, str(max_bytes))

    def rados(self, *args, pool=None, input=None):
        """`rados -c conf [-p pool] args...`; its stdout (bytes). The pool
        defaults to the first of `pools`."""
        command = ["rados", "-c", self.conf, "-p", pool or self.pools[0],
                   "--rados-osd-op-timeout", str(RADOS_TIMEOUT_S),
                   "--rados-mon-op-timeout", str(RADOS_TIMEOUT_S), *args]
        result = subprocess.run(command, input=input, capture_output=True,
                                timeout=RADOS_TIMEOUT_S + 30, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: exit {result.returncode}: "
                               f"{result.stderr.decode(errors='replace').strip()}")
        return result.stdout

    def daemons(self):
        """Pids of this cluster's live daemons."""
        return daemons_of(self.conf)
