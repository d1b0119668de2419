#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts dlrm_server with the
# default model (the Criteo Kaggle shape), trains it through gRPC on a
# synthetic Criteo-shaped dataset the server generates (a dataset job),
# evaluates it against the planted teacher, predicts a few samples, prints
# the results and stops the server cleanly.
# Arguments replace the job's default `--steps 1500` and go to
# `dlrm_client job start` (e.g. `scripts/run.sh --steps 300`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh

work=$(mktemp -d)
server=./build/server/dlrm_server
client=./build/clients/dlrm_client
"$server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --config kaggle \
  --checkpoint-dir "$work/checkpoints" >"$work/server.out" 2>"$work/server.log" &
pid=$!
stop_server() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait "$pid" || true
  fi
  rm -rf "$work"
}
trap stop_server EXIT

# The server prints one line once it listens: parse the address from it.
for _ in $(seq 600); do
  grep -q "listening on" "$work/server.out" && break
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$work/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
address=$(sed -n 's/^dlrm_server: listening on \([^ ]*\).*/\1/p' "$work/server.out")
echo "== dlrm_server on $address (log: server.log; metrics: $(sed -n 's/.* metrics //p' "$work/server.out"))"
c=("$client" --server "$address")

echo "== model"
"${c[@]}" info
job_args=(--steps 1500)
[[ $# -gt 0 ]] && job_args=("$@")
echo "== training: a server-side job over synthetic data, batches of 2048: ${job_args[*]}"
"${c[@]}" job start --synthetic 0 --batch 2048 --eval-synthetic 131072 \
  --eval-interval 500 --wait "${job_args[@]}"
echo "== evaluation on 131072 fresh synthetic samples (the teacher's metrics are the ceiling)"
"${c[@]}" eval --synthetic 131072
echo "== click probabilities of five samples (Criteo TSV, no label column)"
awk 'BEGIN { srand(7); for (s = 0; s < 5; ++s) { line = "";
  for (i = 0; i < 13; ++i) line = line int(rand() * 20) "\t";
  for (i = 0; i < 26; ++i) line = line sprintf("%08x", int(rand() * 2^31)) (i < 25 ? "\t" : "");
  print line } }' >"$work/samples.tsv"
"${c[@]}" predict "$work/samples.tsv"
echo "== stopping the server"
kill -TERM "$pid"
wait "$pid"
echo "dlrm_server exited cleanly"
