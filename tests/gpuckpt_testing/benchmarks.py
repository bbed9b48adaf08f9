"""What the benchmark drivers (tests/bench/checkpoint_bench, pool_bench,
store_bench and tests/gpu/gpu_bench) share: their options' types, their
work dir, the page cache, how CRIU must run on this machine, and the facts
about the machine and the build that their reports state."""

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time

from gpuckpt_testing.build import REPO_ROOT
from gpuckpt_testing.messages import Failed


GiB = 1 << 30


def positive_int(text):
    if not re.fullmatch(r"[1-9][0-9]*", text):
        raise argparse.ArgumentTypeError("must be a positive integer")
    return int(text)


def non_negative_int(text):
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError("must be a non-negative integer")
    return int(text)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def check_drop_caches():
    """Cold reads mean an empty page cache; without it the numbers would lie."""
    try:
        drop_caches()
    except OSError:
        raise Failed("cannot write /proc/sys/vm/drop_caches "
                     "(run as root, on a host that allows it)")


def fresh_work_dir(work, marker, prog):
    """Empties `work` for a run, but never a directory that the benchmark
    did not make (`marker` in it says it did), nor one of the usual roots."""
    if work in ("/", "/var", "/var/tmp", "/tmp", os.path.expanduser("~"), REPO_ROOT):
        raise Failed(f"refusing to use {work} as work dir")
    if os.path.exists(work):
        if not os.path.isfile(os.path.join(work, marker)) and os.listdir(work):
            raise Failed(f"{work} exists, is not empty and was not made by {prog}; remove it or "
                         "pass --work")
        if os.path.ismount(os.path.join(work, "mnt")):
            subprocess.run(["fusermount3", "-u", os.path.join(work, "mnt")])
        shutil.rmtree(work)
    os.makedirs(work)
    open(os.path.join(work, marker), "w").close()


def hardware_breakpoints_fire(criu, env=None):
    """Whether a plain dump of `sleep` ends: where hardware breakpoints
    never fire (some virtual machines) it hangs, and gpuckptfs runs CRIU
    with CRIU_FAULT=130 (core/criu/breakpoint_probe.h). `env`: criu's
    environment (default this process's)."""
    probe_dir = tempfile.mkdtemp(prefix="gpuckpt-bp-probe.", dir="/dev/shm")
    sleeper = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        time.sleep(0.2)
        try:
            r = subprocess.run([criu, "dump", "--leave-running", "-t", str(sleeper.pid),
                                "-D", probe_dir, "-o", "dump.log"], timeout=20,
                               capture_output=True, env=env)
            return r.returncode == 0
        except subprocess.TimeoutExpired:
            return False
    finally:
        sleeper.kill()
        sleeper.wait()
        shutil.rmtree(probe_dir, ignore_errors=True)


def run_criu_as_gpuckptfs_does(criu, say, env=None):
    """Sets CRIU_FAULT=130 in this process's environment, for the plain
    CRIU it starts from now on, where hardware breakpoints do not fire
    (hardware_breakpoints_fire(criu, env)) and it is not set already, and
    says so: gpuckptfs finds that out the same way and runs its CRIU so."""
    if "CRIU_FAULT" not in os.environ and not hardware_breakpoints_fire(criu, env):
        os.environ["CRIU_FAULT"] = "130"
        say("hardware breakpoints do not fire here: CRIU runs with CRIU_FAULT=130, as in "
            "gpuckptfs")


def build_type(start):
    """CMAKE_BUILD_TYPE of the CMake build that `start` (a build dir or a
    file in one) belongs to: "" where unset, None where there is no build."""
    d = start if os.path.isdir(start) else os.path.dirname(start)
    while d != "/" and not os.path.isfile(os.path.join(d, "CMakeCache.txt")):
        d = os.path.dirname(d)
    cache = os.path.join(d, "CMakeCache.txt")
    if not os.path.isfile(cache):
        return None
    with open(cache) as f:
        m = re.search(r"^CMAKE_BUILD_TYPE:[A-Z]*=(.*)$", f.read(), re.M)
    return m.group(1) if m else ""


def git(*args):
    """git's output in the source tree, "" where there is none."""
    r = subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def load_average(say):
    """The load average now; warns where other work will skew the numbers
    (say so rather than hide it)."""
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    if float(load) > os.cpu_count() / 2:
        say(f"warning: load average is {load}; timings will be noisy")
    return load


def cpu_model():
    with open("/proc/cpuinfo") as f:
        return next((line.split(": ", 1)[1].strip() for line in f
                     if line.startswith("model name")), "")


def meminfo_kib(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def mb(size):
    """Bytes in MB (10^6 bytes), one decimal."""
    return f"{size / 1e6:.1f}"
