"""gpuckpt end to end on a real GPU. CUDA workloads are checkpointed through
<pid>/ctl of a real gpuckptfs mount (CRIU with its cuda_plugin and
gpuckpt's cuda-checkpoint), copied out with cp -r, killed, restored from the
copy and from the mount (with an identity --gpu-map), and check themselves
after each restore.

    python3 -m pytest -s -rs tests/gpu/test_suite.py [--reps N] [--out DIR] [--gib N]
        [--steps N] [--time-budget S] [--as-user NAME|root] [--keep]

(tests/gpu/run-suite takes the same options.) Runs on the GPU machine, as
root, from the repository root, with the bundle that tests/gpu/prepare made;
skips, saying why, without root, an NVIDIA GPU or the bundle. The workloads
run as an ordinary user (--as-user, default gpuckpt-gpu-suite, made for the
run if there is none), who also checkpoints, copies and restores them
through the mount; another user must see nothing of them. --as-user root
runs it all as root instead.

Once per run (tests of their own): two uninterrupted reference runs of
train.py (whose logs must be equal: the run is deterministic here), a
checkpoint whose GPU lock must time out (a kernel spins 4 s, --lock-timeout
300) and leave the process running and correct, and a restore with a
--gpu-map to an unknown GPU that must be refused.

Per repetition, for each workload (gpu_memory --gib 2: device memory with a
known pattern; train.py: a deterministic PyTorch training run) and each mode
(leave-running = `checkpoint`, kill = `checkpoint --kill`), one test
(test_workload[rN-WORKLOAD-MODE]): start it; wait for ready; <pid>/status
shows the GPU and "gpu state: running"; checkpoint through ctl (timed); the
manifest lists the GPU, the driver version and backend cuda; device/<id>/
holds cuda-ranges.json and .bin files that add up to at least the workload's
device memory, readable with hexdump; cp -r the checkpoint out (no device
view in it, its files no larger than the checkpoint's logical size);
leave-running: the original runs on and checks out (gpu_memory: SIGUSR1 ->
PASS; train.py: its log equals the reference's); restore from the copy and
check; the copy's import has the same device files (cmp); restore from the
mount with --gpu-map UUID=UUID and check. gc after each repetition.

Prints one line per case, "PASS|FAIL <workload> <mode> rep=<r> ckpt=<s>s
restore=<s>s" (restore: from the mount; the other times are in the
summary), then "N passed, N failed"; progress and reasons go to stderr.
Writes into --out (default $OUT, else out/gpu-suite): gpu-suite-summary.txt
and gpu-suite-logs.tar.gz (daemon log, criu check, nvidia-smi, dmesg; for
each failed case its files and the CRIU logs of failed operations that
gpuckptfs kept meanwhile).

No new repetition starts once the time used plus one more repetition (as
long as the longest so far) would pass --time-budget (500 s), so a run stays
within a known wall-clock bound; its cases are then skipped, saying so, and
the summary says how many repetitions ran.
"""

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from gpuckpt_testing import filetools, gpu_host, processes, users, workloads
from gpuckpt_testing.gpu_run import RESULT_LINES, GpuWork, option
from gpuckpt_testing.messages import Failure, fail

PROG = "run-suite"
STEP_MS = 100
LOCK_BUSY_MS = 4000
LOCK_TIMEOUT_MS = 300
TRAIN_MIN_DEVICE_BYTES = 256 << 20  # train.py's data set alone is 384 MiB
BOGUS_GPU = "GPU-00000000-0000-0000-0000-000000000000"
WORKLOADS = ("gpu_memory", "train.py")
MODES = ("leave-running", "kill")

pytestmark = gpu_host.skip_unless_runnable(1)


def pytest_generate_tests(metafunc):
    """test_workload: one test per repetition, workload and mode, in the
    order they run."""
    if "rep_case" in metafunc.fixturenames:
        reps = option(metafunc.config, "reps")
        cases = [(rep, wl, mode) for rep in range(1, reps + 1) for wl in WORKLOADS for mode in MODES]
        metafunc.parametrize("rep_case", cases, ids=[f"r{r}-{w}-{m}" for r, w, m in cases])


class Suite(GpuWork):
    """The run: its mount, the machine's GPUs, the results."""

    def __init__(self, config):
        self.reps = option(config, "reps")
        self.gib = option(config, "gib")
        self.steps = option(config, "steps")
        self.budget = option(config, "time_budget")
        self.t_start = time.monotonic()
        super().__init__(config, PROG, "gpuckpt-gpu-suite.", "gpu-suite", "gpu-suite-summary.txt",
                         "gpu-suite-logs.tar.gz", 200)
        self.cases = os.path.join(self.work, "cases")
        self.passed = self.failed = 0
        self.ref_log = None
        self.gpu_uuids = []
        # The repetitions: the longest so far, how many ended, when each began.
        self.longest = 0
        self.reps_done = 0
        self.rep_started = {}
        self.stopped = None
        try:
            os.makedirs(self.cases)
            os.chmod(self.cases, 0o711)
            self.train_py = self.install("train.py")
            self.machine()
            self.start_daemon()
            with open(self.summary, "w") as f:
                f.write(f"gpu-suite {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
                        f"reps={self.reps} gib={self.gib} steps={self.steps} as={self.user.name} "
                        f"(uid {self.user.uid})\n")
                f.write(f"GPUs: {' '.join(self.gpu_uuids)}; driver {self.driver}; torch {self.torch}; "
                        f"bundle built from {self.bundle.commit()}\n")
        except BaseException:
            self.close()
            raise

    def machine(self):
        """nvidia-smi, CRIU, PyTorch as the workloads' user."""
        rc, out, err = gpu_host.nvidia_smi()
        with open(os.path.join(self.logs, "nvidia-smi.txt"), "w") as f:
            f.write(out + err)
        if rc != 0:
            pytest.fail(f"nvidia-smi fails: {' '.join((out + err).splitlines()[-3:])}", pytrace=False)
        _, out, _ = gpu_host.nvidia_smi("--query-gpu=uuid", "--format=csv,noheader")
        self.gpu_uuids = [u.replace(" ", "") for u in out.splitlines() if u.strip()]
        if not self.gpu_uuids:
            pytest.fail("nvidia-smi lists no GPU", pytrace=False)
        self.driver = gpu_host.driver_version()
        _, out, _ = gpu_host.nvidia_smi("--query-gpu=name,uuid,memory.total", "--format=csv,noheader")
        self.say(f"GPUs: {';'.join(out.splitlines())}; driver {self.driver}")
        version = self.bundle.run([self.bundle.criu, "--version"], timeout=60).stdout
        self.say(f"criu: {' '.join(version.splitlines())}")
        try:
            check = self.bundle.run(["timeout", "120", self.bundle.criu, "check"])
            said = check.stdout + check.stderr
            ok = check.returncode == 0
        except OSError as e:
            said, ok = str(e), False
        with open(os.path.join(self.logs, "criu-check.txt"), "w") as f:
            f.write(said)
        if ok:
            self.say(f"criu check: {(said.splitlines() or [''])[-1]}")
        else:
            # Not fatal: criu check also fails on features none of these workloads use.
            self.say("warning: criu check failed (the cases will tell whether it matters): "
                     + " ".join(said.splitlines()[-3:]))
        self.hexdump = ["hexdump", "-C", "-n", "64"]
        if shutil.which("hexdump") is None:
            self.hexdump = ["od", "-A", "x", "-t", "x1z", "-N", "64"]
        self.torch = gpu_host.torch_version(self.user, ", torch.cuda.is_available()")
        python = subprocess.run(["python3", "-c", "import platform; print(platform.python_version())"],
                                capture_output=True, text=True).stdout.strip()
        self.say(f"python3 {python}, torch: {self.torch} (as {self.user.name})")
        if not self.torch.endswith(" True"):
            pytest.fail(f"PyTorch with CUDA is not usable as {self.user.name}: {self.torch}",
                        pytrace=False)

    def record(self, verdict, wl, mode, rep, ckpt, restore, detail):
        line = f"{verdict} {wl} {mode} rep={rep} ckpt={ckpt} restore={restore}"
        print(line, flush=True)
        RESULT_LINES.append(line)
        # (One line a case: a reason that quotes a workload's output is
        # joined into one.)
        detail = " | ".join(x for x in detail.splitlines() if x.strip())
        with open(self.summary, "a") as f:
            f.write(f"{line}  # {detail}\n" if detail else line + "\n")
        if verdict == "PASS":
            self.passed += 1
        else:
            self.failed += 1

    def run_case(self, name, wl, mode, rep, fn, *args):
        """Runs one case in its directory; records PASS or FAIL, keeps the
        logs of a failure, ends what it left running; re-raises its
        failure for pytest."""
        case = Case(self, name)
        t0 = time.monotonic()
        error = None
        try:
            fn(case, *args)
        except Failure as e:
            error = e
            self.say(f"FAIL: {e}")
        except Exception as e:  # (a bug or an unexpected error is a failure of the case too)
            error = e
            self.say(f"FAIL: {type(e).__name__}: {e}")
        ckpt = f"{case.ckpt_s}s" if case.ckpt_s else "-"
        restore = f"{case.restore_s}s" if case.restore_s else "-"
        if error is None:
            extra = f"{int(time.monotonic() - t0)} s"
            if case.details:
                extra += "; " + ";".join(case.details)
            self.record("PASS", wl, mode, rep, ckpt, restore, extra)
        else:
            self.record("FAIL", wl, mode, rep, ckpt, restore, str(error) or type(error).__name__)
            case.keep_failure()
        for sid in case.sessions + case.launched():
            if not processes.end_session(sid):
                self.say(f"warning: session {sid} of {name} does not go away")
        # What a failed case left in the store (the run goes on: later
        # cases have their own pids).
        if error is not None and gpu_host.mounted(self.mnt):
            for i in self.daemon.ids():
                subprocess.run(["rm", "-r", os.path.join(self.mnt, "checkpoints", i)],
                               capture_output=True)
        shutil.rmtree(os.path.join(case.dir, "copy"), ignore_errors=True)
        if error is not None:
            if isinstance(error, Failure):
                pytest.fail(str(error), pytrace=False)
            raise error

    def close(self):
        if getattr(self, "closed", False):
            return
        if getattr(self, "cases", None) is not None and os.path.exists(self.summary):
            total = int(time.monotonic() - self.t_start)
            with open(self.summary, "a") as f:
                f.write(f"total {total} s, {self.reps_done} of {self.reps} repetitions\n")
            self.say(f"total {total} s; summary and logs in {self.out}")
            counts = f"{self.passed} passed, {self.failed} failed"
            print(counts, flush=True)
            RESULT_LINES.append(counts)
            with open(self.summary, "a") as f:
                f.write(counts + "\n")
        super().close()


@pytest.fixture(scope="module")
def suite(gpu_work):
    return gpu_work(Suite)


class Case:
    """One case's directory, its workloads' sessions and its figures."""

    def __init__(self, suite, name):
        self.s = suite
        self.name = name
        self.dir = os.path.join(suite.cases, name)
        self.user = suite.user
        self.daemon = suite.daemon
        self.mnt = suite.mnt
        self.user.give(self.dir)
        for f in (".started", "sessions"):
            open(os.path.join(self.dir, f), "a").close()
        self.sessions = []
        self.ckpt_s = self.restore_s = None
        self.details = []
        self.gpu_uuid = ""
        self.device_file = ""

    def launched(self):
        pids = []
        for d, _, names in os.walk(self.dir):
            if "launch.pid" in names:
                text = filetools.read_text(os.path.join(d, "launch.pid")).strip()
                if text.isdigit():
                    pids.append(int(text))
        return pids

    def session(self, pid):
        """The case's workload, to be killed if the case fails."""
        self.sessions.append(pid)
        self.s.session(pid)
        with open(os.path.join(self.dir, "sessions"), "a") as f:
            f.write(f"{pid}\n")

    def snap_status(self, pid, name):
        """Keeps <pid>/status for the logs."""
        with open(os.path.join(self.dir, f"status-{name}.txt"), "w") as f:
            f.write(self.daemon.status(pid))

    def keep_failure(self):
        """The case's small files, the CRIU logs of failed operations the
        daemon kept meanwhile (in its state directory, the default), the
        statuses of its pids."""
        dest = os.path.join(self.s.logs, "failures", self.name)
        os.makedirs(dest, exist_ok=True)
        for d, dirs, names in os.walk(self.dir):
            # (The case's files and those one directory down.)
            if d != self.dir:
                dirs[:] = []
            for n in names:
                p = os.path.join(d, n)
                try:
                    if not n.endswith(".bin") and os.path.isfile(p) and os.path.getsize(p) < 4 << 20:
                        shutil.copy(p, dest)
                except OSError:
                    pass
        for pid in self.sessions:
            if os.path.isfile(os.path.join(self.mnt, str(pid), "status")):
                with open(os.path.join(dest, f"status-{pid}-at-failure.txt"), "w") as f:
                    f.write(self.daemon.status(pid))
        with open(os.path.join(dest, "restore-at-failure.txt"), "w") as f:
            f.write(self.user.cat(os.path.join(self.mnt, "restore")) + "\n")
        if os.path.isdir(gpu_host.CRIU_LOGS):
            since = os.path.getmtime(os.path.join(self.dir, ".started"))
            for d, _, names in os.walk(gpu_host.CRIU_LOGS):
                for n in names:
                    p = os.path.join(d, n)
                    try:
                        if os.path.isfile(p) and os.path.getmtime(p) > since:
                            rel = os.path.relpath(p, gpu_host.CRIU_LOGS)
                            os.makedirs(os.path.dirname(os.path.join(dest, "criu-logs", rel)),
                                        exist_ok=True)
                            shutil.copy(p, os.path.join(dest, "criu-logs", rel))
                    except OSError:
                        pass
        with open(os.path.join(dest, "daemon-tail.txt"), "w") as f:
            f.write(self.daemon.log_tail(100) + "\n")

    # --- steps ---------------------------------------------------------------------------

    def start(self, directory, argv, ready, seconds, what):
        """Starts a workload as the user, waits for its ready file; its pid."""
        workloads.start_session(self.user, directory, argv)
        pid = workloads.wait_ready(ready, seconds, os.path.join(directory, "launch.pid"))
        if pid is None:
            fail(f"{what} never got ready: {filetools.last_chars(os.path.join(directory, 'out.log'), 600)}")
        self.session(pid)
        return pid

    def start_gpu_memory(self, *args):
        result = os.path.join(self.dir, "result")
        return self.start(self.dir, [self.s.bundle.gpu_memory, result, *args], result + ".ready",
                          120, "gpu_memory")

    def uuid_known(self, text):
        """text names one of this machine's GPUs (nvidia-smi's UUIDs)."""
        text = text.lower()
        return any(u.lower().removeprefix("gpu-") in text for u in self.s.gpu_uuids)

    def live_gpu_status(self, pid):
        """Within 10 s <pid>/ appears in the mount, and within 10 s more its
        status shows "gpu state: running" and a "gpu: " line with this
        machine's GPU."""
        status = os.path.join(self.mnt, str(pid), "status")
        for _ in range(100):
            if os.path.isfile(status):
                break
            time.sleep(0.1)
        if not os.path.isfile(status):
            fail(f"{self.mnt}/{pid} does not appear within 10 s (not seen as a GPU process?)")
        st = ""
        for _ in range(100):
            st = self.daemon.status(pid)
            lines = st.splitlines()
            gpu = "\n".join(x for x in lines if x.startswith("gpu: "))
            if "gpu state: running" in lines and self.uuid_known(gpu):
                return
            time.sleep(0.1)
        fail(f"status of pid {pid} lacks 'gpu state: running' or a 'gpu: ' line with "
             f"{' '.join(self.s.gpu_uuids)}: {'|'.join(st.splitlines())}")

    def checkpoint(self, pid, opts=""):
        """Through ctl; the new checkpoint's id (its time in ckpt_s)."""
        before = self.daemon.ids()
        t0 = time.monotonic()
        command = "checkpoint" + (f" {opts}" if opts else "")
        rc, err = self.user.write(os.path.join(self.mnt, str(pid), "ctl"), command, 300)
        if rc != 0:
            fail(f"{command} of pid {pid}: {err}; {self.daemon.status_line(pid, 'last:')}")
        self.ckpt_s = gpu_host.elapsed(t0)
        added = gpu_host.new_ids(before, self.daemon.ids())
        if len(added) != 1:
            fail(f"checkpoint of pid {pid} added ids: '{' '.join(added)}'")
        ckpt = added[0]
        try:
            shutil.copyfile(os.path.join(self.mnt, "checkpoints", ckpt, "manifest.json"),
                            os.path.join(self.dir, f"manifest-{ckpt}.json"))
        except OSError as e:
            fail(f"cannot read {self.mnt}/checkpoints/{ckpt}/manifest.json: {e}")
        return ckpt

    def hidden_from_others(self, pid, ckpt):
        """Another user (nobody) finds neither the process nor its checkpoint
        (nor its device view) in the mount, by listing or by name. Only when
        the workloads run as an ordinary user."""
        if self.user.uid == 0:
            return
        m = self.mnt
        listed = subprocess.run(users.NOBODY + ["ls", "-a", m, f"{m}/checkpoints", f"{m}/device"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace").stdout
        if str(pid) in listed.splitlines() or ckpt in listed.splitlines():
            fail(f"another user lists pid {pid} or checkpoint {ckpt}: {' '.join(listed.split())}")
        for p in (f"{m}/{pid}", f"{m}/{pid}/status", f"{m}/checkpoints/{ckpt}",
                  f"{m}/checkpoints/{ckpt}/manifest.json", f"{m}/device/{ckpt}"):
            if subprocess.run(users.NOBODY + ["stat", p], capture_output=True).returncode == 0:
                fail(f"another user can stat {p}")

    def after_checkpoint(self, pid, mode):
        """kill -> gone; leave-running -> runs, unfrozen, and its GPU is back."""
        if mode == "kill":
            if not processes.gone(pid, 30):
                fail(f"pid {pid} still running 30 s after checkpoint --kill")
            return
        state = ""
        for _ in range(100):
            state = processes.proc_state(pid)
            if not state:
                fail(f"pid {pid} is gone after a leave-running checkpoint")
            if state not in ("T", "t") and self.daemon.gpu_running(pid):
                return
            time.sleep(0.1)
        self.snap_status(pid, "after-checkpoint")
        fail(f"pid {pid} is not running with its GPU 10 s after the checkpoint (state {state}; "
             f"{self.daemon.status_line(pid, 'gpu state')})")

    def check_manifest(self, ckpt):
        """Backend cuda, a driver version, this machine's GPU, the user as
        owner and maker; sets gpu_uuid (as the manifest spells it)."""
        with open(os.path.join(self.mnt, "checkpoints", ckpt, "manifest.json")) as f:
            m = json.load(f)
        uid = self.user.uid
        known = [u.lower().removeprefix("gpu-") for u in self.s.gpu_uuids]

        def get(k):
            return m.get(k, m.get("extra", {}).get(k))

        problems = []
        if get("gpu_backend") != "cuda":
            problems.append("gpu_backend is %r, not 'cuda'" % get("gpu_backend"))
        if not get("driver_version"):
            problems.append("no driver_version")
        if (get("owner") or {}).get("uid") != uid or (get("made_by") or {}).get("uid") != uid:
            problems.append("owner %r / made_by %r, not uid %d" % (get("owner"), get("made_by"), uid))
        gpus = get("gpus") or []
        if not gpus:
            problems.append("no gpus listed")
        uuid = ""
        for g in gpus:
            for k in ("name", "uuid", "memory_bytes"):
                if not g.get(k):
                    problems.append("a gpu without %s: %r" % (k, g))
            u = str(g.get("uuid", ""))
            if u.lower().removeprefix("gpu-") in known:
                uuid = uuid or u
            else:
                problems.append("gpu uuid %r is not one of nvidia-smi's %r" % (u, self.s.gpu_uuids))
        for k in ("logical_bytes", "new_bytes", "stored_bytes"):
            if k not in m:
                problems.append("no %s" % k)
        if problems:
            fail(f"manifest of {ckpt}: {'; '.join(problems)}")
        self.gpu_uuid = uuid

    def check_device(self, ckpt, want):
        """device/<id> has cuda-ranges.json naming one cuda-<pid>-<hex>.bin
        per range, each as long as its range, together at least `want`
        bytes; the first 64 bytes of the largest read with hexdump. Sets
        device_file (the largest)."""
        d = os.path.join(self.mnt, "device", ckpt)
        if not os.path.isdir(d):
            fail(f"device/{ckpt}: no {d} directory")
        names = sorted(os.listdir(d))
        if "cuda-ranges.json" not in names:
            fail(f"device/{ckpt}: no cuda-ranges.json in device/ (has {names[:10]!r})")
        with open(os.path.join(d, "cuda-ranges.json")) as f:
            ranges = json.load(f).get("ranges", [])
        if not ranges:
            fail(f"device/{ckpt}: cuda-ranges.json lists no ranges")
        problems, total, biggest = [], 0, ("", -1)
        for r in ranges:
            f = os.path.basename(str(r.get("file", "")))
            if not re.fullmatch(r"cuda-\d+-[0-9a-f]+\.bin", f):
                problems.append("range file name %r" % f)
            p = os.path.join(d, f)
            if not os.path.isfile(p):
                problems.append("%s is listed but missing" % f)
                continue
            size = os.path.getsize(p)
            if size != r["end"] - r["start"]:
                problems.append("%s has %d bytes, its range %d" % (f, size, r["end"] - r["start"]))
            total += size
            if size > biggest[1]:
                biggest = (f, size)
        bins = [n for n in names if n.startswith("cuda-") and n.endswith(".bin")]
        if len(bins) != len(ranges):
            problems.append("%d .bin files for %d ranges" % (len(bins), len(ranges)))
        if total < want:
            problems.append("device files hold %d bytes, the workload has %d" % (total, want))
        if problems:
            fail(f"device/{ckpt}: {'; '.join(problems[:5])}")
        self.device_file = biggest[0]
        head = os.path.join(self.dir, "device-head.txt")
        with open(head, "w") as out:
            rc = subprocess.run(self.s.hexdump + [os.path.join(d, self.device_file)], stdout=out,
                                stderr=subprocess.STDOUT).returncode
        if rc != 0:
            fail(f"{' '.join(self.s.hexdump)} {d}/{self.device_file}: {filetools.read_text(head)}")
        if os.path.getsize(head) == 0:
            fail(f"{' '.join(self.s.hexdump)} of {d}/{self.device_file} printed nothing")
        with open(os.path.join(self.dir, "device-summary.txt"), "w") as f:
            f.write(f"{len(ranges)} ranges, {total} bytes\n")

    def copy_out(self, ckpt, dest):
        """cp -r of the checkpoint, as its owner: what a restore needs, each
        byte once (no device view; its files add up to no more than the
        checkpoint's logical size)."""
        t0 = time.monotonic()
        src = os.path.join(self.mnt, "checkpoints", ckpt)
        rc, said = self.user.run(["timeout", "-k", "5", "300", "cp", "-r", src, dest], timeout=320)
        if rc != 0:
            fail(f"cp -r {src} {dest} failed: {said.strip()}")
        self.details.append(f"cp -r {gpu_host.elapsed(t0)} s")
        if os.path.exists(os.path.join(dest, "device")):
            fail(f"the copy of {ckpt} has a device/ directory")
        copy_bytes = filetools.file_bytes(dest)
        logical = gpu_host.manifest_get(os.path.join(self.dir, f"manifest-{ckpt}.json"),
                                      "logical_bytes")
        if not isinstance(logical, int):
            fail(f"manifest of {ckpt} has no logical_bytes")
        # (+ 1 MiB: manifest.json is in the copy; the logical size counts images.)
        if copy_bytes > logical + (1 << 20):
            fail(f"the copy of {ckpt} holds {copy_bytes} bytes, its logical size is {logical}")
        self.details.append(f"copy {copy_bytes} bytes, logical {logical}")

    def same_device_view(self, ckpt, other):
        """The largest device file reads the same in both (a copy's import
        shows the device memory its images carry)."""
        a = os.path.join(self.mnt, "device", ckpt, self.device_file)
        b = os.path.join(self.mnt, "device", other, self.device_file)
        if not filetools.same_file(a, b):
            fail(f"device/{other}/{self.device_file} (the copy's import) differs from "
                 f"device/{ckpt}/{self.device_file}")

    def restore(self, args, pid):
        """Writes args into restore; the process must come back with its pid,
        in cgroups of its own. Returns the time it took."""
        t0 = time.monotonic()
        restore = os.path.join(self.mnt, "restore")
        rc, err = self.user.write(restore, args, 300)
        if rc != 0:
            fail(f"restore of '{args}': {err}; restore says: {self.user.cat(restore)}")
        took = gpu_host.elapsed(t0)
        said = self.user.cat(restore)
        # `pid N`, and for a copy a second line naming its import.
        if said.split("\n")[0] != f"pid {pid}":
            fail(f"restore of '{args}': restore says '{said}', expected 'pid {pid}'")
        # In cgroups of its own (tools/README.md, "Running as a service"): stopping
        # the daemon, which kills its cgroup, must not touch it. (Where the
        # cgroup filesystem is mounted read-only, as in some containers,
        # there is nowhere else to go.)
        options = subprocess.run(["findmnt", "-no", "OPTIONS", "/sys/fs/cgroup"],
                                 capture_output=True, text=True).stdout
        if options.startswith("rw"):
            daemon = set(filetools.read_text(f"/proc/{self.daemon.pid}/cgroup").splitlines())
            shared = daemon & set(filetools.read_text(f"/proc/{pid}/cgroup").splitlines())
            if shared:
                fail(f"restored pid {pid} shares the daemon's cgroup: {' '.join(sorted(shared))}")
        return took

    def check_memory(self, pid, result, what):
        """SIGUSR1 -> PASS."""
        ok, said = workloads.verdict(pid, result)
        if not ok:
            fail(f"{what}: {said}")

    def check_train(self, pid, log, what):
        """The run ends by itself within its steps' time (+2 min) and leaves
        a log equal to the reference's."""
        if not processes.gone(pid, self.s.steps * STEP_MS // 1000 + 120):
            fail(f"{what}: pid {pid} still running after its steps' time")
        if not os.path.isfile(log) or os.path.getsize(log) == 0:
            fail(f"{what}: pid {pid} ended without writing its log")
        if not filetools.same_file(self.s.ref_log, log):
            shutil.copyfile(log, os.path.join(self.dir, f"log-{time.time_ns()}.txt"))
            fail(f"{what}: the log differs from the reference's: "
                 f"{filetools.first_difference(self.s.ref_log, log)}")

    def drop_checkpoints(self):
        """Removes every checkpoint (with the copies' imports)."""
        for i in self.daemon.ids():
            if subprocess.run(["rm", "-r", os.path.join(self.mnt, "checkpoints", i)]).returncode:
                fail(f"rm -r checkpoints/{i} failed")

    def start_train(self, directory, log, ready, what):
        return self.start(directory, ["python3", self.s.train_py, "--steps", str(self.s.steps),
                                      "--step-ms", str(STEP_MS), "--log", log, "--ready", ready],
                          ready, 180, what)


# --- the cases ---------------------------------------------------------------------------


def case_reference(c):
    """Two uninterrupted runs of train.py at once; their logs must be equal
    (else the comparison after restores would mean nothing)."""
    s = c.s
    logs = {}
    argv = {}
    for run in ("a", "b"):
        d = os.path.join(c.dir, run)
        logs[run] = os.path.join(d, "train.log")
        argv[run] = ["python3", s.train_py, "--steps", str(s.steps), "--step-ms", str(STEP_MS),
                     "--log", logs[run], "--ready", os.path.join(d, "ready")]
        workloads.start_session(c.user, d, argv[run])
    pids = {}
    for run in ("a", "b"):
        d = os.path.join(c.dir, run)
        pid = workloads.wait_ready(os.path.join(d, "ready"), 180, os.path.join(d, "launch.pid"))
        if pid is None:
            fail(f"train.py (reference {run}) never got ready: "
                 f"{filetools.last_chars(os.path.join(d, 'out.log'), 800)}")
        c.session(pid)
        pids[run] = pid
    for run in ("a", "b"):
        if not processes.gone(pids[run], s.steps * STEP_MS // 1000 + 120):
            fail(f"reference {run} still runs after its steps' time")
    a = filetools.read_text(logs["a"])
    if not a:
        fail("reference a wrote no log")
    errors = [line for line in a.splitlines() if line.startswith("error")]
    if errors:
        fail(f"reference a: {' '.join(errors)[:800]}")
    if len(a.splitlines()) != s.steps:
        fail(f"reference a logged {len(a.splitlines())} steps, not {s.steps}")
    if not filetools.same_file(logs["a"], logs["b"]):
        fail("two uninterrupted runs of train.py differ: it is not deterministic here: "
             + filetools.first_difference(logs["a"], logs["b"]))
    shutil.copyfile(logs["a"], os.path.join(s.work, "reference.log"))
    s.ref_log = os.path.join(s.work, "reference.log")


def case_lock_timeout(c):
    """A kernel spins 4 s; a checkpoint with a 300 ms lock timeout must
    fail, say so, and leave the process running and correct."""
    result = os.path.join(c.dir, "result")
    pid = c.start_gpu_memory("--gib", "1", "--busy-kernel-ms", str(LOCK_BUSY_MS))
    t_ready = time.monotonic()
    for _ in range(100):
        if os.path.isfile(os.path.join(c.mnt, str(pid), "status")):
            break
        time.sleep(0.05)
    before = c.daemon.ids()
    t0 = time.monotonic()
    rc, err = c.user.write(os.path.join(c.mnt, str(pid), "ctl"),
                           f"checkpoint --lock-timeout {LOCK_TIMEOUT_MS}", 60)
    c.ckpt_s = gpu_host.elapsed(t0)
    c.snap_status(pid, "after")
    if rc in (124, 137):
        fail(err)
    if rc == 0:
        fail(f"the checkpoint succeeded {t0 - t_ready:.2f} s after ready, while a {LOCK_BUSY_MS} ms "
             "kernel should still have run")
    last = c.daemon.status_line(pid, "last:")
    if not re.search("lock|time", last.lower()):
        fail(f"status's last line does not mention the lock or a timeout: '{last}' (write said: {err})")
    if gpu_host.new_ids(before, c.daemon.ids()):
        fail("a failed checkpoint left a checkpoint behind")
    state = ""
    for _ in range(100):
        state = processes.proc_state(pid)
        if not state:
            fail(f"pid {pid} is gone after the failed checkpoint")
        if state not in ("T", "t"):
            break
        time.sleep(0.1)
    if state in ("T", "t"):
        fail(f"pid {pid} is stopped (state {state}) 10 s after the failed checkpoint")
    c.details.append(f"write said: {err}; {last}")
    c.check_memory(pid, result, "after the failed checkpoint")


def case_bad_gpu_map(c):
    """A restore with --gpu-map onto a GPU that does not exist must be
    refused (write error, "error: ..." in restore) and bring nothing back;
    the same checkpoint then restores without the bad map."""
    result = os.path.join(c.dir, "result")
    pid = c.start_gpu_memory("--gib", "1")
    c.live_gpu_status(pid)
    ckpt = c.checkpoint(pid, "--kill")
    c.after_checkpoint(pid, "kill")
    c.check_manifest(ckpt)
    restore = os.path.join(c.mnt, "restore")
    t0 = time.monotonic()
    bad = f"{c.mnt}/checkpoints/{ckpt} --gpu-map {c.gpu_uuid}={BOGUS_GPU}"
    rc, err = c.user.write(restore, bad, 120)
    if rc == 0:
        fail(f"restore with --gpu-map {c.gpu_uuid}={BOGUS_GPU} succeeded: {c.user.cat(restore)}")
    took = gpu_host.elapsed(t0)
    said = c.user.cat(restore)
    if not said.startswith("error:"):
        fail(f"after a refused restore, restore says '{said}' (expected 'error: ...')")
    if os.path.exists(f"/proc/{pid}"):
        fail(f"pid {pid} runs after a refused restore")
    c.restore_s = took
    c.details.append(f"write said: {err}; restore said: {said}")
    c.restore(f"{c.mnt}/checkpoints/{ckpt}", pid)
    c.check_memory(pid, result, "restored without the bad map")
    c.drop_checkpoints()


def case_workload(c, wl, mode):
    """One round trip, described at the top."""
    s = c.s
    result = os.path.join(c.dir, "result")
    log = os.path.join(c.dir, "train.log")
    if wl == "gpu_memory":
        pid = c.start_gpu_memory("--gib", str(s.gib))
        min_bytes = s.gib << 30
    else:
        if not s.ref_log or not os.path.getsize(s.ref_log):
            fail("no reference log of train.py (its reference runs failed or did not run)")
        pid = c.start_train(c.dir, log, result + ".ready", "train.py")
        min_bytes = TRAIN_MIN_DEVICE_BYTES
    c.live_gpu_status(pid)
    c.snap_status(pid, "before")
    ckpt = c.checkpoint(pid, "--kill" if mode == "kill" else "")
    c.after_checkpoint(pid, mode)
    c.check_manifest(ckpt)
    c.hidden_from_others(pid, ckpt)
    c.check_device(ckpt, min_bytes)
    copy = os.path.join(c.dir, "copy")
    c.copy_out(ckpt, copy)
    if mode == "leave-running":
        if wl == "gpu_memory":
            c.check_memory(pid, result, "the original after its checkpoint")
        else:
            c.check_train(pid, log, "the original after its checkpoint")
    if not processes.end_session(pid):
        fail(f"pid {pid} does not go away")

    for source in ("copy", "mount"):
        if source == "copy":
            args = copy
            what = "restored from a cp -r copy"
        else:
            args = f"{c.mnt}/checkpoints/{ckpt} --gpu-map {c.gpu_uuid}={c.gpu_uuid}"
            what = f"restored from the mount with --gpu-map {c.gpu_uuid}={c.gpu_uuid}"
        if os.path.exists(log):
            os.unlink(log)
        before = c.daemon.ids()
        took = c.restore(args, pid)
        if source == "copy":
            c.details.append(f"restore from the copy {took} s")
            imported = gpu_host.new_ids(before, c.daemon.ids())
            if len(imported) != 1:
                fail(f"the restore from the copy imported '{' '.join(imported)}'")
            c.same_device_view(ckpt, imported[0])
        else:
            c.restore_s = took
        if wl == "gpu_memory":
            c.check_memory(pid, result, what)
        else:
            c.check_train(pid, log, what)
        if not processes.end_session(pid):
            fail(f"pid {pid} does not go away after its check")
    shutil.rmtree(copy, ignore_errors=True)
    c.drop_checkpoints()


# --- the tests, in the order they run ------------------------------------------------------


def test_reference_runs(suite):
    suite.say(f"reference runs of train.py ({suite.steps} steps, {STEP_MS} ms each)")
    suite.run_case("reference", "train.py", "reference", "-", case_reference)


def test_lock_timeout(suite):
    suite.say("a checkpoint whose GPU lock must time out")
    suite.run_case("lock-timeout", "gpu_memory", "lock-timeout", "-", case_lock_timeout)


def test_bad_gpu_map(suite):
    suite.say("a restore onto an unknown GPU")
    suite.run_case("bad-gpu-map", "gpu_memory", "bad-gpu-map", "-", case_bad_gpu_map)


def test_workload(suite, rep_case):
    rep, wl, mode = rep_case
    if suite.stopped:
        pytest.skip(suite.stopped)
    if rep not in suite.rep_started:
        used = int(time.monotonic() - suite.t_start)
        if rep > 1 and used + suite.longest > suite.budget:
            suite.stopped = (f"stopping after {suite.reps_done} of {suite.reps} repetitions: {used} s "
                             f"used, a repetition takes up to {suite.longest} s, budget "
                             f"{suite.budget} s")
            suite.say(suite.stopped)
            with open(suite.summary, "a") as f:
                f.write(f"note: stopped after {suite.reps_done} of {suite.reps} repetitions "
                        f"(time budget {suite.budget} s)\n")
            pytest.skip(suite.stopped)
        suite.rep_started[rep] = time.monotonic()
    last_of_rep = (wl, mode) == (WORKLOADS[-1], MODES[-1])
    suite.say(f"rep {rep}: {wl}, {mode}")
    try:
        suite.run_case(f"{wl}-{mode}-r{rep}", wl, mode, rep, case_workload, wl, mode)
    finally:
        if last_of_rep:
            rc, err = users.as_root().write(os.path.join(suite.mnt, "ctl"), "gc", 300)
            if rc != 0:
                suite.say(f"warning: gc failed: {err}")
            suite.reps_done = rep
            took = int(time.monotonic() - suite.rep_started[rep])
            suite.longest = max(suite.longest, took)
            suite.say(f"rep {rep} took {took} s")
