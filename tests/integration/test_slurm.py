"""sbatch --gpuckpt on a real Slurm cluster (tools/micro-slurm, one node
unless said, with proctrack/cgroup) and a real mount, by an ordinary user:

- a job preempted by a higher partition's job is checkpointed on its
  --signal, requeued and restored where it was: its output equals an
  uninterrupted run's, its restored processes are the job's own to Slurm
  (`scontrol listpids`), and nothing of it is left once it ends; the other
  user sees none of its checkpoints; what the requeue cost beside a plain
  job's requeue is printed (-s shows it);
- a job whose script runs srun steps: each task of the running step is
  checkpointed and restored on its own, a finished step is not run again;
- a job over two nodes of a three-node cluster (a slurmd per node on this
  machine) comes back on other nodes: each task restored into the cgroups
  of the node it lands on;
- with --gpuckpt=INTERVAL, a job requeued without warning comes back from
  its last periodic checkpoint, losing at most an interval;
- a job checkpointed through one daemon comes back through another on a
  shared RADOS pool (tools/micro-ceph), as on another node;
- a checkpoint that cannot be restored, and a node without the mount: the
  job starts anew and says why; a malformed --gpuckpt=INTERVAL is refused
  by sbatch.

The workload checks its own state: a buffer it keeps in memory must equal
the same buffer rebuilt from scratch at the end. Run by ctest under
wl_reaper; needs root, /dev/fuse, CRIU and Slurm (skipped, saying why,
where one is missing)."""

import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from gpuckpt_testing import build
from gpuckpt_testing.filetools import read_text
from gpuckpt_testing.micro_ceph import MicroCeph
from gpuckpt_testing.micro_slurm import MicroSlurm
from gpuckpt_testing.mount import Mount, listdir_as, why_not_runnable
from gpuckpt_testing.processes import wait_for


def why_no_slurm():
    missing = [d for d in ("slurmctld", "slurmd", "munged")
               if not os.path.exists(f"/usr/sbin/{d}")]
    if missing or shutil.which("sbatch") is None:
        return ("Slurm is not installed (slurmctld, slurmd, munge, slurm-client: "
                "tools/setup installs them)")
    if not os.path.exists(build.SLURM_PLUGIN):
        return f"the Slurm plugin is not built ({build.SLURM_PLUGIN}: -DGPUCKPT_SLURM=ON)"
    return why_not_runnable("wl_memory")


pytestmark = pytest.mark.skipif(why_no_slurm() is not None, reason=str(why_no_slurm()))

# STEPS steps of STEP_S seconds each; each step writes a block of the
# buffer and prints the running digest of all blocks so far.
WORKLOAD = """
import hashlib, sys, time
steps, step_s = int(sys.argv[1]), float(sys.argv[2])
size = 8 << 20
def block(i):
    return hashlib.sha256(b"%d" % i).digest() * 1024
def place(buf, i):
    b = block(i)
    at = (i * 40503 * 64) % (size - len(b))
    buf[at:at + len(b)] = b
buf = bytearray(size)
digest = hashlib.sha256()
for i in range(steps):
    place(buf, i)
    digest.update(block(i))
    print("step", i, digest.hexdigest()[:16], flush=True)
    time.sleep(step_s)
check = bytearray(size)
for i in range(steps):
    place(check, i)
print("state", "intact" if check == buf else "CORRUPT", flush=True)
print("final", digest.hexdigest(), flush=True)
"""

STEP_S = 0.25


def job_script(work, steps):
    return f"#!/bin/bash\n{build.PYTHON} {work}/workload.py {steps} {STEP_S}\n"


def program_lines(text):
    """The workload's own lines of a job's output: without gpuckpt-slurm's
    and Slurm's."""
    return [line for line in text.splitlines()
            if not line.startswith("gpuckpt-slurm: ") and not line.startswith("slurmstepd")]


def make_work_dir(user):
    """An open directory holding `user`'s work dir, the workload there."""
    open_dir = tempfile.mkdtemp(prefix="gpuckpt-slurm-", dir="/var/tmp")
    os.chmod(open_dir, 0o755)
    work = os.path.join(open_dir, "work")
    os.mkdir(work)
    os.chown(work, user.uid, user.gid)
    with open(os.path.join(work, "workload.py"), "w") as f:
        f.write(WORKLOAD)
    return open_dir, work


@pytest.fixture
def site(users):
    """A mount, a work dir of user a's under an open directory, the
    workload there."""
    a, _ = users
    mount = Mount("gpuckpt-slurm.", all_processes=False)
    open_dir, work = make_work_dir(a)
    try:
        yield mount, open_dir, work
    finally:
        mount.close()
        shutil.rmtree(open_dir, ignore_errors=True)


def plugstack(dir, mount_point):
    """Without helper=: the plugin finds gpuckpt-slurm from its own path, as
    where both are installed (the build tree has them in the same places)."""
    assert os.path.relpath(build.SLURM_HELPER, os.path.dirname(build.SLURM_PLUGIN)) == \
        "../../libexec/gpuckpt/gpuckpt-slurm", (build.SLURM_PLUGIN, build.SLURM_HELPER)
    path = os.path.join(dir, "plugstack.conf")
    with open(path, "w") as f:
        f.write(f"required {build.SLURM_PLUGIN} mount={mount_point}\n")
    return path


def cluster(open_dir, mount_point, **options):
    """The cluster of a test, with proctrack/cgroup and the plugin on
    `mount_point`."""
    return MicroSlurm(os.path.join(open_dir, "cluster"), proctrack="cgroup",
                      plugstack=plugstack(open_dir, mount_point), **options)


def reference_output(user, work, steps):
    """The workload's output run straight through, as the user."""
    r = user.run([build.PYTHON, os.path.join(work, "workload.py"), str(steps), "0"], timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def submit(slurm, user, work, name, steps, *options):
    script = os.path.join(work, f"{name}.sh")
    with open(script, "w") as f:
        f.write(job_script(work, steps))
    os.chmod(script, 0o755)
    out = os.path.join(work, f"{name}.out")
    job = slurm.sbatch("--partition=low", f"--cpus-per-task={os.cpu_count()}",
                       f"--chdir={work}", f"--output={out}", "--open-mode=append", *options,
                       script, user=user)
    return job, out


def wait_output(out, pattern, seconds, what):
    """Until a line of the job's output matches; the time it was seen."""
    wait_for(lambda: re.search(pattern, read_text(out), re.M), seconds, what)
    return time.monotonic()


def preempt(slurm, work):
    """Submits a high job taking every CPU for 2 s; the time of submission."""
    at = time.monotonic()
    slurm.sbatch("--partition=high", f"--cpus-per-task={os.cpu_count()}",
                 f"--output={work}/high.out", "--wrap", "sleep 2")
    return at


def job_ended(slurm, job):
    return slurm.wait_job(job, lambda j: j["JobState"] in ("COMPLETED", "FAILED"), seconds=180,
                          what=f"job {job} to end")


def user_pids(user, needle):
    r = subprocess.run(["pgrep", "-u", str(user.uid), "-f", needle], capture_output=True,
                       text=True)
    return {int(p) for p in r.stdout.split()}


def test_a_preempted_job_comes_back_where_it_was(site, users):
    a, b = users
    mount, open_dir, work = site
    steps = 80
    expected = reference_output(a, work, steps)
    assert expected[-2] == "state intact", expected[-3:]
    with cluster(open_dir, mount.mnt, grace_time=5) as slurm:
        # A plain job, requeued by Slurm alone: what a requeue costs anyway
        # (Slurm ends it at the end of its grace time).
        plain, plain_out = submit(slurm, a, work, "plain", steps, "--requeue")
        wait_output(plain_out, r"^step 8 ", 60, "the plain job's 8th step")
        plain_preempted = preempt(slurm, work)
        plain_back = wait_output(plain_out, r"^step 0 (?s:.*)^step 0 ", 120,
                                 "the plain job to start again")
        slurm.cli("scancel", str(plain))

        job, out = submit(slurm, a, work, "job", steps, "--gpuckpt", "--signal=B:USR1@5")
        wait_output(out, r"^step 8 ", 60, "the job's 8th step")
        preempted = preempt(slurm, work)
        wait_output(out, r"^gpuckpt-slurm: job \d+ requeued", 60, "the checkpoint and requeue")
        text = read_text(out)
        ckpt_s = float(re.search(r"^gpuckpt-slurm: checkpoint \S+ taken in ([\d.]+) s", text,
                                 re.M).group(1))
        # a's checkpoint, which b does not see.
        ids = [i for i in mount.ids(a) if re.fullmatch(rf"{a.uid}\.slurm-{job}-1", i)]
        assert ids, mount.ids(a)
        assert not any("slurm-" in i for i in listdir_as(b, mount.path("checkpoints")))

        back = wait_output(out, r"^gpuckpt-slurm: restored job .*\n^step ", 120,
                           "the job to come back and take a step")
        text = read_text(out)
        restore_s = float(re.search(r"^gpuckpt-slurm: restored job \d+ from checkpoint \S+ in "
                                    r"([\d.]+) s", text, re.M).group(1))
        # The restored workload is the job's own to Slurm: its cgroup's.
        workload = user_pids(a, "workload.py")
        assert workload, "no restored workload runs"
        listed = {int(line.split()[0]) for line in
                  slurm.cli("scontrol", "listpids", str(job)).splitlines()[1:] if line.strip()}
        assert workload <= listed, (workload, listed)

        fields = job_ended(slurm, job)
        assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", fields
        assert fields["Restarts"] == "1", fields
        assert program_lines(read_text(out)) == expected
        assert not any(f"slurm-{job}-" in i for i in mount.ids(a)), mount.ids(a)
        assert not os.path.exists(os.path.join(work, f".gpuckpt-slurm-{job}.status"))
        assert not user_pids(a, "workload.py")
    plain_cost = plain_back - plain_preempted
    cost = back - preempted
    print(f"\nrequeue: plain {plain_cost:.2f} s; --gpuckpt {cost:.2f} s "
          f"(+{cost - plain_cost:.2f} s; checkpoint {ckpt_s:.2f} s + restore {restore_s:.2f} s "
          f"= {ckpt_s + restore_s:.2f} s)")


def test_a_preempted_job_with_srun_steps_comes_back_step_by_step(site, users):
    """A batch script that runs a short step and then a step of two tasks
    (srun, each task its own output file): on preemption each task of the
    running step is checkpointed and the job requeued; the script runs
    again, its finished step is not run again, and each task comes back
    where it was, its output equal to an uninterrupted run's. With
    --gpuckpt=3s the tasks are checkpointed every 3 s, the batch step
    (whose script holds srun) not."""
    a, _ = users
    mount, open_dir, work = site
    steps = 60
    expected = reference_output(a, work, steps)
    script = os.path.join(work, "steps.sh")
    with open(script, "w") as f:
        f.write("#!/bin/bash\n"
                "echo script starts\n"
                f"srun --ntasks=1 sh -c 'echo prep >> {work}/prep.log'\n"
                f"srun --ntasks=2 --output={work}/task.%t.out --open-mode=append "
                f"{build.PYTHON} {work}/workload.py {steps} {STEP_S}\n"
                "echo script ends\n")
    os.chmod(script, 0o755)
    out = os.path.join(work, "steps.out")
    tasks = [os.path.join(work, f"task.{t}.out") for t in range(2)]
    with cluster(open_dir, mount.mnt, grace_time=10) as slurm:
        job = slurm.sbatch("--partition=low", "--ntasks=2", "--cpus-per-task=1",
                           f"--chdir={work}", f"--output={out}", "--open-mode=append",
                           "--gpuckpt=3s", "--signal=B:USR1@5", script, user=a)
        for t in tasks:
            wait_output(t, r"^step 8 ", 60, f"{t}'s 8th step")
        preempt(slurm, work)
        wait_output(out, r"^gpuckpt-slurm: job \d+ requeued", 60, "the checkpoint and requeue")
        text = read_text(out)
        assert re.search(r"^gpuckpt-slurm: 2 of 2 step task\(s\) checkpointed", text, re.M), text
        fields = job_ended(slurm, job)
        text = read_text(out)
        assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, text)
        assert fields["Restarts"] == "1", fields
    assert [line for line in program_lines(text) if not line.startswith("srun: ")] == [
        "script starts", "script starts", "script ends"], (text, [read_text(t) for t in tasks])
    # Periodic checkpoints are the tasks' own, not the batch step's.
    assert re.search(rf"^gpuckpt-slurm: job {job} runs srun steps", text, re.M), text
    assert not re.search(rf"checkpoint \S+slurm-{job}-\d+ taken", text), text
    assert re.search(rf"^gpuckpt-slurm: step {job}\.0 task 0 ended before job {job} was "
                     r"requeued \(exit status 0\): not run again", text, re.M), text
    assert read_text(os.path.join(work, "prep.log")) == "prep\n"
    for t in tasks:
        task_text = read_text(t)
        assert re.search(rf"^gpuckpt-slurm: restored step {job}\.1 task \d from checkpoint",
                         task_text, re.M), task_text
        assert program_lines(task_text) == expected, task_text
        assert re.search(rf"^gpuckpt-slurm: checkpoint \S+slurm-{job}\.1\.\d-\d+ taken in [\d.]+ s$",
                         task_text, re.M), task_text
    assert not any(f"slurm-{job}" in i for i in mount.ids(a)), mount.ids(a)
    assert not [n for n in os.listdir(work) if n.startswith(f".gpuckpt-slurm-{job}")]
    assert not user_pids(a, "workload.py")


def task_node(pid):
    """The Slurm node whose step cgroup holds `pid` (cgroup v1: slurm_NODE/,
    v2: NODE_slurmstepd.scope/); None outside Slurm's cgroups."""
    found = re.search(r"/slurm_([^/]+)/|/([^/]+)_slurmstepd\.scope/",
                      read_text(f"/proc/{pid}/cgroup"))
    return found and (found.group(1) or found.group(2))


def test_a_job_over_two_nodes_comes_back_on_other_nodes(site, users):
    """A job of two nodes of three, one task of its step on each, is
    preempted by a job on its second node; its first node is drained
    meanwhile, so the requeued job lands on the second and third: its
    script runs again on the second, and each task comes back on a node
    other than its first, in that node's cgroup of the step, its output
    equal to an uninterrupted run's."""
    a, _ = users
    mount, open_dir, work = site
    steps = 60
    expected = reference_output(a, work, steps)
    script = os.path.join(work, "nodes.sh")
    with open(script, "w") as f:
        f.write("#!/bin/bash\n"
                f"srun --output={work}/node-task.%t.out --open-mode=append "
                f"{build.PYTHON} {work}/workload.py {steps} {STEP_S}\n")
    os.chmod(script, 0o755)
    out = os.path.join(work, "nodes.out")
    tasks = [os.path.join(work, f"node-task.{t}.out") for t in range(2)]
    with cluster(open_dir, mount.mnt, grace_time=10, nodes=3) as slurm:
        job = slurm.sbatch("--partition=low", "--nodes=2", "--ntasks-per-node=1",
                           f"--chdir={work}", f"--output={out}", "--open-mode=append",
                           "--gpuckpt", "--signal=B:USR1@5", script, user=a)
        for t in tasks:
            wait_output(t, r"^step 8 ", 60, f"{t}'s 8th step")
        assert slurm.job(job)["NodeList"] == "node[1-2]"
        # The workload's own processes (not srun's, nor the keepers').
        programs = user_pids(a, f"^{re.escape(build.PYTHON)} .*/workload.py ")
        first = sorted(task_node(p) for p in programs)
        assert first == ["node1", "node2"], first
        slurm.cli("scontrol", "update", "nodename=node1", "state=drain", "reason=test")
        slurm.sbatch("--partition=high", "--nodelist=node2", f"--cpus-per-task={os.cpu_count()}",
                     f"--output={work}/high.out", "--wrap", "sleep 2")
        wait_output(out, r"^gpuckpt-slurm: job \d+ requeued", 60, "the checkpoint and requeue")
        assert re.search(r"^gpuckpt-slurm: 2 of 2 step task\(s\) checkpointed", read_text(out),
                         re.M), read_text(out)
        for t in tasks:
            wait_output(t, r"^gpuckpt-slurm: restored step .*\n^step ", 120,
                        f"{t}'s task to come back and take a step")
        assert slurm.job(job)["NodeList"] == "node[2-3]"
        # Task 0 went from node1 to node2, task 1 from node2 to node3, each
        # into its new node's cgroup of the job's step, which Slurm lists.
        for t, node in enumerate(("node2", "node3")):
            pid = int(re.search(r"^gpuckpt-slurm: restored step \S+ task \d from checkpoint \S+ "
                                r"in [\d.]+ s \(pid (\d+)\)", read_text(tasks[t]), re.M).group(1))
            assert task_node(pid) == node, (t, pid, read_text(f"/proc/{pid}/cgroup"))
            listed = slurm.cli("scontrol", "listpids", f"{job}.0", node)
            assert re.search(rf"^{pid}\s", listed, re.M), (t, pid, listed)
        fields = job_ended(slurm, job)
        assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", fields
        assert fields["Restarts"] == "1", fields
    for t in tasks:
        task_text = read_text(t)
        assert program_lines(task_text) == expected, task_text
    assert not any(f"slurm-{job}" in i for i in mount.ids(a)), mount.ids(a)
    assert not user_pids(a, "workload.py")


def why_no_ceph():
    missing = [d for d in ("ceph-mon", "ceph-osd", "ceph-mgr", "rados") if not shutil.which(d)]
    if missing:
        return f"no {', '.join(missing)} (Debian's Ceph packages; tools/setup installs them)"
    return None


@pytest.fixture
def pooled_site(users, tmp_path):
    """Two daemons on one RADOS pool of a one-node Ceph cluster, each with
    a store and a mount of its own, as on two nodes; a work dir of user
    a's, as `site`."""
    if why_no_ceph():
        pytest.skip(why_no_ceph())
    a, _ = users
    ceph = MicroCeph(str(tmp_path / "ceph"), pools=("gpuckpt",))
    mounts = []
    open_dir = None
    try:
        for name in ("first", "second"):
            mounts.append(Mount(f"gpuckpt-slurm-{name}.", "--pool", "gpuckpt", "--ceph-conf",
                                ceph.conf, all_processes=False))
        open_dir, work = make_work_dir(a)
        yield mounts, open_dir, work
    finally:
        for mount in reversed(mounts):
            mount.close()
        ceph.stop()
        if open_dir is not None:
            shutil.rmtree(open_dir, ignore_errors=True)


def test_a_preempted_job_comes_back_on_another_node_through_a_shared_pool(pooled_site, users):
    """The job is checkpointed through the first daemon; the node it comes
    back on mounts the second (the plugstack.conf that the requeued job's
    slurmstepd reads names it), which restores it from the pool. Its output
    equals an uninterrupted run's, and its checkpoint, removed through the
    second daemon, is gone from both."""
    a, _ = users
    (first, second), open_dir, work = pooled_site
    steps = 60
    expected = reference_output(a, work, steps)
    with cluster(open_dir, first.mnt, grace_time=5) as slurm:
        job, out = submit(slurm, a, work, "job", steps, "--gpuckpt", "--signal=B:USR1@5")
        wait_output(out, r"^step 8 ", 60, "the job's 8th step")
        preempt(slurm, work)
        wait_output(out, r"^gpuckpt-slurm: job \d+ requeued", 60, "the checkpoint and requeue")
        assert f"{a.uid}.slurm-{job}-1" in first.ids(a), first.ids(a)
        plugstack(open_dir, second.mnt)
        wait_output(out, r"^gpuckpt-slurm: restored job ", 120, "the job to come back")
        # Restored through the second daemon, which tracks the restored tree.
        root = re.search(r"^gpuckpt-slurm: restored job \d+ from checkpoint \S+ in [\d.]+ s "
                         r"\(pid (\d+)\)", read_text(out), re.M).group(1)
        assert root in os.listdir(second.mnt), os.listdir(second.mnt)
        assert root not in os.listdir(first.mnt), os.listdir(first.mnt)
        fields = job_ended(slurm, job)
        assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", fields
    assert program_lines(read_text(out)) == expected
    for mount in (first, second):
        wait_for(lambda: not any(f"slurm-{job}-" in i for i in mount.ids(a)), 5,
                 f"the job's checkpoint to be gone from {mount.mnt}")


def test_a_job_requeued_without_warning_comes_back_from_its_periodic_checkpoint(site, users):
    a, _ = users
    mount, open_dir, work = site
    steps = 60
    expected = reference_output(a, work, steps)
    with cluster(open_dir, mount.mnt) as slurm:
        job, out = submit(slurm, a, work, "job", steps, "--gpuckpt=2s")
        wait_output(out, r"^gpuckpt-slurm: checkpoint \S+-2 taken", 60,
                    "the second periodic checkpoint")
        # Only the newest is kept (another may be under way: the one before
        # it goes once it is taken).
        def kept():
            return [i for i in mount.ids(a) if f"slurm-{job}-" in i]
        wait_for(lambda: len(kept()) == 1, 10, f"one checkpoint of the job ({kept()})")
        number = re.fullmatch(rf"{a.uid}\.slurm-{job}-(\d+)", kept()[0])
        assert number and int(number.group(1)) >= 2, kept()
        slurm.cli("scontrol", "requeue", str(job))
        fields = job_ended(slurm, job)
        assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", fields
    text = read_text(out)
    assert re.search(rf"^gpuckpt-slurm: restored job {job} from checkpoint \S+-\d+ ", text, re.M)
    lines = program_lines(text)
    assert lines[-2:] == expected[-2:], lines[-3:]
    # Steps done after the checkpoint and before the requeue are done again:
    # at most an interval's (2 s) worth and what one checkpoint took.
    repeated = len(lines) - len(expected)
    assert 0 <= repeated <= 2 / STEP_S + 4, lines
    assert [line for line in lines if line not in expected] == [], "a step went wrong"


def test_a_checkpoint_that_cannot_be_restored_leaves_the_job_to_start_anew(site, users):
    a, _ = users
    mount, open_dir, work = site
    steps = 8
    expected = reference_output(a, work, steps)
    with cluster(open_dir, mount.mnt) as slurm:
        job, out = submit(slurm, a, work, "job", steps, "--gpuckpt", "--hold")
        # A checkpoint named as the job's, of a process that still runs: its
        # restore finds the pid taken.
        wl = mount.start("wl_memory", user=a)
        mount.checkpoint_named(wl.pid, f"slurm-{job}-1", user=a)
        slurm.cli("scontrol", "release", str(job))
        fields = job_ended(slurm, job)
        assert fields["JobState"] == "COMPLETED", fields
        wl.assert_passes("beside the job")
    text = read_text(out)
    assert re.search(rf"^gpuckpt-slurm: cannot restore checkpoint {a.uid}\.slurm-{job}-1: .+; "
                     r"the job starts anew$", text, re.M), text
    assert program_lines(text) == expected


def test_without_the_mount_the_job_runs_and_says_why(site, users):
    a, _ = users
    _, open_dir, work = site
    steps = 4
    expected = reference_output(a, work, steps)
    absent = os.path.join(open_dir, "no-mount")
    with cluster(open_dir, absent) as slurm:
        # A malformed interval is sbatch's error, before anything is queued.
        with pytest.raises(RuntimeError, match=r"INTERVAL is a number and a unit"):
            submit(slurm, a, work, "bad", steps, "--gpuckpt=5")
        job, out = submit(slurm, a, work, "job", steps, "--gpuckpt")
        fields = job_ended(slurm, job)
        assert fields["JobState"] == "COMPLETED", fields
    text = read_text(out)
    assert re.search(rf"^gpuckpt-slurm: no gpuckptfs mount at {absent} .*: the job runs without "
                     r"checkpoints$", text, re.M), text
    assert program_lines(text) == expected
