#!/usr/bin/env bash
# Predict latency on one server with and without a Train stream beside it,
# and on an inference replica that follows a training server's checkpoints
# (issue "Serving at production shape", items 1 and 2): dlrm_bench_serve
# --load at 1, 8 and 64 Predict clients, each level once per mode of MODES,
# alternating, `rounds` times:
#   idle      one server, Predict clients alone (--load-idle)
#   training  one server, a Train stream beside the clients
#   replica   the clients call a replica (--load-replica: dlrm_server
#             --inference-only --follow, as many threads, same machine) while
#             the server it follows trains and writes a checkpoint every 5 s
# Prints every JSON line, then the medians per (clients, mode) and the ratio
# of each mode's p99 to the idle one's.
#
# Usage: [MODES="idle training replica"] bench/compare_predict_load.sh
#        [rounds] [duration_s] [extra dlrm_bench_serve args...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
duration=${2:-10}
shift $(($# < 2 ? $# : 2))
bench=build/bench/dlrm_bench_serve
[[ -x $bench ]] || ./scripts/build.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
read -r -a modes <<<"${MODES:-idle training replica}"
for ((r = 0; r < rounds; r++)); do
  for clients in 1 8 64; do
    for mode in "${modes[@]}"; do
      case $mode in
        idle) mode_args=(--load-idle) ;;
        training) mode_args=() ;;
        replica) mode_args=(--load-replica) ;;
        *) echo "unknown mode $mode (MODES: idle training replica)" >&2; exit 2 ;;
      esac
      $bench --load --config kaggle --threads 2 --batch 2048 \
        --load-clients "$clients" --duration "$duration" "${mode_args[@]}" \
        "$@" | tee -a "$log"
    done
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    j = json.loads(line)
    mode = ("replica" if j.get("replica") else
            "training" if j["training"] else "idle")
    rows.setdefault((j["predict_clients"], mode), []).append(j)
med = lambda xs: statistics.median(xs)
order = {"idle": 0, "training": 1, "replica": 2}
print("| clients | mode | p50 ms | p99 ms | Predict req/s | train samples/s "
      "| steps served | runs |")
print("| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |")
for (c, m), js in sorted(rows.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
    served = ", ".join(f"{j['served_step']['start']}-{j['served_step']['end']}"
                       for j in js) if m == "replica" else "-"
    print(f"| {c} | {m} | "
          f"{med([j['latency_ms']['p50'] for j in js]):.2f} | "
          f"{med([j['latency_ms']['p99'] for j in js]):.2f} | "
          f"{med([j['predict_requests_per_s'] for j in js]):,.0f} | "
          f"{med([j['train_samples_per_s'] for j in js]):,.0f} | {served} | "
          f"{len(js)} |")
for c in sorted({c for c, _ in rows}):
    if (c, "idle") not in rows:
        continue
    idle = med([j["latency_ms"]["p99"] for j in rows[(c, "idle")]])
    for m in ("training", "replica"):
        if (c, m) in rows:
            busy = med([j["latency_ms"]["p99"] for j in rows[(c, m)]])
            print(f"clients {c}: p99 {m} / idle = {busy / idle:.2f}")
PY
