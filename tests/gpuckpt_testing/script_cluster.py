"""A test cluster that a script of tools/ starts and stops in a directory
(tools/micro-ceph, tools/micro-slurm): the script's calls, a start that
cleans up after itself, and the context manager. Subclasses name the script
and add their own calls."""

import os
import subprocess


class ScriptCluster:
    """Started in `dir` at construction (`script start DIR *start_args`);
    stop() (or leaving the `with` block) stops it and leaves `dir`."""

    SCRIPT = None  # the path of the tools/ script

    def __init__(self, dir, *start_args):
        self.dir = os.path.abspath(dir)
        try:
            self._run("start", self.dir, *start_args)
        except RuntimeError:
            # The script stops what it started when start fails; this is for
            # a start interrupted outright. Its own failure must not hide
            # why start failed.
            try:
                self.stop()
            except RuntimeError:
                pass
            raise

    def _run(self, *args):
        result = subprocess.run([self.SCRIPT, *args], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{os.path.basename(self.SCRIPT)} {' '.join(args)}: "
                               f"exit {result.returncode}: {result.stderr.strip()}")

    def stop(self):
        self._run("stop", self.dir)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
