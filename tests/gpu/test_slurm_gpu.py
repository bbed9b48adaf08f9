"""sbatch --gpuckpt with a CUDA job, on the GPU machine: a one-node Slurm
cluster (tools/micro-slurm, with Debian's Slurm from the bundle: the GPU
machine has none) runs gpu_memory as a batch job; a job of the high
partition preempts it; it is checkpointed on its --signal with its device
memory, requeued and restored, and its GPU memory then checks out (PASS)
and the job completes. Processes are tracked with proctrack/cgroup where
Slurm can use this machine's cgroups, else proctrack/linuxproc (said in
the output). As root; prints what the checkpoint and the restore took.

    GPUCKPT_GPU_REQUIRED=1 python3 -m pytest -s -rs tests/gpu/test_slurm_gpu.py
"""

import os
import re
import shutil
import signal
import tempfile
import time

import pytest

from gpuckpt_testing import gpu_host
from gpuckpt_testing.filetools import read_text
from gpuckpt_testing.micro_slurm import MicroSlurm
from gpuckpt_testing.processes import wait_for

pytestmark = gpu_host.skip_unless_runnable(1)

GIB = 2


def slurm_root(bundle):
    root = os.path.join(bundle.root, "slurm")
    if not os.path.isdir(root):
        pytest.skip("the bundle has no Slurm (made before tests/gpu/prepare packed one)")
    for sub in ("sbin", "bin"):
        for name in os.listdir(os.path.join(root, sub)):
            os.chmod(os.path.join(root, sub, name), 0o755)
    return root


def start_cluster(dir, plugstack, root):
    """With proctrack/cgroup where Slurm can use this machine's cgroups."""
    try:
        return MicroSlurm(os.path.join(dir, "cgroup"), cpus=4, grace_time=60,
                          plugstack=plugstack, proctrack="cgroup", slurm_root=root), "cgroup"
    except RuntimeError as e:
        print(f"\nproctrack/cgroup: {e}\nusing proctrack/linuxproc")
        return MicroSlurm(os.path.join(dir, "linuxproc"), cpus=4, grace_time=60,
                          plugstack=plugstack, slurm_root=root), "linuxproc"


def test_a_preempted_cuda_job_comes_back_with_its_device_memory():
    gpu_host.unpack_bundle()
    bundle = gpu_host.Bundle()
    why = bundle.check()
    assert why is None, why
    root = slurm_root(bundle)
    work = tempfile.mkdtemp(prefix="gpuckpt-slurm-gpu.", dir="/var/tmp")
    os.chmod(work, 0o755)
    daemon = gpu_host.Daemon(bundle, os.path.join(work, "store"), os.path.join(work, "mnt"),
                             os.path.join(work, "daemon.log"), "test_slurm_gpu")
    try:
        why = daemon.start()
        assert why is None, why
        plugstack = os.path.join(work, "plugstack.conf")
        with open(plugstack, "w") as f:
            f.write(f"required {bundle.root}/lib/gpuckpt/gpuckpt_spank.so mount={daemon.mnt} "
                    f"helper={bundle.root}/libexec/gpuckpt/gpuckpt-slurm\n")
        result = os.path.join(work, "result")
        script = os.path.join(work, "job.sh")
        with open(script, "w") as f:
            # gpuckpt-slurm needs the bundle's libslurm; the workload runs on
            # the machine's own libraries.
            f.write(f"#!/bin/bash\nunset LD_LIBRARY_PATH\n{bundle.gpu_memory} {result} "
                    f"--gib {GIB}\necho exit $?\n")
        os.chmod(script, 0o755)
        out = os.path.join(work, "job.out")
        slurm, proctrack = start_cluster(work, plugstack, root)
        with slurm:
            libs = f"{bundle.lib}:{root}/lib:{root}/plugins"
            job = slurm.sbatch("--partition=low", "--cpus-per-task=4", f"--chdir={work}",
                               f"--output={out}", "--open-mode=append", "--gpuckpt",
                               "--signal=B:USR1@30", f"--export=ALL,LD_LIBRARY_PATH={libs}",
                               script)
            wait_for(lambda: os.path.exists(result + ".ready"), 300,
                     f"gpu_memory to fill its memory ({read_text(out)})")
            pid = int(read_text(result + ".ready").strip())
            time.sleep(2)  # a few of its kernels
            slurm.sbatch("--partition=high", "--cpus-per-task=4", f"--output={work}/high.out",
                         "--wrap", "sleep 2")
            wait_for(lambda: re.search(r"^gpuckpt-slurm: restored job", read_text(out), re.M),
                     300, f"the job to come back ({read_text(out)})")
            text = read_text(out)
            assert daemon.gpu_running(pid) or os.path.exists(f"/proc/{pid}"), text
            if proctrack == "cgroup":
                listed = slurm.cli("scontrol", "listpids", str(job))
                assert re.search(rf"^{pid}\s", listed, re.M), listed
            os.kill(pid, signal.SIGUSR1)
            wait_for(lambda: read_text(result).strip() != "", 120, "gpu_memory's verdict")
            verdict = read_text(result).strip()
            fields = slurm.wait_job(job, lambda j: j["JobState"] in ("COMPLETED", "FAILED"),
                                    seconds=120, what="the job to end")
        text = read_text(out)
        ckpt = re.search(r"^gpuckpt-slurm: checkpoint \S+ taken in ([\d.]+) s", text, re.M)
        back = re.search(r"^gpuckpt-slurm: restored job \d+ from checkpoint \S+ in ([\d.]+) s",
                         text, re.M)
        print(f"\nSlurm GPU job ({GIB} GiB, proctrack/{proctrack}): checkpoint "
              f"{ckpt.group(1) if ckpt else '?'} s, restore {back.group(1) if back else '?'} s, "
              f"verdict {verdict}, job {fields['JobState']} {fields['ExitCode']}")
        print(text)
        assert verdict == "PASS", text
        assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", fields
        assert not any(f"slurm-{job}-" in i for i in daemon.ids()), daemon.ids()
    finally:
        daemon.stop()
        if os.environ.get("KEEP_WORK") != "1":
            shutil.rmtree(work, ignore_errors=True)
