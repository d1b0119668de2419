#!/usr/bin/env bash
# Starts an N-rank dlrm_server job on this machine: rank 0 serves the public
# services (pass --listen among the arguments), every rank meets at a
# coordinator on a free loopback port. Prints rank 0's listening line, and
# stops every rank together: on SIGINT/SIGTERM, and when any rank exits.
#
#   deploy/launch_local.sh [--restart-on-failure K] [--gpus G] N
#                          [dlrm_server args...]
#
# --restart-on-failure K: when a rank dies (exits non-zero or is killed),
# stop the others and start the whole job again, up to K times; each start
# resumes from the newest valid checkpoint in --checkpoint-dir (the
# server's default), and rank 0 prints a new listening line. Default: 0.
#
# --gpus G: one GPU per rank process, G GPUs in all: rank r sees only GPU
# r mod G (CUDA_VISIBLE_DEVICES; entry r mod G of the launcher's own
# CUDA_VISIBLE_DEVICES list when it has one), so N ranks may share fewer
# GPUs. Every rank gets --device cuda and, unless the arguments name one,
# --device-comm nccl when each rank has a GPU of its own (N <= G) or
# host-staged when ranks share one (NCCL cannot put two ranks on one GPU).
# Default: no GPU setting (the ranks inherit the environment).
#
# Environment: DLRM_SERVER (the binary; default: build/server/dlrm_server),
# DLRM_LOG_DIR (per-rank logs rank-R.log, appended to across restarts, and
# rank-R.pid; default: a new temporary dir), DLRM_COORDINATOR_PORT (default:
# a free port, a new one for each start).
set -u

usage() {
  echo "usage: $0 [--restart-on-failure K] [--gpus G] N [dlrm_server args...]" >&2
  exit 2
}
restarts_left=0
gpus=0
while [[ ${1:-} == --restart-on-failure || ${1:-} == --gpus ]]; do
  if [[ $1 == --restart-on-failure ]]; then
    [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || usage
    restarts_left=$2
  else
    [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || usage
    gpus=$2
  fi
  shift 2
done
if [[ $# -lt 1 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  usage
fi
world=$1
shift
# The GPUs the ranks take in turn, and the flags every rank gets for them.
gpu_ids=()
gpu_args=()
if ((gpus > 0)); then
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -r -a gpu_ids <<<"$CUDA_VISIBLE_DEVICES"
    if ((${#gpu_ids[@]} < gpus)); then
      echo "$0: --gpus $gpus but CUDA_VISIBLE_DEVICES lists ${#gpu_ids[@]}: $CUDA_VISIBLE_DEVICES" >&2
      exit 2
    fi
    gpu_ids=("${gpu_ids[@]:0:gpus}")
  else
    for ((g = 0; g < gpus; g++)); do gpu_ids+=("$g"); done
  fi
  gpu_args=(--device cuda)
  named_comm=0
  for arg in "$@"; do
    [[ $arg == --device-comm || $arg == --device-comm=* ]] && named_comm=1
  done
  if ((named_comm == 0)); then
    if ((world <= gpus)); then
      gpu_args+=(--device-comm nccl)
    else
      gpu_args+=(--device-comm host-staged)
    fi
  fi
fi
here=$(cd "$(dirname "$0")" && pwd)
server=${DLRM_SERVER:-$here/../build/server/dlrm_server}
if [[ ! -x $server ]]; then
  echo "$0: $server is not an executable (set DLRM_SERVER)" >&2
  exit 2
fi
log_dir=${DLRM_LOG_DIR:-$(mktemp -d -t dlrm-ranks.XXXXXX)}
mkdir -p "$log_dir"

pids=()
stopping=0   # a signal asked the whole launcher to stop
# Waits up to $2 tenths of a second for pid $1 to exit.
wait_gone() {
  for _ in $(seq "$2"); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}
# Rank 0 first: it finishes its step (and its checkpoint on exit) and tells
# the others to exit; then whatever is left gets SIGTERM. With $1 = failed
# (a rank died, the job is broken), ranks still there after a grace period
# get SIGKILL: they may block on the dead peer up to --comm-timeout-s.
stop_ranks() {
  kill -TERM "${pids[0]}" 2>/dev/null
  wait_gone "${pids[0]}" 150
  for pid in "${pids[@]}"; do
    wait_gone "$pid" 50 || kill -TERM "$pid" 2>/dev/null
  done
  if [[ ${1:-} == failed ]]; then
    for pid in "${pids[@]}"; do
      wait_gone "$pid" 50 || kill -KILL "$pid" 2>/dev/null
    done
  fi
}
on_signal() {
  [[ $stopping == 1 ]] && return
  stopping=1
  stop_ranks
}
trap 'on_signal' INT TERM

start_ranks() {
  local port coordinator
  port=${DLRM_COORDINATOR_PORT:-$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  coordinator=127.0.0.1:$port
  local gpu_note=""
  ((gpus > 0)) && gpu_note=", GPUs ${gpu_ids[*]} by rank mod $gpus (${gpu_args[*]})"
  echo "launch_local: $world ranks, coordinator $coordinator, logs in $log_dir$gpu_note" >&2
  pids=()
  for ((r = world - 1; r >= 0; r--)); do
    echo "---- launch_local: start $attempt, $(date -u +%FT%TZ)" \
      >>"$log_dir/rank-$r.log"
    # With --gpus, this rank's one GPU; else the environment as it is.
    local gpu_env=()
    ((gpus > 0)) && gpu_env=(env "CUDA_VISIBLE_DEVICES=${gpu_ids[r % gpus]}")
    if ((r == 0)); then
      # Rank 0's stdout carries the listening line; it goes to ours too.
      "${gpu_env[@]}" "$server" "$@" "${gpu_args[@]}" --world-size "$world" \
        --rank 0 --coordinator "$coordinator" 2>>"$log_dir/rank-0.log" \
        > >(tee -a "$log_dir/rank-0.out") &
    else
      "${gpu_env[@]}" "$server" "$@" "${gpu_args[@]}" --world-size "$world" \
        --rank "$r" --coordinator "$coordinator" \
        >>"$log_dir/rank-$r.out" 2>>"$log_dir/rank-$r.log" &
    fi
    pids[r]=$!
    echo "${pids[r]}" >"$log_dir/rank-$r.pid"
  done
}

attempt=0
while true; do
  start_ranks "$@"
  # Wait until any rank exits or a signal arrives, then stop the rest.
  died=
  wait -n -p died "${pids[@]}"
  rc=$?
  failed=0
  if [[ $stopping == 0 ]]; then
    rank=?
    for r in "${!pids[@]}"; do [[ ${pids[r]} == "${died:-}" ]] && rank=$r; done
    echo "launch_local: rank $rank exited (status $rc); stopping the others" >&2
    if ((rc != 0)); then
      failed=1
      stop_ranks failed
    else
      stop_ranks
    fi
  fi
  status=0
  for r in "${!pids[@]}"; do
    wait "${pids[r]}" 2>/dev/null
    code=$?
    [[ ${pids[r]} == "${died:-}" ]] && code=$rc
    if ((code != 0)); then
      echo "launch_local: rank $r exited with status $code (log: $log_dir/rank-$r.log)" >&2
      ((status == 0)) && status=$code
    fi
  done
  if [[ $stopping == 0 && $failed == 1 ]] && ((restarts_left > 0)); then
    restarts_left=$((restarts_left - 1))
    attempt=$((attempt + 1))
    echo "launch_local: restarting every rank (restart $attempt, $restarts_left left); they resume from the newest checkpoint in --checkpoint-dir" >&2
    continue
  fi
  exit "$status"
done
