# Waiting helpers shared by the workload scripts (sourced).

# wait_for FILE SECONDS: until FILE exists.
wait_for() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [[ -e $1 ]] && return 0
    sleep 0.1
  done
  return 1
}

# gone PID SECONDS: until no process of session PID is left (zombies reaped).
gone() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [[ ! -e /proc/$1 ]] && ! pgrep -s "$1" >/dev/null && return 0
    sleep 0.1
  done
  return 1
}
