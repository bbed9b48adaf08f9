#!/usr/bin/env bash
# Proves the workloads with plain CRIU, no gpuckpt involved: each one is
# started, dumped (which kills it), restored twice from the same images, and
# must say PASS after each restore. Run it wherever gpuckpt is to be tested
# (e.g. a GPU machine) to tell CRIU's problems from gpuckpt's.
#   plain_criu_check.sh WORKLOAD_BIN_DIR [WORKLOAD[:ARGS]...]
# e.g. plain_criu_check.sh build wl_memory "wl_big:--mib 256"
# Without workloads: wl_memory wl_threads wl_files wl_tree "wl_big:--mib 1024".
# Needs root and criu (CRIU=/path/to/criu to choose one). Work files stay in
# $WORK (default: a new dir under /var/tmp) only when a check fails.
set -euo pipefail
BIN=$(realpath "$1")
shift
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
# No hardware breakpoints (CRIU's FI_NO_BREAKPOINTS), as gpuckptfs runs
# CRIU: on some virtual machines they never fire and CRIU hangs.
export CRIU_FAULT=${CRIU_FAULT-130}

if [[ $(id -u) != 0 ]]; then echo "SKIP: needs root (CRIU dumps as root)"; exit 77; fi
if ! "$CRIU" --version >/dev/null 2>&1; then echo "SKIP: no usable criu at $CRIU"; exit 77; fi
# Restored processes are orphans; where PID 1 does not reap them, their
# zombies keep their pids and a second restore fails. Reap them ourselves.
if [[ -z ${GPUCKPT_UNDER_REAPER:-} ]]; then
  GPUCKPT_UNDER_REAPER=1 exec "$BIN/wl_reaper" "$0" "$BIN" "$@"
fi

(($# > 0)) || set -- wl_memory wl_threads wl_files wl_tree "wl_big:--mib 1024"
work=${WORK:-$(mktemp -d /var/tmp/gpuckpt-plain-criu.XXXXXX)}
pid=
cleanup() {
  # The workload's whole session (setsid made its pid the session id).
  if [[ -n $pid ]]; then pkill -KILL -s "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for log in "$dir"/dump.log "$dir"/restore*.log; do
    [[ -f $log ]] || continue
    echo "--- last lines of $log" >&2
    tail -n 15 "$log" >&2
  done
  echo "work files kept in $work" >&2
  trap - EXIT
  cleanup
  exit 1
}

# wait_for and gone.
# shellcheck source=tests/workloads/wait.sh
source "$(dirname "${BASH_SOURCE[0]}")/wait.sh"

# verdict NAME RESULT: SIGUSR1, then PASS within the time limit.
verdict() {
  rm -f "$2"
  [[ -e /proc/$pid ]] || fail "$1: pid $pid is not running after restore"
  kill -USR1 "$pid"
  wait_for "$2" 120 || fail "$1: no verdict in $2"
  [[ $(cat "$2") == PASS ]] || fail "$1: $(cat "$2")"
  gone "$pid" 30 || fail "$1: pid $pid still there after its verdict"
}

for spec in "$@"; do
  name=${spec%%:*}
  args=()
  [[ $spec == *:* ]] && read -ra args <<<"${spec#*:}"
  dir=$work/$name
  rm -rf "$dir"
  mkdir -p "$dir/images"
  result=$dir/result
  start=$SECONDS
  # setsid: its own session, so CRIU needs no --shell-job; no terminal.
  # In a subshell, so that it is no job of ours: the reaper reaps it.
  (setsid "$BIN/$name" "$result" "${args[@]}" </dev/null >"$dir/out.log" 2>&1 &)
  wait_for "$result.ready" 300 || fail "$name: never got ready (see $dir/out.log)"
  pid=$(cat "$result.ready")
  "$CRIU" dump -t "$pid" -D "$dir/images" -o ../dump.log -v4 || fail "$name: criu dump failed"
  gone "$pid" 30 || fail "$name: still running after criu dump"
  for round in 1 2; do
    "$CRIU" restore -d -D "$dir/images" -o "../restore$round.log" -v4 ||
      fail "$name: criu restore #$round failed"
    verdict "$name (restore #$round)" "$result"
  done
  size=$(du -sh "$dir/images" | cut -f1)
  echo "ok: $name ${args[*]}: dump + 2 restores PASS (images $size, $((SECONDS - start)) s)"
  rm -rf "$dir"
done
pid=
rm -rf "$work"
echo "PASS: plain_criu_check"
