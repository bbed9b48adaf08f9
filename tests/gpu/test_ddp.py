"""A two-GPU PyTorch DDP job (tests/gpu/ddp_train.py: a launcher and one
process per GPU, NCCL over loopback sockets) checkpointed through the
launcher's <pid>/ctl of a real gpuckptfs mount, killed, and restored twice:
from a cp -r copy onto the same GPUs, and from the mount with the two GPUs
swapped (--gpu-map A=B,B=A). After each restore the job must finish with
the losses of an uninterrupted run, bit for bit.

    python3 -m pytest -s -rs tests/gpu/test_ddp.py [--ddp-steps N] [--ddp-gpus 1|2]
        [--out DIR] [--as-user NAME|root] [--keep]

(tests/gpu/run-ddp takes --steps for --ddp-steps and --one-gpu for
--ddp-gpus 1.) Runs on a machine with two or more NVIDIA GPUs, as root,
from the repository root, with the bundle of tests/gpu/prepare; skips,
saying why, without root, two GPUs or the bundle. With --ddp-gpus 1 both
ranks share the first GPU and all-reduce through gloo (ddp_train.py
--one-gpu; NCCL refuses two ranks on one GPU): the same tree and the same
checks on a machine with one GPU, but for the swap, which becomes a second
restore from the mount onto that GPU. The job runs as an ordinary user (--as-user, default
gpuckpt-gpu-suite, made for the run if there is none), who also
checkpoints, copies and restores it through the mount (CRIU then needs
CAP_NET_ADMIN for the ranks' TCP connections); --as-user root runs it all as
root:

  test_reference_runs: two uninterrupted runs (at once), whose logs must be
  equal;
  test_checkpoint_restore:
    1. the job: its launcher appears in the mount with a "job: launcher of
       GPU processes R0 R1" status line, each rank with "gpu state: running";
    2. `checkpoint` of the launcher (the job runs on: both ranks back to
       "gpu state: running"), then `checkpoint --kill` (the whole tree gone);
       both manifests list the two GPUs and the tree;
    3. cp -r of the second checkpoint; restore from the copy: the launcher
       comes back with its pid, the job finishes, each rank's log equals the
       reference's;
    4. restore from the mount with the GPUs swapped: nvidia-smi shows rank 0
       on the second GPU and rank 1 on the first; logs equal the reference's.

Prints "PASS ddp ..." with the figures (checkpoint and restore times, sizes,
new bytes of the second checkpoint) or "FAIL ddp: why" (with the errors of
the CRIU logs gpuckptfs kept). Writes ddp-summary.txt and ddp-logs.tar.gz
into --out (default $OUT, else out/gpu-ddp).
"""

import json
import os
import shutil
import subprocess
import time

import pytest

from gpuckpt_testing import filetools, gpu_host, messages, processes, workloads
from gpuckpt_testing.gpu_run import RESULT_LINES, GpuWork, option
from gpuckpt_testing.messages import Failure

PROG = "run-ddp"
STEP_MS = 100
PORT_BASE = 29561

# (Two GPUs are checked for in the ddp fixture, which knows --ddp-gpus.)
pytestmark = gpu_host.skip_unless_runnable(1)


class Ddp(GpuWork):
    """The run: its mount, the two GPUs, the job's pids."""

    def __init__(self, config):
        self.steps = option(config, "ddp_steps")
        self.gpus = option(config, "ddp_gpus")
        super().__init__(config, PROG, "gpuckpt-ddp.", "gpu-ddp", "ddp-summary.txt",
                         "ddp-logs.tar.gz", 100)
        self.job_pid = None
        self.ranks = [None, None]
        self.reference_done = False
        try:
            self.ddp_py = self.install("ddp_train.py")
            _, out, _ = gpu_host.nvidia_smi("--query-gpu=uuid", "--format=csv,noheader")
            self.gpu_uuids = [u.replace(" ", "") for u in out.splitlines() if u.strip()]
            if len(self.gpu_uuids) < self.gpus:
                pytest.fail(f"needs {self.gpus} GPUs; nvidia-smi lists {len(self.gpu_uuids)}",
                            pytrace=False)
            driver = gpu_host.driver_version()
            torch = gpu_host.torch_version(self.user)
            _, gpus, _ = gpu_host.nvidia_smi("--query-gpu=name,uuid", "--format=csv,noheader")
            self.note(f"gpu-ddp {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
                      f"steps={self.steps} gpus={self.gpus} as={self.user.name} (uid {self.user.uid}); GPUs: "
                      f"{';'.join(gpus.splitlines())}; driver {driver}; torch {torch}; "
                      f"bundle built from {self.bundle.commit()}")
            self.start_daemon()
        except BaseException:
            self.close()
            raise

    def fail(self, why):
        """The run fails, saying why, with the CRIU logs of failed operations
        that gpuckptfs kept (in its state directory, the default)."""
        line = f"FAIL ddp: {why}"
        print(line, flush=True)
        RESULT_LINES.append(line)
        with open(self.summary, "a") as f:
            f.write(line + "\n")
        kept = os.path.join(self.logs, "criu")
        if os.path.isdir(gpu_host.CRIU_LOGS):
            for d in sorted(os.listdir(gpu_host.CRIU_LOGS)):
                sub = os.path.join(gpu_host.CRIU_LOGS, d)
                if not os.path.isdir(sub):
                    continue
                for n in sorted(os.listdir(sub)):
                    if n.endswith(".log") and os.path.isfile(os.path.join(sub, n)):
                        os.makedirs(kept, exist_ok=True)
                        try:
                            shutil.copy(os.path.join(sub, n), kept)
                        except OSError:
                            pass
        if os.path.isdir(kept):
            for n in sorted(os.listdir(kept)):
                lines = [x for x in filetools.read_text(os.path.join(kept, n)).splitlines()
                         if any(w in x for w in ("Error", "error", "fail", "Warn"))]
                messages.say(PROG, f"--- {os.path.join(kept, n)} (errors)\n" + "\n".join(lines[-25:]))
        pytest.fail(why, pytrace=False)

    def job_start(self, directory, port):
        """ddp_train.py in its own session; its launcher's pid."""
        pid = workloads.start_session(self.user, directory, [
            "python3", self.ddp_py, "--steps", str(self.steps), "--step-ms", str(STEP_MS),
            "--log", os.path.join(directory, "log"), "--ready", os.path.join(directory, "ready"),
            "--port", str(port)] + (["--one-gpu"] if self.gpus == 1 else []))
        self.session(pid)
        return pid

    def job_ranks(self, directory, job_pid):
        """Waits (180 s) for both ranks' ready files; their pids."""
        ranks = []
        for r in (0, 1):
            pid = workloads.wait_ready(os.path.join(directory, f"ready.rank{r}"), 180,
                                    os.path.join(directory, "launch.pid"))
            if pid is None:
                out = os.path.join(directory, "out.log")
                if os.path.exists(out):
                    shutil.copyfile(out, os.path.join(
                        self.logs, f"{os.path.basename(directory)}-out.log"))
                said = "".join(filetools.read_text(os.path.join(directory, n))
                               for n in sorted(os.listdir(directory))
                               if n.startswith("log.")) + filetools.read_text(out)
                self.fail(f"rank {r} of {directory} never got ready: {said[-3000:]}")
            launcher = processes.parent_of(pid)
            # (A reference run may have ended already: nothing left to check.)
            if launcher and launcher != str(job_pid):
                self.fail(f"rank {r} ({pid})'s parent is '{launcher}', not the launcher {job_pid}")
            ranks.append(pid)
        return ranks

    def job_end(self, directory, job_pid, what):
        """The job ends within its steps' time + 3 min and both ranks' logs
        end with a params line, no error."""
        if not processes.gone(job_pid, self.steps * STEP_MS // 1000 + 180):
            self.fail(f"{what}: the job (launcher {job_pid}) still runs")
        for r in (0, 1):
            log = filetools.read_text(os.path.join(directory, f"log.rank{r}"))
            if not log:
                self.fail(f"{what}: rank {r} wrote no log")
            lines = log.splitlines()
            errors = [x for x in lines if x.startswith("error")]
            if errors or not lines or not lines[-1].startswith("params "):
                self.fail(f"{what}: rank {r}: {(errors or [''])[0][:1500]}")

    def same_logs(self, directory, what):
        """Each rank's log equals the reference's."""
        for r in (0, 1):
            ref = os.path.join(self.work, "ref-a", f"log.rank{r}")
            log = os.path.join(directory, f"log.rank{r}")
            if not filetools.same_file(ref, log):
                self.fail(f"{what}: rank {r}'s log differs from the reference's: "
                          f"{filetools.first_difference(ref, log)}")

    def checkpoint(self, pid, opts):
        """Through ctl; (id, seconds)."""
        before = self.daemon.ids()
        t0 = time.monotonic()
        command = "checkpoint" + (f" {opts}" if opts else "")
        rc, err = self.user.write(os.path.join(self.mnt, str(pid), "ctl"), command, 300)
        if rc != 0:
            self.fail(f"{command} of the launcher {pid}: {err}; "
                      f"{self.daemon.status_line(pid, 'last')}")
        took = gpu_host.elapsed(t0)
        added = gpu_host.new_ids(before, self.daemon.ids())
        if len(added) != 1:
            self.fail(f"checkpoint of {pid} added ids: '{' '.join(added)}'")
        shutil.copyfile(os.path.join(self.mnt, "checkpoints", added[0], "manifest.json"),
                        os.path.join(self.logs, f"manifest-{added[0]}.json"))
        return added[0], took

    def check_manifest(self, ckpt):
        """Backend cuda, the job's GPUs, the launcher and both ranks in the tree;
        (logical, new, stored, device memory, dump seconds)."""
        with open(os.path.join(self.mnt, "checkpoints", ckpt, "manifest.json")) as f:
            m = json.load(f)
        x = m.get("extra", m)
        pids = [self.job_pid] + self.ranks
        want = sorted(u.lower() for u in self.gpu_uuids[:self.gpus])
        problems = []
        if x.get("gpu_backend") != "cuda":
            problems.append("gpu_backend %r" % x.get("gpu_backend"))
        got = sorted(str(g.get("uuid", "")).lower() for g in x.get("gpus", []))
        if got != want:
            problems.append("gpus %r, not %r" % (got, want))
        tree = x.get("tree", [])
        if any(p not in tree for p in pids):
            problems.append("tree %r lacks one of %r" % (tree, pids))
        if x.get("pid") != pids[0]:
            problems.append("pid %r" % x.get("pid"))
        if problems:
            self.fail(f"manifest of {ckpt}: {'; '.join(problems)}")
        return (m.get("logical_bytes", 0), m.get("new_bytes", 0), m.get("stored_bytes", 0),
                x.get("device_memory_bytes", 0), x.get("stages", {}).get("dump_s", 0))

    def restore(self, args, what):
        """The launcher comes back with its pid; the seconds it took."""
        t0 = time.monotonic()
        restore = os.path.join(self.mnt, "restore")
        rc, err = self.user.write(restore, args, 300)
        if rc != 0:
            self.fail(f"{what}: restore of '{args}': {err}; restore says: {self.user.cat(restore)}")
        took = gpu_host.elapsed(t0)
        said = self.user.cat(restore)
        # `pid N`, and for a copy a second line naming its import.
        if said.split("\n")[0] != f"pid {self.job_pid}":
            self.fail(f"{what}: restore says '{said}', expected 'pid {self.job_pid}'")
        return took

    def ports_settle(self, what):
        """Waits (at most 75 s) until no TCP connection is in TIME_WAIT. The
        job's closed connections (NCCL's bootstrap ones, and all of them
        when it ends) hold their listening ports in TIME_WAIT for a minute,
        and a restore before then cannot bind those ports (gpuckptfs says
        so, EBUSY). Notes how long it waited."""
        t0 = time.monotonic()
        for _ in range(750):
            if not time_wait():
                break
            time.sleep(0.1)
        self.note(f"{what}: waited {gpu_host.elapsed(t0)} s for TIME_WAIT connections to expire")


def time_wait():
    """Some TCP connection is in TIME_WAIT (state 06, the 4th column of
    /proc/net/tcp and tcp6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in filetools.read_text(table).splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "06":
                return True
    return False


def gpu_of(pid):
    """The UUID of the GPU nvidia-smi shows pid on ("" if none)."""
    _, out, _ = gpu_host.nvidia_smi("--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader")
    for line in out.splitlines():
        fields = line.replace(" ", "").split(",")
        if len(fields) >= 2 and fields[0] == str(pid):
            return fields[1]
    return ""


@pytest.fixture(scope="module")
def ddp(request, gpu_work):
    gpus = option(request.config, "ddp_gpus")
    why = gpu_host.why_not_runnable(gpus) if gpus > 1 else None
    if why is not None:
        if os.environ.get("GPUCKPT_GPU_REQUIRED") == "1":
            pytest.fail(f"cannot run here: {why}", pytrace=False)
        pytest.skip(why)
    return gpu_work(Ddp)


def failing_as_ddp(ddp, fn):
    """Runs fn; an unexpected error fails the run like a check does."""
    try:
        fn()
    except Failure as e:
        ddp.fail(str(e))
    except (OSError, ValueError, KeyError, TypeError) as e:
        ddp.fail(f"{type(e).__name__}: {e}")


def test_reference_runs(ddp):
    """Two at once (each on both GPUs; deterministic all the same)."""
    def run():
        t0 = time.monotonic()
        launchers = {"a": ddp.job_start(os.path.join(ddp.work, "ref-a"), PORT_BASE),
                     "b": ddp.job_start(os.path.join(ddp.work, "ref-b"), PORT_BASE + 1)}
        for ref in ("a", "b"):
            d = os.path.join(ddp.work, f"ref-{ref}")
            ddp.job_ranks(d, launchers[ref])
            ddp.job_end(d, launchers[ref], f"reference run {ref}")
            info = " / ".join(filetools.read_text(os.path.join(d, f"log.rank{r}.info")).strip()
                              for r in (0, 1))
            ddp.note(f"reference run {ref}: {gpu_host.elapsed(t0)} s; {info}")
        ddp.same_logs(os.path.join(ddp.work, "ref-b"),
                      "reference run b against a (the run is not deterministic here)")
        ddp.reference_done = True
    failing_as_ddp(ddp, run)


def test_checkpoint_restore(ddp):
    def run():
        if not ddp.reference_done:
            ddp.fail("no reference logs (the reference runs failed or did not run)")
        mnt = ddp.mnt
        job = os.path.join(ddp.work, "job")
        # 1. The job.
        ddp.job_pid = ddp.job_start(job, PORT_BASE + 5)
        ddp.ranks = ddp.job_ranks(job, ddp.job_pid)
        r0, r1 = ddp.ranks
        if not (os.path.exists(f"/proc/{r0}") and os.path.exists(f"/proc/{r1}")):
            ddp.fail(f"the job's ranks {r0} {r1} ended early")
        ddp.note(f"job: launcher {ddp.job_pid}, ranks {r0} {r1}")
        for _ in range(100):
            if os.path.isfile(os.path.join(mnt, str(ddp.job_pid), "status")):
                break
            time.sleep(0.1)
        try:
            with open(os.path.join(mnt, str(ddp.job_pid), "status")) as f:
                status = f.read()
        except OSError as e:
            ddp.fail(f"the launcher {ddp.job_pid} is not in the mount: {e}")
        with open(os.path.join(ddp.logs, "status-launcher.txt"), "w") as f:
            f.write(status)
        job_line = next((x for x in status.splitlines()
                         if x.startswith("job: launcher of GPU processes ")), "")
        if str(r0) not in job_line.split() or str(r1) not in job_line.split():
            ddp.fail(f"the launcher's status lacks its job line: {'|'.join(status.splitlines())}")
        for r in (r0, r1):
            if not ddp.daemon.gpu_running(r):
                ddp.fail(f"rank {r}: {'|'.join(ddp.daemon.status(r).splitlines())}")

        # 2. Two checkpoints of the launcher.
        ckpt1, ckpt1_s = ddp.checkpoint(ddp.job_pid, "")
        logical1, new1, _, devmem1, dump1 = ddp.check_manifest(ckpt1)
        for r in (r0, r1):
            for _ in range(100):
                if processes.proc_state(r) not in ("T", "t") and ddp.daemon.gpu_running(r):
                    break
                time.sleep(0.1)
            else:
                ddp.fail(f"rank {r} does not run with its GPU 10 s after the checkpoint: "
                         f"{ddp.daemon.status_line(r, 'gpu state')}")
        ddp.note(f"checkpoint {ckpt1} (job runs on): {ckpt1_s} s (dump {dump1} s), logical "
                 f"{logical1} B, new {new1} B, device memory {devmem1} B")
        time.sleep(1)
        ckpt2, ckpt2_s = ddp.checkpoint(ddp.job_pid, "--kill")
        logical2, new2, stored2, _, dump2 = ddp.check_manifest(ckpt2)
        if not processes.gone(ddp.job_pid, 30):
            ddp.fail("the job still runs 30 s after checkpoint --kill")
        share = 100 * new2 / logical2 if logical2 else 0
        ddp.note(f"checkpoint {ckpt2} --kill: {ckpt2_s} s (dump {dump2} s), logical {logical2} B, "
                 f"new {new2} B ({share:.2f}% of it)")
        store_bytes = subprocess.run(["du", "-sb", ddp.daemon.store], capture_output=True,
                                     text=True).stdout.split("\t")[0].strip()
        ddp.note(f"stored (compressed) by the second: {stored2} B; store on disk after both: "
                 f"{store_bytes} B")

        # 3. Restore from a copy, same GPUs.
        t0 = time.monotonic()
        copies = os.path.join(ddp.work, "copies")
        ddp.user.give(copies)
        rc, said = ddp.user.run(["timeout", "-k", "5", "300", "cp", "-r",
                                 os.path.join(mnt, "checkpoints", ckpt2),
                                 os.path.join(copies, "copy")], timeout=320)
        if rc != 0:
            ddp.fail(f"cp -r of {ckpt2} failed: {said.strip()}")
        copy_s = gpu_host.elapsed(t0)
        remove_rank_logs(job)
        ddp.ports_settle("before the restore from the copy")
        restore_copy_s = ddp.restore(os.path.join(copies, "copy"), "restore from the copy")
        ddp.job_end(job, ddp.job_pid, "after the restore from the copy")
        ddp.same_logs(job, "after the restore from the copy")
        ddp.note(f"cp -r: {copy_s} s; restore from the copy: {restore_copy_s} s; logs equal the "
                 "reference's")

        # 4. Restore from the mount, GPUs swapped (on one GPU: onto it again).
        remove_rank_logs(job)
        g0 = ddp.gpu_uuids[0]
        g1 = ddp.gpu_uuids[1] if ddp.gpus == 2 else g0
        what = "swapped restore" if ddp.gpus == 2 else "restore from the mount"
        ddp.ports_settle(f"before the {what}")
        gpu_map = f" --gpu-map {g0}={g1},{g1}={g0}" if ddp.gpus == 2 else ""
        restore_mount_s = ddp.restore(f"{mnt}/checkpoints/{ckpt2}{gpu_map}", what)
        on0, on1 = gpu_of(r0), gpu_of(r1)
        if on0.lower() != g1.lower() or on1.lower() != g0.lower():
            ddp.fail(f"after the {what} rank 0 ({r0}) is on '{on0}', rank 1 ({r1}) on "
                     f"'{on1}'; expected {g1} and {g0}")
        ddp.job_end(job, ddp.job_pid, f"after the {what}")
        ddp.same_logs(job, f"after the {what}")
        ddp.note(f"{what}{' with --gpu-map' if gpu_map else ''}: {restore_mount_s} s; rank 0 ran "
                 f"on {on0}, rank 1 on {on1}; logs equal the reference's")

        restore_mount_key = "restore_swapped" if ddp.gpus == 2 else "restore_mount"
        line = (f"PASS ddp gpus={ddp.gpus} ckpt={ckpt1_s}s ckpt_kill={ckpt2_s}s "
                f"restore_copy={restore_copy_s}s {restore_mount_key}={restore_mount_s}s "
                f"logical={logical2} new_second={new2}")
        print(line, flush=True)
        RESULT_LINES.append(line)
        with open(ddp.summary, "a") as f:
            f.write("PASS ddp\n")
    failing_as_ddp(ddp, run)


def remove_rank_logs(job):
    for n in os.listdir(job):
        if n.startswith("log.rank"):
            os.unlink(os.path.join(job, n))
