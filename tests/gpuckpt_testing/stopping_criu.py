"""A CRIU for the daemon whose chosen commands stop themselves (SIGSTOP)
before CRIU starts, until a test continues them: a test that must act
while a dump or restore is in flight then need not race it, however fast
the machine."""

import os
import shutil
import signal
import tempfile

from gpuckpt_testing import build
from gpuckpt_testing.processes import live_processes, proc_state, wait_for

SCRIPT = """#!/bin/sh
case "$1" in {verbs}) kill -STOP $$ ;; esac
exec {criu} "$@"
"""


class StoppingCriu:
    """The wrapper's file, in a directory of its own that every user may
    enter: CRIU runs as the tree's owner for an ordinary user's tree.
    Owns that directory (removed by close()); not thread-safe."""

    def __init__(self, verbs=("dump", "restore")):
        self.dir = tempfile.mkdtemp(prefix="gpuckpt-stopping-criu.", dir="/var/tmp")
        os.chmod(self.dir, 0o755)
        self.path = os.path.join(self.dir, "criu")
        with open(self.path, "w") as f:
            f.write(SCRIPT.format(verbs="|".join(verbs), criu=build.CRIU))
        os.chmod(self.path, 0o755)

    def stopped(self, verb, seconds=60):
        """The pid of one `sh WRAPPER VERB ...` that has stopped itself.
        Never sends SIGSTOP: one stopped from outside before its own
        `kill -STOP` would stop itself again once continued."""
        found = []
        want = os.fsencode(verb)

        def look():
            found[:] = [pid for pid in live_processes(
                lambda argv: len(argv) > 2 and argv[1] == os.fsencode(self.path)
                and argv[2] == want) if proc_state(pid) in ("T", "t")]
            return bool(found)
        wait_for(look, seconds, f"a {verb} to stop itself")
        return found[0]

    @staticmethod
    def resume(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)
