#!/usr/bin/env bash
# Predict latency on one server with and without a Train stream beside it
# (issue "Serving at production shape", item 1): dlrm_bench_serve --load at
# 1, 8 and 64 Predict clients, each level once with training and once idle
# (--load-idle), alternating, `rounds` times. Prints every JSON line, then
# the medians per (clients, training) and the ratio of p99 with training to
# p99 without.
#
# Usage: bench/compare_predict_load.sh [rounds] [duration_s] [extra
#        dlrm_bench_serve args...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
duration=${2:-10}
shift $(($# < 2 ? $# : 2))
bench=build/bench/dlrm_bench_serve
[[ -x $bench ]] || ./scripts/build.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((r = 0; r < rounds; r++)); do
  for clients in 1 8 64; do
    for idle in "" --load-idle; do
      # shellcheck disable=SC2086
      $bench --load --config kaggle --threads 2 --batch 2048 \
        --load-clients "$clients" --duration "$duration" $idle "$@" |
        tee -a "$log"
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
    key = (j["predict_clients"], j["training"])
    rows.setdefault(key, []).append(j)
med = lambda xs: statistics.median(xs)
print("| clients | training | p50 ms | p99 ms | Predict req/s | train samples/s | runs |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
for (c, t), js in sorted(rows.items()):
    print(f"| {c} | {'yes' if t else 'no'} | "
          f"{med([j['latency_ms']['p50'] for j in js]):.2f} | "
          f"{med([j['latency_ms']['p99'] for j in js]):.2f} | "
          f"{med([j['predict_requests_per_s'] for j in js]):,.0f} | "
          f"{med([j['train_samples_per_s'] for j in js]):,.0f} | {len(js)} |")
for c in sorted({c for c, _ in rows}):
    if (c, True) in rows and (c, False) in rows:
        busy = med([j["latency_ms"]["p99"] for j in rows[(c, True)]])
        idle = med([j["latency_ms"]["p99"] for j in rows[(c, False)]])
        print(f"clients {c}: p99 with training / without = {busy / idle:.2f}")
PY
