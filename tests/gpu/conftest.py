"""Options and fixtures of the GPU tests (test_suite.py, test_ddp.py; the
fixtures bundle and bundle_mount of test_lazy_gpu.py and test_gpu_jobs.py).

Options (give them after the test file, from the repository root):

    --reps N          repetitions of the suite's cases (5)
    --gib N           gpu_memory's device memory in GiB (2)
    --steps N         train.py's steps, more than 20 (50)
    --ddp-steps N     ddp_train.py's steps, 40 or more (100)
    --ddp-gpus N      GPUs of the DDP job: 2, or 1 for both ranks on one GPU (2)
    --time-budget S   no repetition starts once it would end past S seconds (500)
    --as-user NAME    the workloads' user, made for the run when there is none
                      and removed after (gpuckpt-gpu-suite); `root`: all as root
    --out DIR         summaries and logs tarballs ($OUT, else out/gpu-suite and
                      out/gpu-ddp under the repository root)
    --keep            keep the work directory under /var/tmp
"""

import os

import pytest

from gpuckpt_testing import build, gpu_host, gpu_run, users
from gpuckpt_testing.mount import Mount


def pytest_addoption(parser):
    g = parser.getgroup("gpuckpt GPU tests")
    g.addoption("--reps", type=int, default=gpu_run.DEFAULTS["reps"], help="repetitions (5)")
    g.addoption("--gib", type=int, default=gpu_run.DEFAULTS["gib"], help="gpu_memory's GiB (2)")
    g.addoption("--steps", type=int, default=gpu_run.DEFAULTS["steps"], help="train.py's steps (50)")
    g.addoption("--ddp-steps", type=int, default=gpu_run.DEFAULTS["ddp_steps"],
                help="ddp_train.py's steps (100)")
    g.addoption("--ddp-gpus", type=int, choices=(1, 2), default=gpu_run.DEFAULTS["ddp_gpus"],
                help="GPUs of the DDP job: 2, or 1 for both ranks on one GPU (2)")
    g.addoption("--time-budget", type=int, default=gpu_run.DEFAULTS["time_budget"],
                help="seconds; no repetition starts that would end later (500)")
    g.addoption("--as-user", default=gpu_run.DEFAULTS["as_user"],
                help="the workloads' user (gpuckpt-gpu-suite), or root")
    g.addoption("--out", default=None,
                help="output directory ($OUT, else out/gpu-suite, out/gpu-ddp)")
    g.addoption("--keep", action="store_true", help="keep the work directory")


def pytest_configure(config):
    for name in ("reps", "gib", "steps", "ddp_steps", "time_budget"):
        if gpu_run.option(config, name) < 1:
            raise pytest.UsageError(f"--{name.replace('_', '-')} must be a positive integer "
                                    f"(got {gpu_run.option(config, name)})")
    if gpu_run.option(config, "steps") <= 20:
        raise pytest.UsageError("--steps must be more than 20 (the checkpoint has to land mid-run)")
    if gpu_run.option(config, "ddp_steps") < 40:
        raise pytest.UsageError("--ddp-steps must be 40 or more "
                                f"(got {gpu_run.option(config, 'ddp_steps')})")
    user = gpu_run.option(config, "as_user")
    if not users.USER_NAME_RE.fullmatch(user):
        raise pytest.UsageError(f"--as-user must be a user name (got '{user}')")


def pytest_terminal_summary(terminalreporter):
    if gpu_run.RESULT_LINES:
        terminalreporter.section("gpuckpt on the GPU")
        for line in gpu_run.RESULT_LINES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def gpu_work(request):
    """Makes a test module's run, a gpu_run.GpuWork (the work directory, the
    bundle, the workloads' user, the daemon's mount, the logs): call it
    with the class and its arguments. Closed at the end of the module:
    workloads ended, unmounted, the user removed, the summary and the logs
    tarball written into the output directory."""
    made = []

    def make(cls, *args):
        work = cls(request.config, *args)
        made.append(work)
        return work

    try:
        yield make
    finally:
        for work in made:
            work.close()


@pytest.fixture
def bundle():
    """The bundle of tests/gpu/prepare, unpacked."""
    gpu_host.unpack_bundle()
    return gpu_host.Bundle()


@pytest.fixture
def bundle_mount(bundle, request):
    """A mount (gpuckpt_testing.mount.Mount) of the bundle's gpuckptfs, CRIU
    and plugins, its workloads the bundle's (gpu_memory), in a work dir
    named after the test module; closed afterwards."""
    build.GPUCKPTFS = bundle.gpuckptfs
    build.WORKLOAD_BIN = os.path.join(bundle.root, "bin")
    prefix = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-") + "."
    m = Mount(prefix, "--criu", bundle.criu, "--criu-plugin-dir", bundle.criu_plugins,
              env=bundle.env())
    try:
        yield m
    finally:
        m.close()
