#!/usr/bin/env bash
# The one-step issue's measurements, alternating the sides in each round:
# the in-process kaggle step and the 2-rank server job of two builds
# (BEFORE, AFTER: build dirs, or folders holding bench/dlrm_bench_train,
# bench/ or clients/dlrm_bench and server/dlrm_server), then AFTER's
# in-process 2-rank step and its 1-process server job.
# Prints one line per measurement; raw outputs go to $OUT.
#
set -euo pipefail
before=$1 after=$2 rounds=${3:-3}
OUT=${OUT:-/tmp/compare_one_step}
rm -rf "$OUT"; mkdir -p "$OUT"
# BEFORE may predate the one flag names (core/cli_parse.h): its
# dlrm_bench_train gets --iters, which AFTER's takes as --steps.
rate() { grep -o '"samples_per_s": [0-9]*' "$1" | tail -1 | awk '{print $2}'; }
# dlrm_bench lived in clients/ before it moved to bench/.
job_bench() {
  if [[ -x $1/bench/dlrm_bench ]]; then echo "$1/bench/dlrm_bench"
  else echo "$1/clients/dlrm_bench"; fi
}
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    b=$before; [[ $side == after ]] && b=$after
    "$b/bench/dlrm_bench_train" --config kaggle --rows 100000 --batch 2048 \
        --iters 30 --repeats 5 > "$OUT/train-$side-$r.json" 2>/dev/null
    echo "round $r kaggle step $side: $(rate "$OUT/train-$side-$r.json")"
  done
  for side in before after; do
    b=$before; [[ $side == after ]] && b=$after
    "$(job_bench "$b")" --config kaggle --no-client-stream \
        --no-in-process --ranks 2 --steps 20 --repeats 3 --no-chart \
        --out "$OUT/job-$side-$r" > "$OUT/job-$side-$r.log" 2>&1
    echo "round $r server job 2 ranks $side: $(grep '2 rank processes' "$OUT/job-$side-$r.log" | head -1 | awk -F'|' '{print $5}')"
    [[ $side == after ]] && echo "round $r server job 1 process: $(grep ' 1 process' "$OUT/job-$side-$r.log" | head -1 | awk -F'|' '{print $5}')"
  done
  "$after/bench/dlrm_bench_hybrid" --ranks 2 --rows 100000 --steps 20 \
      --repeats 3 > "$OUT/hybrid-$r.json" 2> "$OUT/hybrid-$r.log"
  echo "round $r in-process 2 ranks: $(rate "$OUT/hybrid-$r.json")"
done
