"""tools/micro-slurm and its Python helper (micro_slurm.py): a one-node
cluster started without systemd runs a batch job of an ordinary user; a
job of a three-node cluster runs a task on each of two nodes; a job
of the low partition is preempted by one of the high partition: it gets
SIGTERM, runs on for its grace time, is requeued and runs again once the
node is free, knowing it was restarted (SLURM_RESTART_COUNT). Nothing of
the cluster is left running after stop. Root and Slurm's daemons needed
(tools/setup installs them); skips, saying why, without them.

Run by ctest under wl_reaper: the daemons are orphans once they fork."""

import os
import pathlib
import re
import shutil
import tempfile
import time

import pytest

from gpuckpt_testing.filetools import read
from gpuckpt_testing.micro_slurm import MicroSlurm

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run Slurm's daemons"),
    pytest.mark.skipif(not all(os.path.exists(f"/usr/sbin/{d}")
                               for d in ("slurmctld", "slurmd", "munged"))
                       or shutil.which("sbatch") is None,
                       reason="Slurm is not installed (slurmctld, slurmd, munge, slurm-client: "
                              "tools/setup installs them)"),
]

# A low job that notes each start and the SIGTERM of a preemption, and
# uses its grace time; run again, it ends in a second.
LOW_JOB = """#!/bin/bash
echo "start ${SLURM_RESTART_COUNT:-0}" >> "$1"
trap 'echo "term $(date +%s.%N)" >> "$1"; sleep 60' TERM
steps=600
[[ ${SLURM_RESTART_COUNT:-0} -gt 0 ]] && steps=10
for i in $(seq 1 $steps); do sleep 0.1; done
echo "done" >> "$1"
"""


@pytest.fixture
def open_dir():
    """A directory under /var/tmp that every user may traverse (pytest's
    own are root's alone), removed afterwards."""
    path = tempfile.mkdtemp(prefix="micro-slurm-", dir="/var/tmp")
    os.chmod(path, 0o755)
    try:
        yield pathlib.Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_users_job_runs(open_dir, users):
    a, _ = users
    work = open_dir / "work"
    work.mkdir()
    os.chown(work, a.uid, a.gid)
    with MicroSlurm(open_dir / "cluster") as slurm:
        out = work / "out"
        job = slurm.sbatch(f"--output={out}", "--wrap", "id -u; echo ran", user=a)
        fields = slurm.wait_job(job, lambda j: j["JobState"] == "COMPLETED", what="the job to end")
        assert fields["UserId"].startswith(f"{a.name}(")
        assert read(str(out)).split() == [str(a.uid), "ran"]


def test_a_job_spans_the_nodes_of_a_cluster_of_three(tmp_path):
    with MicroSlurm(tmp_path / "cluster", nodes=3, proctrack="cgroup") as slurm:
        assert len(slurm.daemons()) == 5, slurm.daemons()
        out = tmp_path / "out"
        job = slurm.sbatch("--nodes=2", "--ntasks-per-node=1", f"--output={out}", "--wrap",
                           "srun sh -c 'echo $SLURM_PROCID $SLURMD_NODENAME "
                           "$(tr \"\\n\" \" \" < /proc/self/cgroup)'")
        fields = slurm.wait_job(job, lambda j: j["JobState"] == "COMPLETED",
                                what="the job to end")
        assert fields["NodeList"] == "node[1-2]", fields
        lines = sorted(read(str(out)).splitlines())
        assert [line.split()[:2] for line in lines] == [["0", "node1"], ["1", "node2"]], lines
        # Each node's slurmd has cgroups of its own (v1: slurm_NODE/,
        # v2: NODE_slurmstepd.scope/).
        for node, line in zip(("node1", "node2"), lines):
            assert re.search(rf"(slurm_{node}/|{node}_slurmstepd).*/job_{job}/step_0", line), line
    assert slurm.daemons() == [], "a daemon outlived stop"


def test_a_preempted_job_gets_its_grace_and_runs_again(tmp_path):
    with MicroSlurm(tmp_path / "cluster", grace_time=3) as slurm:
        script = tmp_path / "low.sh"
        script.write_text(LOW_JOB)
        script.chmod(0o755)
        notes = tmp_path / "notes"
        cpus = os.cpu_count()
        low = slurm.sbatch("--partition=low", f"--cpus-per-task={cpus}", "--requeue",
                           f"--output={tmp_path}/low.out", str(script), str(notes))
        slurm.wait_job(low, lambda j: j["JobState"] == "RUNNING", what="the low job to run")
        time.sleep(0.5)  # its trap is set
        high = slurm.sbatch("--partition=high", f"--cpus-per-task={cpus}",
                            f"--output={tmp_path}/high.out", "--wrap", "sleep 2")
        slurm.wait_job(high, lambda j: j["JobState"] == "RUNNING", what="the high job to run")
        lines = read(str(notes)).splitlines()
        assert lines[0] == "start 0" and lines[1].startswith("term "), lines
        fields = slurm.wait_job(low, lambda j: j["Restarts"] == "1" and j["JobState"] == "RUNNING",
                                what="the preempted job to run again")
        assert fields["Requeue"] == "1"
        slurm.wait_job(low, lambda j: j["JobState"] == "COMPLETED", what="the low job to end")
        lines = read(str(notes)).splitlines()
        assert lines[2:] == ["start 1", "done"], lines
        assert len(slurm.daemons()) == 3, slurm.daemons()
    assert slurm.daemons() == [], "a daemon outlived stop"
