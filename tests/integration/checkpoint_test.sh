#!/usr/bin/env bash
# End-to-end test of gpuckptfs with real CRIU on a real FUSE mount: the
# self-checking workloads (tests/workloads/) are checkpointed through
# <pid>/ctl, copied out with cp -r, killed, restored from the copy and from
# the mount, and must say PASS each time; then bad input, concurrent
# checkpoints, a non-root user's view and rights, and a daemon killed with
# SIGKILL in the middle of a checkpoint.
#   checkpoint_test.sh GPUCKPTFS WORKLOAD_BIN_DIR
# KEEP_WORK=1 keeps the work dir of a failed run.
set -euo pipefail
GPUCKPTFS=$(realpath "$1")
BIN=$(realpath "$2")

if [[ ! -w /dev/fuse ]]; then
  echo "SKIP: /dev/fuse is not usable here, so no real mount can be tested"
  exit 77
fi
if [[ $(id -u) != 0 ]]; then
  echo "SKIP: needs root (CRIU checkpoints and restores as root)"
  exit 77
fi
criu=$(command -v criu || echo /usr/local/sbin/criu)
if ! "$criu" --version >/dev/null 2>&1; then
  echo "SKIP: no usable criu (looked for criu in PATH and $criu)"
  exit 77
fi
# Restored processes are orphans. Where PID 1 does not reap (a bare
# container init), they would stay zombies that hold their pid, and the same
# checkpoint could not be restored twice: run under a subreaper that reaps.
if [[ -z ${GPUCKPT_UNDER_REAPER:-} ]]; then
  GPUCKPT_UNDER_REAPER=1 exec "$BIN/wl_reaper" "$0" "$@"
fi

work=$(mktemp -d /var/tmp/gpuckpt-checkpoint-test.XXXXXX)
chmod 0711 "$work"  # The test user reaches the mount and its own dir.
mnt=$work/mnt
store=$work/store
user=gpuckpt-test
created_user=
sessions=()  # Session ids (= pids) of every workload started.
touch "$work/.started"
mkdir -p "$mnt" "$work/bin" "$work/wl"
# The workloads run from a copy that the test user can execute, and that
# stays where it is for every restore.
for wl in wl_memory wl_threads wl_files wl_tree wl_big; do
  install -m 0755 "$BIN/$wl" "$work/bin/$wl"
done

kill_sessions() {
  local sid
  for sid in "${sessions[@]}"; do pkill -KILL -s "$sid" 2>/dev/null || true; done
}
cleanup() {
  kill_sessions
  if mountpoint -q "$mnt"; then fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" || true; fi
  [[ -n $created_user ]] && userdel "$user" 2>/dev/null
  if [[ -n ${failed:-} && -n ${KEEP_WORK:-} ]]; then
    echo "work dir kept: $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

fail() {
  failed=1
  echo "FAIL: $*" >&2
  if mountpoint -q "$mnt"; then
    local pid
    for pid in "${sessions[@]}"; do
      [[ -f $mnt/$pid/status ]] || continue
      echo "--- $mnt/$pid/status" >&2
      cat "$mnt/$pid/status" >&2 || true
    done
    echo "--- $mnt/restore: $(cat "$mnt/restore" 2>&1)" >&2
  fi
  if [[ -s $work/daemon.log ]]; then
    echo "--- last lines of the daemon's output" >&2
    tail -n 20 "$work/daemon.log" >&2
  fi
  # The newest CRIU logs written since the test began, wherever the daemon
  # keeps them (-xdev: not through the mount).
  local log
  find "$work" /tmp /var/tmp /run -xdev -maxdepth 6 -type f \
    \( -name '*dump*.log' -o -name '*restore*.log' -o -name 'criu*.log' \) \
    -newer "$work/.started" -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -n 3 |
    while read -r _ log; do
      echo "--- last lines of $log" >&2
      tail -n 15 "$log" >&2
    done
  exit 1
}

as_user() { setpriv --reuid="$user" --regid="$user" --init-groups "$@"; }

# wait_for and gone.
# shellcheck source=tests/workloads/wait.sh
source "$(dirname "${BASH_SOURCE[0]}")/../workloads/wait.sh"

# end_session PID: kills the workload (its whole session) and waits for it.
end_session() {
  pkill -KILL -s "$1" 2>/dev/null || true
  gone "$1" 30 || fail "pid $1 (or a process of its session) does not go away"
}

# start_wl OWNER NAME ARGS...: starts a workload in its own session (so that
# CRIU needs no --shell-job), stdio on files; sets wl_pid and wl_result.
wl_seq=0
start_wl() {
  local owner=$1 name=$2
  shift 2
  local dir=$work/wl/$name-$((++wl_seq))
  mkdir -p "$dir"
  wl_result=$dir/result
  local run=()
  if [[ $owner != root ]]; then
    # The workload's output file is the user's own, as if they had started
    # it: a restore run as the user reopens it with the user's rights.
    : >"$dir/out.log"
    chown "$owner:" "$dir" "$dir/out.log"
    run=(setpriv --reuid="$owner" --regid="$owner" --init-groups)
  fi
  # Started from a subshell that exits at once, so that it is no job of
  # ours: the reaper is its parent and reaps it.
  (
    cd "$dir" || exit
    setsid "${run[@]}" "$work/bin/$name" "$wl_result" "$@" </dev/null >"$dir/out.log" 2>&1 &
  )
  wait_for "$wl_result.ready" 300 || fail "$name never got ready ($(cat "$dir/out.log"))"
  wl_pid=$(cat "$wl_result.ready")
  sessions+=("$wl_pid")
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -d $mnt/$wl_pid ]] && return 0
    sleep 0.1
  done
  fail "$name: $mnt/$wl_pid does not appear"
}

# verdict PID RESULT WHAT: SIGUSR1, PASS within the time limit, then gone.
verdict() {
  rm -f "$2"
  [[ -e /proc/$1 ]] || fail "$3: pid $1 is not running"
  kill -USR1 "$1"
  wait_for "$2" 300 || fail "$3: no verdict from pid $1"
  [[ $(cat "$2") == PASS ]] || fail "$3: $(cat "$2")"
  gone "$1" 30 || fail "$3: pid $1 still there after its verdict"
}

# try_write FILE TEXT [USER]: writes TEXT into FILE; on failure, err holds
# what the shell said (the errno in words).
try_write() {
  if [[ -n ${3:-} ]]; then
    # shellcheck disable=SC2016 # Expanded by the user's shell.
    err=$(as_user bash -c 'printf "%s\n" "$2" >"$1"' _ "$1" "$2" 2>&1)
  else
    err=$({ printf '%s\n' "$2" >"$1"; } 2>&1)
  fi
}

# expect_error WHAT REGEX FILE TEXT [USER]: the write must fail, and say so.
expect_error() {
  if try_write "$3" "$4" "${5:-}"; then fail "$1: the write succeeded"; fi
  [[ $err =~ $2 ]] || fail "$1: expected /$2/, got: $err"
}

ids() { find "$mnt/checkpoints" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort; }

# new_ids BEFORE: the ids listed now and not in BEFORE.
new_ids() { comm -13 <(printf '%s\n' "$1") <(ids); }

# complete ID [PID]: the checkpoint has a manifest that parses, with its id,
# its size and pid, and a CRIU image set.
complete() {
  python3 - "$mnt/checkpoints/$1" "$1" "${2:-}" <<'EOF' || fail "checkpoint $1 is not complete"
import json, os, sys
d, want_id, want_pid = sys.argv[1:4]
m = json.load(open(os.path.join(d, "manifest.json")))
assert m["id"] == want_id, ("id", m["id"])
images = os.path.join(d, "images")
names = os.listdir(images)
for f in ("inventory.img", "pstree.img"):
    assert f in names, (f, "missing from", names)
assert any(n.startswith("pages-") for n in names), ("no pages", names)
size = sum(os.path.getsize(os.path.join(images, n)) for n in names)
assert m["logical_bytes"] >= size, ("logical_bytes", m["logical_bytes"], "images", size)
if want_pid:
    assert m["extra"]["pid"] == int(want_pid), ("extra.pid", m["extra"])
EOF
}

# checkpoint PID OPTIONS [USER]: checkpoints through ctl; sets ckpt_id.
checkpoint() {
  local before
  before=$(ids)
  try_write "$mnt/$1/ctl" "checkpoint${2:+ $2}" "${3:-}" ||
    fail "checkpoint $2 of pid $1: $err"
  ckpt_id=$(new_ids "$before")
  [[ -n $ckpt_id && $ckpt_id != *$'\n'* ]] || fail "checkpoint of pid $1 added ids: '$ckpt_id'"
}

# restore PATH PID [USER]: restores through the restore file; the process
# must come back with its pid.
restore() {
  try_write "$mnt/restore" "$1" "${3:-}" || fail "restore of $1: $err; $(cat "$mnt/restore")"
  local said
  # Each user reads the result of their own last restore.
  if [[ -n ${3:-} ]]; then
    said=$(setpriv --reuid="$3" --regid="$3" --init-groups cat "$mnt/restore")
  else
    said=$(cat "$mnt/restore")
  fi
  [[ $said == "pid $2" ]] || fail "restore of $1: restore says '$said', expected 'pid $2'"
}

# not_stopped PID: within 10 s the process runs: not stopped (T/t), not
# traced, and it gets scheduled (its 50 ms idle loop switches context).
not_stopped() {
  local i state tracer switches=
  for ((i = 0; i < 100; i++)); do
    [[ -e /proc/$1 ]] || fail "pid $1 is gone"
    state=$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)
    tracer=$(awk '/^TracerPid:/ {print $2}' "/proc/$1/status")
    if [[ $state != [Tt] && $tracer == 0 ]]; then
      local now
      now=$(awk '/^voluntary_ctxt_switches:/ {print $2}' "/proc/$1/status")
      [[ -n $switches && $now -gt $switches ]] && return 0
      switches=$now
    fi
    sleep 0.1
  done
  fail "pid $1 is stopped, traced or frozen (state $state, tracer $tracer)"
}

start_daemon() {
  "$GPUCKPTFS" --store "$store" --all-processes "$mnt" >>"$work/daemon.log" 2>&1 ||
    fail "gpuckptfs did not mount"
  mountpoint -q "$mnt" || fail "not mounted after gpuckptfs returned"
}

start_daemon
echo "ok: mounted"

# --- The matrix: every workload, both modes ---------------------------------------
# One case: checkpoint, cp -r out and diff, kill, restore from the copy and
# PASS, restore again from the mount (same checkpoint) and PASS.
run_case() {
  local mode=$1 name=$2
  shift 2
  local what="$name $* (checkpoint${mode:+ $mode})"
  local t0=$SECONDS
  start_wl root "$name" "$@"
  local pid=$wl_pid result=$wl_result
  checkpoint "$pid" "$mode"
  local id=$ckpt_id
  if [[ $mode == *--kill* ]]; then
    gone "$pid" 10 || fail "$what: pid $pid still running after checkpoint --kill"
  else
    not_stopped "$pid"
    [[ $(readlink -f "$mnt/$pid/checkpoints/latest") == "$mnt/checkpoints/$id" ]] ||
      fail "$what: $pid/checkpoints/latest -> $(readlink -f "$mnt/$pid/checkpoints/latest")"
    grep -q '^last: ' "$mnt/$pid/status" || fail "$what: no 'last:' in status"
  fi
  if [[ $mode == *--name* ]]; then
    [[ $id == "${mode##*--name }" ]] || fail "$what: id is $id"
  else
    [[ $id =~ ^$pid-[0-9]+$ ]] || fail "$what: id $id is not <pid>-<n>"
  fi
  complete "$id" "$pid"
  cp -r "$mnt/checkpoints/$id" "$work/copy"
  diff -r "$mnt/checkpoints/$id" "$work/copy" >&2 || fail "$what: the cp -r copy differs"
  end_session "$pid"
  restore "$work/copy" "$pid"
  verdict "$pid" "$result" "$what, restored from a copy"
  restore "$mnt/checkpoints/$id" "$pid"
  verdict "$pid" "$result" "$what, restored again from the mount"
  rm -rf "$work/copy"
  echo "ok: $what: cp -r identical; restored from the copy and from the mount: PASS ($((SECONDS - t0)) s)"
}

for mode in "" --kill; do
  for name in wl_memory wl_threads wl_files wl_tree; do run_case "$mode" "$name"; done
  run_case "$mode" wl_big --mib 1024
done
run_case "--name files-named" wl_files

# --- Bad input, busy pids ---------------------------------------------------------
start_wl root wl_memory --mib 16
pid=$wl_pid
result=$wl_result
expect_error "unknown command" "Invalid argument" "$mnt/$pid/ctl" bogus
expect_error "unknown option" "Invalid argument" "$mnt/$pid/ctl" "checkpoint --bogus"
echo "ok: unknown commands and options fail with EINVAL"
checkpoint "$pid" ""
busy_id=$ckpt_id
expect_error "restore over a running pid" "Device or resource busy" "$mnt/restore" \
  "$mnt/checkpoints/$busy_id"
grep -qi "in use" "$mnt/restore" || fail "restore over a running pid says: $(cat "$mnt/restore")"
verdict "$pid" "$result" "wl_memory after a refused restore"
echo "ok: restoring over a pid in use fails with EBUSY, saying so"

expect_error "restore of /etc" "Invalid argument" "$mnt/restore" /etc
[[ $(cat "$mnt/restore") == error:* ]] || fail "restore of /etc says: $(cat "$mnt/restore")"
expect_error "restore of a missing dir" "No such file or directory" "$mnt/restore" /nonexistent
echo "ok: restoring from a non-image dir fails with EINVAL, from a missing one with ENOENT"

# A process holding an io_uring instance: refused before anything is
# frozen, saying why (CRIU cannot checkpoint io_uring), and it runs on.
uring_ready=$work/uring.ready
before=$(ids)
READY=$uring_ready setsid python3 -c '
import ctypes, os, time
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
fd = ctypes.CDLL(None, use_errno=True).syscall(425, 4, params)  # io_uring_setup
if fd < 0:
    raise SystemExit("io_uring_setup: " + os.strerror(ctypes.get_errno()))
open(os.environ["READY"], "w").close()
time.sleep(600)
' </dev/null >"$work/uring.out" 2>&1 &
uring_pid=$!
sessions+=("$uring_pid")
for _ in $(seq 100); do [[ -e $uring_ready ]] && break; kill -0 "$uring_pid" 2>/dev/null || break; sleep 0.1; done
if [[ -e $uring_ready ]]; then
  expect_error "checkpoint of an io_uring user" "Operation not supported" "$mnt/$uring_pid/ctl" checkpoint
  grep -q "uses io_uring" "$mnt/$uring_pid/status" ||
    fail "the status of an io_uring user says: $(grep '^last' "$mnt/$uring_pid/status")"
  [[ $(ids) == "$before" ]] || fail "a refused checkpoint left a checkpoint: $(new_ids "$before")"
  kill -0 "$uring_pid" || fail "the io_uring user did not run on"
  kill "$uring_pid"
  echo "ok: a process using io_uring is refused with ENOTSUP, saying why, and runs on"
else
  echo "SKIP: io_uring case: this kernel gives no io_uring ($(cat "$work/uring.out"))"
fi

start_wl root wl_memory --mib 8
pid=$wl_pid
exec 3>"$mnt/$pid/ctl"
end_session "$pid"
if err=$({ printf 'checkpoint\n' >&3; } 2>&1); then fail "checkpoint of a vanished pid succeeded"; fi
[[ $err =~ "No such process" ]] || fail "checkpoint of a vanished pid: $err"
exec 3>&-
echo "ok: checkpoint through an open ctl of a vanished pid fails with ESRCH"

# Two checkpoints of one pid at once: one fails with EBUSY, or both succeed
# one after the other; whatever appears is complete and restores.
start_wl root wl_memory --mib 32
pid=$wl_pid
result=$wl_result
before=$(ids)
writers=()
for k in 1 2; do
  (if try_write "$mnt/$pid/ctl" checkpoint; then echo ok; else echo "$err"; fi >"$work/concurrent.$k") &
  writers+=($!)
done
wait "${writers[@]}"
oks=$(cat "$work"/concurrent.* | grep -cx ok || true)
if ((oks == 1)); then
  grep -qh "Device or resource busy" "$work"/concurrent.* ||
    fail "concurrent checkpoints: $(cat "$work"/concurrent.*)"
elif ((oks != 2)); then
  fail "concurrent checkpoints: $(cat "$work"/concurrent.*)"
fi
mapfile -t made < <(new_ids "$before")
((${#made[@]} == oks)) || fail "concurrent checkpoints: $oks succeeded, new ids: ${made[*]}"
for id in "${made[@]}"; do complete "$id" "$pid"; done
end_session "$pid"
for id in "${made[@]}"; do
  restore "$mnt/checkpoints/$id" "$pid"
  verdict "$pid" "$result" "wl_memory restored from concurrent checkpoint $id"
done
echo "ok: concurrent checkpoints: $oks succeeded, each complete and restores"

# --- Permissions: a non-root user ---------------------------------------------------
if ! id "$user" >/dev/null 2>&1; then
  useradd -r -M -s /usr/sbin/nologin "$user"
  created_user=1
fi
start_wl root wl_memory --mib 8
root_pid=$wl_pid
checkpoint "$root_pid" ""
root_id=$ckpt_id
as_user ls "$mnt" >"$work/user-ls" 2>&1 || fail "the user cannot list the mount: $(cat "$work/user-ls")"
grep -qx "$root_pid" "$work/user-ls" && fail "the user sees root's pid $root_pid"
expect_error "the user checkpoints root's process" \
  "Permission denied|Operation not permitted|No such file or directory" \
  "$mnt/$root_pid/ctl" checkpoint "$user"
if as_user cat "$mnt/checkpoints/$root_id/images/pstree.img" >/dev/null 2>&1; then
  fail "the user reads root's images"
fi
end_session "$root_pid"
expect_error "the user restores root's checkpoint" "Permission denied|Operation not permitted" \
  "$mnt/restore" "$mnt/checkpoints/$root_id" "$user"
[[ ! -e /proc/$root_pid ]] || fail "root's process came back from the user's restore"
echo "ok: the user neither sees, checkpoints, reads nor restores root's process"

start_wl "$user" wl_memory --mib 8
pid=$wl_pid
result=$wl_result
# Listings come from a /proc scan cached for a second: a process appears
# within one.
seen=false
for _ in $(seq 30); do
  if as_user ls "$mnt" | grep -qx "$pid"; then seen=true; break; fi
  sleep 0.1
done
$seen || fail "the user does not see their own pid $pid"
checkpoint "$pid" "" "$user"
id=$ckpt_id
complete "$id" "$pid"
as_user cat "$mnt/checkpoints/$id/images/pstree.img" >/dev/null || fail "the user cannot read their images"
mkdir -p "$work/user" && chown "$user:" "$work/user" && chmod 0700 "$work/user"
as_user cp -r "$mnt/checkpoints/$id" "$work/user/copy" || fail "the user cannot cp -r their checkpoint"
as_user diff -r "$mnt/checkpoints/$id" "$work/user/copy" >&2 || fail "the user's copy differs"
end_session "$pid"
restore "$work/user/copy" "$pid" "$user"
[[ $(awk '/^Uid:/ {print $2}' "/proc/$pid/status") == $(id -u "$user") ]] ||
  fail "the user's restored process does not run as the user"
verdict "$pid" "$result" "the user's wl_memory restored from their copy"
echo "ok: the user sees, checkpoints, copies and restores their own process"

# --- The daemon killed in the middle of a checkpoint --------------------------------
start_wl root wl_big --mib 1024
big_pid=$wl_pid
big_result=$wl_result
before=$(ids)
conn=$(mountpoint -d "$mnt" | cut -d: -f2)
({ printf 'checkpoint\n' >"$mnt/$big_pid/ctl"; } 2>/dev/null || true) &
writer=$!
for ((i = 0; i < 50; i++)); do
  grep '^operation:' "$mnt/$big_pid/status" 2>/dev/null | grep -qvx 'operation: idle' && break
  sleep 0.01
done
mapfile -t daemon < <(pgrep -f "gpuckptfs --store $store")
((${#daemon[@]} > 0)) || fail "no daemon to kill"
kill -KILL "${daemon[@]}"
fusermount3 -u -z "$mnt"
for ((i = 0; i < 200; i++)); do
  kill -0 "$writer" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$writer" 2>/dev/null; then
  echo 1 >"/sys/fs/fuse/connections/$conn/abort" 2>/dev/null || true
  fail "the ctl write still blocks 20 s after the daemon was killed"
fi
not_stopped "$big_pid"
echo "ok: daemon killed during a checkpoint of wl_big: the process runs on"
start_daemon
# The interrupted checkpoint's id is absent, or complete; so is every other.
for id in $(ids); do complete "$id"; done
echo "ok: a new daemon on the same store shows only complete checkpoints"
start_wl root wl_memory --mib 8
pid=$wl_pid
result=$wl_result
checkpoint "$pid" --kill
restore "$mnt/checkpoints/$ckpt_id" "$pid"
verdict "$pid" "$result" "wl_memory checkpointed by the new daemon"
verdict "$big_pid" "$big_result" "wl_big after its checkpoint's daemon was killed"
echo "ok: the new daemon checkpoints and restores; wl_big still PASSes"

fusermount3 -u "$mnt"
for ((i = 0; i < 50; i++)); do
  pgrep -f "gpuckptfs --store $store" >/dev/null || break
  sleep 0.1
done
pgrep -f "gpuckptfs --store $store" >/dev/null && fail "daemon still running after unmount"
echo "PASS: checkpoint_test"
