# shellcheck shell=bash disable=SC2034  # (variables used by the scripts that source this)
# Sourced by tests/gpu/gpu_bench (the pytest GPU tests have tests/gpu/gpurun.py): where the
# bundle's programs are, how to run them, the mount, the workloads.
#
# The bundle (.gpu-bundle/, made by tests/gpu/prepare on the build machine)
# carries gpuckptfs, CRIU, its plugins, cuda-checkpoint and the shared
# libraries they need from the build machine. Those libraries are for them
# alone: LD_LIBRARY_PATH is set only on the commands that run them (the
# daemon, criu, cuda-checkpoint), never exported, and the workloads (CUDA
# programs, python with PyTorch) run with it unset.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The bundle travels packed (tests/gpu/prepare): unpacked on first use.
if [[ ! -d $REPO_ROOT/.gpu-bundle && -f $REPO_ROOT/.gpu-bundle.tar.gz ]]; then
  tar -C "$REPO_ROOT" -xzf "$REPO_ROOT/.gpu-bundle.tar.gz"
fi
TRAIN_PY=$REPO_ROOT/tests/gpu/train.py

# bundle_at DIR: the bundle's programs are those under DIR.
bundle_at() {
  BUNDLE=$1
  BUNDLE_LIB=$BUNDLE/lib
  GPUCKPTFS=$BUNDLE/bin/gpuckptfs
  CRIU=$BUNDLE/sbin/criu
  CRIU_PLUGINS=$BUNDLE/lib/criu
  CUDA_CHECKPOINT=$BUNDLE/libexec/gpuckpt/cuda-checkpoint
  GPU_MEMORY=$BUNDLE/bin/gpu_memory
  WL_REAPER=$BUNDLE/bin/wl_reaper
}
bundle_at "$REPO_ROOT/.gpu-bundle"

# use_bundle_at DIR: copies the bundle to DIR (made 0755) and points the
# variables above at the copy. CRIU and cuda-checkpoint run as the
# workloads' owner when an ordinary user checkpoints, so they, their
# libraries and CRIU's plugins must be where that user can reach them,
# which a repository under /root is not.
use_bundle_at() {
  install -d -m 0755 "$1"
  cp -a "$BUNDLE/." "$1/"
  chmod -R go+rX "$1"
  bundle_at "$1"
}

# wait_for FILE SECONDS and gone PID SECONDS (no process of session PID left).
# shellcheck source=tests/workloads/wait.sh
source "$REPO_ROOT/tests/workloads/wait.sh"

now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }

# with_bundle CMD...: runs CMD with the bundle's libraries.
with_bundle() { LD_LIBRARY_PATH=$BUNDLE_LIB "$@"; }

# without_bundle CMD...: runs CMD with no LD_LIBRARY_PATH at all (the
# workloads: the GPU machine's own libstdc++, libcuda, python).
without_bundle() { env -u LD_LIBRARY_PATH "$@"; }

# check_bundle: the bundle is complete, its programs executable (the copy to
# the GPU machine may drop modes) and loadable. Prints what is wrong.
check_bundle() {
  local f missing=()
  for f in "$GPUCKPTFS" "$BUNDLE/bin/gpuckpt" "$CRIU" "$CUDA_CHECKPOINT" "$GPU_MEMORY" "$WL_REAPER" \
    "$CRIU_PLUGINS/cuda_plugin.so" "$CRIU_PLUGINS/amdgpu_plugin.so"; do
    [[ -f $f ]] || missing+=("$f")
  done
  if ((${#missing[@]} > 0)); then
    echo "the bundle lacks: ${missing[*]} (run tests/gpu/prepare on the build machine and copy .gpu-bundle.tar.gz here)"
    return 1
  fi
  chmod 0755 "$BUNDLE"/bin/* "$BUNDLE"/sbin/* "$BUNDLE"/libexec/gpuckpt/* 2>/dev/null || true
  local out
  for f in "$GPUCKPTFS" "$CRIU" "$CUDA_CHECKPOINT"; do
    if ! out=$(with_bundle "$f" --help 2>&1 >/dev/null) && [[ $out == *"error while loading"* ]]; then
      echo "$f does not load: $out"
      return 1
    fi
  done
  if ! out=$(with_bundle "$CRIU" --version 2>&1); then
    echo "$CRIU --version fails: $out"
    return 1
  fi
}

# fusermount3 of the system, else the bundle's; umount as the last resort.
unmount() {
  local fm
  fm=$(command -v fusermount3 || echo "$BUNDLE/bin/fusermount3")
  mountpoint -q "$1" || return 0
  "$fm" -u "$1" 2>/dev/null || "$fm" -u -z "$1" 2>/dev/null || umount -l "$1"
}

# start_daemon STORE MNT LOG: gpuckptfs in the foreground, in the
# background of this shell; sets DAEMON_PID. Returns 1 (saying why) if it
# is not mounted within 60 s.
DAEMON_PID=
start_daemon() {
  local store=$1 mnt=$2 log=$3 i
  mkdir -p "$store" "$mnt"
  LD_LIBRARY_PATH=$BUNDLE_LIB "$GPUCKPTFS" --store "$store" --criu "$CRIU" \
    --criu-plugin-dir "$CRIU_PLUGINS" --lock-timeout 30000 --foreground "$mnt" >>"$log" 2>&1 &
  DAEMON_PID=$!
  for ((i = 0; i < 600; i++)); do
    mountpoint -q "$mnt" && [[ -e $mnt/restore ]] && return 0
    if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
      echo "gpuckptfs exited before mounting $mnt; its log:" >&2
      tail -n 20 "$log" >&2
      DAEMON_PID=
      return 1
    fi
    sleep 0.1
  done
  echo "gpuckptfs did not mount $mnt within 60 s; its log:" >&2
  tail -n 20 "$log" >&2
  return 1
}

# stop_daemon MNT: unmounts, then waits (30 s) for the daemon to exit.
stop_daemon() {
  unmount "$1" || true
  [[ -n $DAEMON_PID ]] || return 0
  local i
  for ((i = 0; i < 300; i++)); do
    kill -0 "$DAEMON_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$DAEMON_PID" 2>/dev/null; then
    echo "warning: gpuckptfs $DAEMON_PID still runs 30 s after unmount; killing it" >&2
    kill -KILL "$DAEMON_PID" 2>/dev/null || true
  fi
  wait "$DAEMON_PID" 2>/dev/null || true
  DAEMON_PID=
}

# start_session DIR CMD...: starts CMD as the workloads' user (AS_USER) in
# its own session (so CRIU needs no --shell-job), in DIR (made theirs),
# stdin from /dev/null, output to DIR/out.log, without the bundle's
# libraries; from a subshell that exits at once, so that the reaper, not
# this shell, is its parent and reaps it after a restore too.
# Its pid goes to DIR/launch.pid (setsid and env exec, so it is CMD's pid).
start_session() {
  local dir=$1
  shift
  give "$dir"
  (
    cd "$dir" || exit 1
    setsid "${AS_USER[@]}" env -u LD_LIBRARY_PATH "$@" </dev/null >"$dir/out.log" 2>&1 &
    echo $! >"$dir/launch.pid"
  )
}

# wait_ready READY_FILE SECONDS [LAUNCH_PID_FILE]: until the workload
# announced itself; sets WL_PID. Returns 1 on timeout, or at once when the
# launched process has exited without announcing itself.
wait_ready() {
  local i launched=
  [[ -n ${3:-} ]] && launched=$(cat "$3" 2>/dev/null || true)
  for ((i = 0; i < $2 * 10; i++)); do
    [[ -e $1 ]] && break
    if [[ -n $launched && ! -e /proc/$launched ]]; then
      sleep 0.2  # (it may have written the file just before it exited)
      [[ -e $1 ]] && break
      return 1
    fi
    sleep 0.1
  done
  [[ -e $1 ]] || return 1
  WL_PID=$(cat "$1")
  [[ $WL_PID =~ ^[0-9]+$ ]]
}

# verdict PID RESULT_FILE: SIGUSR1, then the verdict within 120 s and the
# process gone. Returns 0 on PASS; else 1 with VERDICT saying what happened.
VERDICT=
verdict() {
  local pid=$1 result=$2
  rm -f "$result"
  if [[ ! -e /proc/$pid ]]; then
    VERDICT="pid $pid is not running"
    return 1
  fi
  kill -USR1 "$pid"
  if ! wait_for "$result" 120; then
    VERDICT="no verdict from pid $pid within 120 s (state: $(proc_state "$pid"))"
    return 1
  fi
  VERDICT=$(cat "$result")
  gone "$pid" 30 || VERDICT="$VERDICT; pid $pid still there 30 s after its verdict"
  [[ $VERDICT == PASS ]]
}

# end_session PID: kills the session of PID (the workloads lead their own
# sessions, restored ones too) and waits (30 s) until it is gone.
end_session() {
  pkill -KILL -s "$1" 2>/dev/null || true
  gone "$1" 30
}

# AS_USER: the command prefix that runs a command as the user the workloads
# belong to (empty: as root). Set by the scripts that run them as an
# ordinary user (as_user_setup).
AS_USER=()

# as_user_setup NAME HOME: AS_USER runs commands as NAME (created if there is
# no such user; CREATED_USER is then NAME, for as_user_cleanup), with its
# own groups, HOME and no capabilities. Sets RUN_UID and RUN_GID.
CREATED_USER=
RUN_UID=0
RUN_GID=0
as_user_setup() {
  local name=$1 home=$2
  if ! id -u "$name" >/dev/null 2>&1; then
    useradd --system --user-group --home-dir "$home" --shell /usr/sbin/nologin "$name" ||
      return 1
    CREATED_USER=$name
  fi
  RUN_UID=$(id -u "$name")
  RUN_GID=$(id -g "$name")
  mkdir -p "$home"
  chown "$RUN_UID:$RUN_GID" "$home"
  AS_USER=(setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --init-groups --inh-caps=-all
    env HOME="$home" USER="$name" LOGNAME="$name")
}

# as_user_cleanup: removes the user as_user_setup created.
as_user_cleanup() {
  [[ -n $CREATED_USER ]] || return 0
  userdel "$CREATED_USER" 2>/dev/null || true
  CREATED_USER=
}

# as_root CMD...: runs the shell function or command CMD with AS_USER
# empty, i.e. as root (gc is root's).
as_root() {
  local AS_USER=()
  "$@"
}

# give DIR...: the directories (made if missing) belong to the workloads'
# user.
give() {
  mkdir -p "$@"
  ((RUN_UID == 0)) || chown "$RUN_UID:$RUN_GID" "$@"
}

# ctl_write FILE TEXT SECONDS: writes TEXT into a control file as the
# workloads' user (AS_USER), waiting at most SECONDS. Returns the write's
# status; ERR holds what the shell said.
ERR=
ctl_write() {
  local rc=0
  # shellcheck disable=SC2016 # expanded by the inner shell
  ERR=$(timeout -k 5 "$3" "${AS_USER[@]}" bash -c 'printf "%s\n" "$2" >"$1"' _ "$1" "$2" 2>&1) || rc=$?
  if ((rc == 124 || rc == 137)); then ERR="no answer within $3 s (write of '$2' to $1)"; fi
  return "$rc"
}

# ids MNT: the checkpoint ids in the store, sorted.
ids() { { find "$1/checkpoints" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null || true; } | sort; }

# manifest_get FILE KEY: a manifest value, at the top level or in "extra"
# (the store's own fields are at the top, the engine's in extra).
manifest_get() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
k = sys.argv[2]
v = m.get(k, m.get("extra", {}).get(k))
print("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))
EOF
}

# proc_state PID: the one-letter state of a process ("" if gone).
proc_state() { { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null || true; } | cut -d' ' -f1; }

# The commit the bundle was built from (the GPU machine's copy of .git may
# be older than the working tree that travelled).
bundle_commit() {
  sed -n 's/^commit: //p' "$BUNDLE/BUILD-INFO" 2>/dev/null | head -n 1 | grep . || echo unknown
}
