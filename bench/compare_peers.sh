#!/usr/bin/env bash
# Training samples/s of dlrm-server (build/bench/dlrm_bench_train) against
# the peers in bench/peers/ (TorchRec with fbgemm's fused CPU table-batched
# embeddings, and PyTorch eager), on this machine in one run, for each shape
# and precision:
#   kaggle        configs/kaggle.textproto, every table KAGGLE_ROWS rows
#                 (default 100000), SGD
#   mlperf-dcnv2  configs/mlperf-dlrm-dcnv2.textproto with every table capped
#                 at DCN_MAX_ROWS rows (default 1000000: 7.1M rows, 3.4 GiB of
#                 fp32 weights; the real 40M cap needs 105 GB), Adagrad
# and fp32 / bf16 (the peers: the dense part under torch.autocast bf16; our
# side only when dlrm_bench_train has a precision flag, else the bf16 rows
# are skipped with a message). Each round runs our side, then every peer at
# every thread count of PEER_THREADS, back to back; every JSON line is
# printed as it comes, then a table of medians over the rounds and the
# ratios of our best thread count to each peer's best.
#
# Usage: bench/compare_peers.sh [rounds (3)] [batch (2048)]
# Environment (defaults in brackets):
#   VENV          the peers' venv [~/.cache/dlrm-peers-venv]; made by
#                 bench/peers/setup_venv.sh
#   BENCH         our binary [build/bench/dlrm_bench_train; built if missing]
#   SHAPES        [kaggle mlperf-dcnv2]
#   PRECISIONS    [fp32 bf16]
#   PEERS         [torchrec torch-eager]
#   PEER_THREADS  [1 and the number of cores]
#   OUR_THREADS   [the number of cores; "1 2" measures ours at both too]
#   KAGGLE_ROWS / KAGGLE_MAX_ROWS, DCN_ROWS / DCN_MAX_ROWS
#                 --rows (every table) / --max-rows (a cap) of each shape,
#                 passed to the peers and applied to our config alike
#                 [100000 / none, none / 1000000; set one empty to drop it]
#   KAGGLE_ITERS KAGGLE_WARMUP DCN_ITERS DCN_WARMUP REPEATS
#                 timed steps per repetition, warm-up steps, repetitions
#                 (median reported) of every run [30 5 5 2 3]
#   OUR_BF16_ARGS our side's bf16 flag(s) [found in dlrm_bench_train --help]
#   LOG           file that keeps every JSON line with its labels [a temp file]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
batch=${2:-2048}
cores=$(nproc)
venv=${VENV:-$HOME/.cache/dlrm-peers-venv}
py=$venv/bin/python
bench=${BENCH:-build/bench/dlrm_bench_train}
shapes=${SHAPES:-kaggle mlperf-dcnv2}
precisions=${PRECISIONS:-fp32 bf16}
peers=${PEERS:-torchrec torch-eager}
peer_threads=${PEER_THREADS:-$(printf '%s\n' 1 "$cores" | sort -un | tr '\n' ' ')}
our_threads=${OUR_THREADS:-$cores}
repeats=${REPEATS:-3}
log=${LOG:-$(mktemp /tmp/compare_peers.XXXXXX)}
: >"$log"
tmp=$(mktemp -d /tmp/compare_peers_cfg.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

if [[ ! -x $py ]]; then
  echo "no peer venv at $venv: run bench/peers/setup_venv.sh first" >&2
  exit 1
fi
if [[ ! -x $bench ]]; then
  ./scripts/build.sh
fi

# The host first: every ratio below holds for this CPU and ISA only.
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $cores cores"
echo "host ISA: $(grep -o -w 'amx_tile\|avx512_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"

# Our side's precision flag, if dlrm_bench_train has one (fp32 needs it too:
# the default, auto, is bf16 on an AMX host).
help=$("$bench" --help 2>&1 || true)
our_bf16=()
our_fp32=()
if [[ -n ${OUR_BF16_ARGS:-} ]]; then
  read -r -a our_bf16 <<<"$OUR_BF16_ARGS"
else
  for flag in --dense-precision --precision; do
    if grep -q -- "$flag\b" <<<"$help"; then
      our_bf16=("$flag" bf16)
      our_fp32=("$flag" fp32)
      break
    fi
  done
fi

# Table sizes of a shape: the peers' flags and our config.
table_args() {  # shape -> peer flags
  local rows max
  if [[ $1 == kaggle ]]; then
    rows=${KAGGLE_ROWS-100000} max=${KAGGLE_MAX_ROWS-}
  else
    rows=${DCN_ROWS-} max=${DCN_MAX_ROWS-1000000}
  fi
  [[ -n $rows ]] && printf -- '--rows %s ' "$rows"
  [[ -n $max ]] && printf -- '--max-rows %s ' "$max"
  return 0
}
our_config_args() {  # shape -> dlrm_bench_train flags
  local file rows max
  if [[ $1 == kaggle ]]; then
    file=configs/kaggle.textproto rows=${KAGGLE_ROWS-100000} max=${KAGGLE_MAX_ROWS-}
  else
    file=configs/mlperf-dlrm-dcnv2.textproto rows=${DCN_ROWS-} max=${DCN_MAX_ROWS-1000000}
  fi
  if [[ -n $max ]]; then
    # The cap is the config's max_rows_per_table (applied when it is loaded).
    sed "s/^max_rows_per_table:.*/max_rows_per_table: $max/" "$file" >"$tmp/$1.textproto"
    file=$tmp/$1.textproto
  fi
  printf -- '--config %s ' "$file"
  [[ -n $rows ]] && printf -- '--rows %s ' "$rows"
  return 0
}
steps_args() {  # shape -> --steps/--warmup/--repeats
  if [[ $1 == kaggle ]]; then
    echo "--steps ${KAGGLE_ITERS:-30} --warmup ${KAGGLE_WARMUP:-5} --repeats $repeats"
  else
    echo "--steps ${DCN_ITERS:-5} --warmup ${DCN_WARMUP:-2} --repeats $repeats"
  fi
}

# Runs one side; prints its JSON line and keeps it with its labels.
run() {  # side shape precision threads round command...
  local side=$1 shape=$2 precision=$3 threads=$4 round=$5 out
  shift 5
  echo "# round $round: $side $shape $precision, $threads threads: $*" >&2
  if out=$(OMP_NUM_THREADS=$threads "$@" | tail -n 1) && [[ $out == '{'* ]]; then
    echo "$out"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$side" "$shape" "$precision" "$threads" \
      "$round" "$out" >>"$log"
  else
    echo "# $side $shape $precision $threads threads: failed (no JSON line)" >&2
  fi
}

echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cores cores," \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" >&2
echo "# JSON lines with labels: $log" >&2
for shape in $shapes; do
  for precision in $precisions; do
    if [[ $precision == bf16 && ${#our_bf16[@]} -eq 0 ]]; then
      echo "# skipping $shape bf16: $bench has no precision flag" \
        "(--dense-precision / --precision; or set OUR_BF16_ARGS)" >&2
      continue
    fi
    ours=()
    if [[ $precision == bf16 ]]; then ours=("${our_bf16[@]}"); else ours=("${our_fp32[@]}"); fi
    for ((r = 1; r <= rounds; r++)); do
      for t in $our_threads; do
        # shellcheck disable=SC2046
        run dlrm-server "$shape" "$precision" "$t" "$r" "$bench" \
          $(our_config_args "$shape") --batch "$batch" --threads "$t" \
          $(steps_args "$shape") "${ours[@]}"
      done
      for peer in $peers; do
        case $peer in
          torchrec) script=bench/peers/torchrec_dlrm.py ;;
          torch-eager) script=bench/peers/torch_eager_dlrm.py ;;
          *) echo "unknown peer $peer (torchrec, torch-eager)" >&2; exit 2 ;;
        esac
        for t in $peer_threads; do
          # shellcheck disable=SC2046
          run "$peer" "$shape" "$precision" "$t" "$r" "$py" "$script" --shape "$shape" \
            $(table_args "$shape") --batch "$batch" --threads "$t" \
            $(steps_args "$shape") --precision "$precision"
        done
      done
    done
  done
done

"$py" - "$log" <<'EOF'
import collections, json, statistics, sys

runs = collections.defaultdict(dict)  # (shape, precision, side, threads) -> round -> rate
for line in open(sys.argv[1]):
    side, shape, precision, threads, rnd, js = line.rstrip("\n").split("\t", 5)
    j = json.loads(js)
    if j.get("precision", precision) != precision:
        print(f"# warning: {side} {shape} round {rnd} asked for {precision}, "
              f"ran {j['precision']}", file=sys.stderr)
    runs[(shape, precision, side, int(threads))][int(rnd)] = j["samples_per_s"]
if not runs:
    sys.exit("no run produced a JSON line")

print("\n| shape | precision | program | threads | median samples/s | rounds |")
print("| --- | --- | --- | ---: | ---: | --- |")
for (shape, precision, side, threads), by_round in runs.items():  # in run order
    values = [by_round[r] for r in sorted(by_round)]
    print(f"| {shape} | {precision} | {side} | {threads} | "
          f"{statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} |")

# Per (shape, precision, program): the thread count with the best median.
best = {}
for (shape, precision, side, threads), by_round in runs.items():
    m = statistics.median(by_round.values())
    key = (shape, precision, side)
    if key not in best or m > best[key][1]:
        best[key] = (threads, m, by_round)
print("\n| shape | precision | peer | peer best (threads) | dlrm-server best (threads) "
      "| ratio of medians | median of per-round ratios |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
for (shape, precision, side), (pt, pm, prounds) in best.items():
    if side == "dlrm-server" or (shape, precision, "dlrm-server") not in best:
        continue
    ot, om, orounds = best[(shape, precision, "dlrm-server")]
    per_round = [orounds[r] / prounds[r] for r in orounds if r in prounds and prounds[r] > 0]
    per = f"{statistics.median(per_round):.2f}x" if per_round else "-"
    print(f"| {shape} | {precision} | {side} | {pm:,.0f} ({pt}) | {om:,.0f} ({ot}) "
          f"| {om / pm:.2f}x | {per} |")
EOF
