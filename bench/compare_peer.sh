#!/usr/bin/env bash
# Training samples/s of dlrm-server against the PyTorch eager peer
# (../shared/peers/torch_dlrm.py) on the same machine in one run: the default
# Kaggle shape with 26 tables of 100k rows, batch 2048, Zipf(1.05) ids.
# Runs each side `rounds` times, alternating, and prints every JSON line;
# quote the medians. Needs `scripts/install-deps.sh --peers` (python3-torch).
#
# Usage: bench/compare_peer.sh [rounds] [batch]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
batch=${2:-2048}
peer=${PEER:-../shared/peers/torch_dlrm.py}
bench=build/bench/dlrm_bench_train
[[ -x $bench ]] || ./scripts/build.sh
for ((r = 0; r < rounds; r++)); do
  for t in 1 2; do
    /usr/bin/python3 "$peer" --threads "$t" --batch "$batch" --rows 100000 \
      --iters 30 --warmup 5
  done
  $bench --config kaggle --rows 100000 --batch "$batch" --iters 30 \
    --warmup 5 --repeats 3
done
