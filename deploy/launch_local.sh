#!/usr/bin/env bash
# Starts an N-rank dlrm_server job on this machine: rank 0 serves the public
# services (pass --listen among the arguments), every rank meets at a
# coordinator on a free loopback port. Prints rank 0's listening line, and
# stops every rank together: on SIGINT/SIGTERM, and when any rank exits.
#
#   deploy/launch_local.sh N [dlrm_server args...]
#
# Environment: DLRM_SERVER (the binary; default: build/server/dlrm_server),
# DLRM_LOG_DIR (per-rank logs rank-R.log; default: a new temporary dir),
# DLRM_COORDINATOR_PORT (default: a free port).
set -u

if [[ $# -lt 1 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N [dlrm_server args...]" >&2
  exit 2
fi
world=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
server=${DLRM_SERVER:-$here/../build/server/dlrm_server}
if [[ ! -x $server ]]; then
  echo "$0: $server is not an executable (set DLRM_SERVER)" >&2
  exit 2
fi
log_dir=${DLRM_LOG_DIR:-$(mktemp -d -t dlrm-ranks.XXXXXX)}
mkdir -p "$log_dir"
port=${DLRM_COORDINATOR_PORT:-$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
coordinator=127.0.0.1:$port
echo "launch_local: $world ranks, coordinator $coordinator, logs in $log_dir" >&2

pids=()
stopping=0
# Waits up to $2 tenths of a second for pid $1 to exit.
wait_gone() {
  for _ in $(seq "$2"); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}
stop_all() {
  [[ $stopping == 1 ]] && return
  stopping=1
  # Rank 0 first: it finishes its step and tells the others to exit; then
  # whatever is left gets SIGTERM.
  kill -TERM "${pids[0]}" 2>/dev/null
  wait_gone "${pids[0]}" 150
  for pid in "${pids[@]}"; do
    wait_gone "$pid" 50 || kill -TERM "$pid" 2>/dev/null
  done
}
trap 'stop_all' INT TERM

for ((r = world - 1; r >= 0; r--)); do
  if ((r == 0)); then
    # Rank 0's stdout carries the listening line; it goes to ours too.
    "$server" "$@" --world-size "$world" --rank 0 \
      --coordinator "$coordinator" 2>"$log_dir/rank-0.log" \
      > >(tee "$log_dir/rank-0.out") &
  else
    "$server" "$@" --world-size "$world" --rank "$r" \
      --coordinator "$coordinator" \
      >"$log_dir/rank-$r.out" 2>"$log_dir/rank-$r.log" &
  fi
  pids[r]=$!
done

# Wait until any rank exits or a signal arrives, then stop the rest.
wait -n "${pids[@]}"
rc=$?
if [[ $stopping == 0 ]]; then
  echo "launch_local: a rank exited (status $rc); stopping the others" >&2
  stop_all
fi
status=0
for r in "${!pids[@]}"; do
  wait "${pids[r]}" 2>/dev/null
  rc=$?
  if ((rc != 0)); then
    echo "launch_local: rank $r exited with status $rc (log: $log_dir/rank-$r.log)" >&2
    ((status == 0)) && status=$rc
  fi
done
exit "$status"
