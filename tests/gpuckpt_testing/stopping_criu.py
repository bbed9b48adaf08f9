"""A CRIU for the daemon whose chosen commands stop themselves (SIGSTOP)
before CRIU starts, until a test continues them: a test that must act
while a dump or restore is in flight then need not race it, however fast
the machine. Optionally its lazy-pages servers are stopped as soon as they
listen (before the restore that uses them has restored anything), so that
a lazily restored tree waits at its first fault until the test continues
its server. Its lazy-pages servers may also be asked to log at CRIU's debug
level (-v4, after the daemon's own -v2)."""

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

# The lazy-pages server is held once it listens: one of its sockets is in
# /proc/net/unix with the listening flag (__SO_ACCEPTCON). Its socket file
# alone is not enough: it appears at bind(), and a server stopped before its
# listen() refuses the restore's connection. The script becomes the server
# (exec), so that the server keeps the pid the daemon started and knows (it
# reads the server's opens past the page cache, and reads ahead for them, by
# that pid); a watcher, orphaned so that it is not the server's child, stops
# it and leaves its pid in held.PID beside the script. A server listens only
# until the restore connects, so a watcher slow to look (a loaded machine)
# could miss that: the restore it serves (the same work dir, -W) waits for
# the server to be held before it starts (up to 60 s), and then connects
# to the stopped server's backlog.
HOLD_LAZY_PAGES = """#!/bin/sh
listening() {{
  for fd in "/proc/$server"/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    case "$target" in
      socket:*) inode=${{target#socket:[}}; inode=${{inode%]}}
        awk -v inode="$inode" '$7 == inode && $4 == "00010000" {{ found = 1 }}
          END {{ exit !found }}' /proc/net/unix && return 0 ;;
    esac
  done
  return 1
}}
work_key() {{
  work=; prev=
  for a in "$@"; do
    [ "$prev" = -W ] && work=$a
    prev=$a
  done
  printf %s "$work" | cksum | cut -d' ' -f1
}}
if [ "$1" = lazy-pages ]; then
  server=$$
  key=$(work_key "$@")
  ( (while kill -0 $server 2>/dev/null; do
       if listening; then
         kill -STOP $server && echo $server > {dir}/held.$server &&
           : > {dir}/listening.$key
         exit 0
       fi
       sleep 0.001
     done) & )
  exec {criu} "$@"
fi
if [ "$1" = restore ]; then
  for a in "$@"; do
    if [ "$a" = --lazy-pages ]; then
      key=$(work_key "$@") waited=0
      while [ ! -e {dir}/listening.$key ] && [ $waited -lt 6000 ]; do
        sleep 0.01
        waited=$((waited + 1))
      done
    fi
  done
fi
"""

# Goes right after the shebang, so that a held server's exec gets it too;
# appended, it wins over the daemon's -v2 (CRIU takes the last -v).
LAZY_PAGES_DEBUG = """if [ "$1" = lazy-pages ]; then set -- "$@" -v4; fi
"""


class StoppingCriu:
    """The wrapper's file, in a directory of its own that every user may
    enter: CRIU runs as the tree's owner for an ordinary user's tree.
    Owns that directory (removed by close()); not thread-safe."""

    def __init__(self, verbs=("dump", "restore"), hold_lazy_pages=False, lazy_pages_debug=False):
        self.dir = tempfile.mkdtemp(prefix="gpuckpt-stopping-criu.", dir="/var/tmp")
        os.chmod(self.dir, 0o755)
        self.path = os.path.join(self.dir, "criu")
        self.taken = set()  # held.PID files held_lazy_server() returned
        script = SCRIPT.format(verbs="|".join(verbs) or "-", criu=build.CRIU)
        if hold_lazy_pages:
            script = (HOLD_LAZY_PAGES.format(criu=build.CRIU, dir=self.dir) +
                      script.split("\n", 1)[1])
        if lazy_pages_debug:
            shebang, rest = script.split("\n", 1)
            script = shebang + "\n" + LAZY_PAGES_DEBUG + rest
        with open(self.path, "w") as f:
            f.write(script)
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

    def held_lazy_server(self, seconds=60):
        """The pid of a lazy-pages server of this wrapper's, stopped once it
        listened (and not taken before)."""
        found = []

        def look():
            found[:] = []
            for name in os.listdir(self.dir):
                if name.startswith("held.") and name not in self.taken:
                    pid = int(name[len("held."):])
                    if proc_state(pid) in ("T", "t"):
                        found.append(name)
            return bool(found)
        wait_for(look, seconds, "a lazy-pages server to be held")
        self.taken.add(found[0])
        return int(found[0][len("held."):])

    @staticmethod
    def resume(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)
