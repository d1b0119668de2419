#!/usr/bin/env bash
# Two ranks on "hosts" of their own (network namespaces) joined through
# tests/tools/link_emulator with a one-way delay, alternating the delays in
# each round: a server-side synthetic job on kaggle (tables capped at 100k
# rows, global batch 2048); samples/s from the job and exchange bytes per
# step from /metrics. Needs root. Prints one line per run; logs go to $OUT.
#
# Usage: bench/netns_link.sh BUILD_DIR [ROUNDS] [STEPS] [DELAYS_MS...]
set -euo pipefail
build=$(realpath "$1"); rounds=${2:-3}; steps=${3:-30}; shift 3 || true
delays=("$@"); [[ ${#delays[@]} -gt 0 ]] || delays=(0 1 5)
OUT=${OUT:-/tmp/netns_link}
rm -rf "$OUT"; mkdir -p "$OUT"
src=$(cd "$(dirname "$0")/.." && pwd)
awk '/rows:/ { match($0, /rows: [0-9]+/); n = substr($0, RSTART + 6, RLENGTH - 6);
               if (n + 0 > 100000) sub(/rows: [0-9]+/, "rows: 100000") } { print }' \
    "$src/configs/kaggle.textproto" > "$OUT/kaggle-100k.textproto"
ns=dlrmbench-$$ ranks=() emu=""
cleanup() {
  [[ -n $emu ]] && kill "$emu" 2>/dev/null || true
  for p in "${ranks[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for n in m 0 1; do ip netns del "$ns-$n" 2>/dev/null || true; done
  ip link del dlrmbench0 2>/dev/null || true
}
trap cleanup EXIT
for n in m 0 1; do ip netns add "$ns-$n"; ip -n "$ns-$n" link set lo up; done
for r in 0 1; do
  ip -n "$ns-m" link add port$r type veth peer name eth0 netns "$ns-$r"
  ip -n "$ns-$r" addr add 10.77.0.$((r + 1))/24 dev eth0
  ip -n "$ns-$r" link set eth0 up; ip -n "$ns-m" link set port$r up
done
ip link add dlrmbench0 type veth peer name client netns "$ns-0"
ip addr add 10.78.250.1/30 dev dlrmbench0; ip link set dlrmbench0 up
ip -n "$ns-0" addr add 10.78.250.2/30 dev client; ip -n "$ns-0" link set client up

client="$build/clients/dlrm_client --server 10.78.250.2:50051"
port=29500
for round in $(seq 1 "$rounds"); do
  for d in "${delays[@]}"; do
    tag="delay$d-round$round"
    ip netns exec "$ns-m" "$build/tests/link_emulator" --delay-ms "$d" port0 port1 \
        > "$OUT/$tag-emulator.log" 2>&1 & emu=$!
    ranks=(); port=$((port + 1))
    for r in 0 1; do
      listen=10.77.0.$((r + 1)):0; [[ $r == 0 ]] && listen=10.78.250.2:50051
      ip netns exec "$ns-$r" "$build/server/dlrm_server" \
          --config "$OUT/kaggle-100k.textproto" --listen "$listen" \
          --metrics-listen "" --world-size 2 --rank $r \
          --coordinator 10.77.0.1:$port --comm-bind-address 10.77.0.$((r + 1)) \
          > "$OUT/$tag-rank$r.log" 2>&1 & ranks+=($!)
    done
    until grep -q "listening on" "$OUT/$tag-rank0.log"; do sleep 0.2; done
    $client job start --synthetic 0 --steps "$steps" --batch 2048 --wait \
        > "$OUT/$tag-job.log" 2>&1
    $client metrics > "$OUT/$tag-metrics.txt"
    bytes=$(awk '/^dlrm_exchange_bytes_total/ { s += $2 } END { printf "%.0f", s }' \
        "$OUT/$tag-metrics.txt")
    echo "round $round delay ${d} ms: $(grep SUCCEEDED "$OUT/$tag-job.log" | grep -o 'samples/s [0-9]*' | awk '{print $2}') samples/s," \
         "exchange bytes/step (rank 0) $((bytes / steps))"
    kill -TERM "${ranks[0]}"; wait "${ranks[@]}" || true; ranks=()
    kill "$emu"; wait "$emu" 2>/dev/null || true; emu=""
  done
done
