"""A Slurm cluster on this machine for the integration tests, through
tools/micro-slurm: munged, slurmctld and slurmd as root, every file under
one directory; one node, or (nodes=N) N nodes node1..nodeN, each a slurmd
of its own; a low partition whose jobs a high one preempts (requeued,
after SIGTERM, or the job's --signal, and a grace time); processes tracked
by their parents, or (proctrack="cgroup") by Slurm's cgroups; the system's
Slurm, or one unpacked under slurm_root (tools/micro-slurm --slurm-root).

    with MicroSlurm(tmpdir, grace_time=10) as slurm:   # started; stopped on leaving
        job = slurm.sbatch("--partition=low", "job.sh")
        slurm.wait_job(job, lambda j: j["JobState"] == "RUNNING")

The daemons' logs are in <dir>/log/, and a failure to start names them.
"""

import os
import re
import subprocess
import time

from gpuckpt_testing.build import REPO_ROOT
from gpuckpt_testing.processes import live_processes
from gpuckpt_testing.script_cluster import ScriptCluster

MICRO_SLURM = os.path.join(REPO_ROOT, "tools", "micro-slurm")
# How long one Slurm command may take.
CLI_TIMEOUT_S = 30


class MicroSlurm(ScriptCluster):
    """A cluster started in `dir` at construction; stop() (or leaving the
    `with` block) stops it and leaves `dir`."""

    SCRIPT = MICRO_SLURM

    def __init__(self, dir, cpus=None, grace_time=30, plugstack=None, proctrack="linuxproc",
                 slurm_root=None, nodes=None):
        os.makedirs(dir, exist_ok=True)
        self.conf = os.path.join(os.path.abspath(dir), "slurm.conf")
        args = ["--grace-time", str(grace_time), "--proctrack", proctrack]
        if slurm_root is not None:
            args += ["--slurm-root", str(slurm_root)]
        if cpus is not None:
            args += ["--cpus", str(cpus)]
        if plugstack is not None:
            args += ["--plugstack", str(plugstack)]
        if nodes is not None:
            args += ["--nodes", str(nodes)]
        super().__init__(dir, *args)

    def daemons(self):
        """Pids of this cluster's live daemons (started with its files)."""
        conf = os.fsencode(self.conf)
        sock = os.fsencode(os.path.join(self.dir, "run", "munge.sock"))
        return live_processes(lambda args: conf in args or any(a.endswith(b"=" + sock)
                                                               for a in args))

    def paths(self):
        """PATH and LD_LIBRARY_PATH of an unpacked Slurm (slurm_root), as
        micro-slurm wrote them to <dir>/env; {} for the system's."""
        try:
            with open(os.path.join(self.dir, "env")) as f:
                found = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        except FileNotFoundError:
            return {}
        return {k: v for k, v in found.items() if k in ("PATH", "LD_LIBRARY_PATH")}

    def env(self):
        return dict(os.environ, SLURM_CONF=self.conf, **self.paths())

    def cli(self, *args, user=None):
        """A Slurm command (sbatch, scontrol, ...) on this cluster: its
        stdout; an error names its stderr."""
        assignments = [f"{k}={v}" for k, v in self.paths().items()]
        argv = list(args) if user is None else [*user.prefix(), "env",
                                                f"SLURM_CONF={self.conf}", *assignments, *args]
        result = subprocess.run(argv, env=self.env(), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {result.returncode}: "
                               f"{result.stderr.strip()}")
        return result.stdout

    def sbatch(self, *args, user=None):
        """Submits a batch job; its id."""
        out = self.cli("sbatch", "--parsable", *args, user=user)
        return int(out.strip().split(";")[0])

    def job(self, job_id):
        """`scontrol show job` of `job_id` as a dict of its KEY=VALUE words."""
        out = self.cli("scontrol", "--oneliner", "show", "job", str(job_id))
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_job(self, job_id, predicate, seconds=120, what="the job"):
        """Waits until predicate(job(job_id)) holds; the job's fields then."""
        deadline = time.monotonic() + seconds
        fields = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if predicate(fields):
                return fields
            time.sleep(0.2)
        raise AssertionError(f"timed out after {seconds} s waiting for {what}: job {job_id} is "
                             f"{fields.get('JobState')} ({fields.get('Reason')})")
