"""Where the programs under test are: the built gpuckptfs, the workloads
and the CLI beside them (GPUCKPTFS and WORKLOAD_BIN in the environment, as
ctest sets them), CRIU, and the repository itself.

Read these as `build.GPUCKPTFS` at the time of use, not copied at import:
a test may point them elsewhere (at the GPU bundle's, or at a wrapper)."""

import os
import shutil

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

GPUCKPTFS = os.environ.get("GPUCKPTFS", "")
WORKLOAD_BIN = os.environ.get("WORKLOAD_BIN", "")
# The store's command line, built beside the workloads.
GPUCKPT_CLI = os.path.join(WORKLOAD_BIN, "tools", "gpuckpt", "gpuckpt")
CRIU = shutil.which("criu") or "/usr/local/sbin/criu"
# The Slurm plugin and the program its jobs run, built beside the workloads.
SLURM_PLUGIN = os.path.join(WORKLOAD_BIN, "lib", "gpuckpt", "gpuckpt_spank.so")
SLURM_HELPER = os.path.join(WORKLOAD_BIN, "libexec", "gpuckpt", "gpuckpt-slurm")

PYTHON = "/usr/bin/python3"
