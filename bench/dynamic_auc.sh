#!/usr/bin/env bash
# Issue 33's AUC comparison: dlrm_train on the synthetic teacher stream with
# a vocabulary of VOCAB = 10 x CAPACITY ids per table (Zipf, drifting
# DRIFT rank positions per sample), on three configs of the kaggle shape
# (26 tables of dim 16, kaggle's MLPs and dense SGD; Adagrad for the
# tables, which learns their ids within a short run), written to $OUT:
#   full     static tables of VOCAB rows: every id has its own row
#   modulo   static tables of CAPACITY rows: ids taken % rows (today)
#   dynamic  dynamic tables of CAPACITY rows (TableConfig.dynamic: needs
#            the dynamic store; fails where the build has none)
# Each run trains STEPS steps of BATCH samples and evaluates EVAL samples
# drawn where training leaves the vocabulary; prints one line per config:
# its eval AUC (and the teacher's, the ceiling, where the batch ids are the
# teacher's: not under modulo). Raw logs go to $OUT.
#
# Usage: bench/dynamic_auc.sh [BUILD_DIR] [CONFIGS...]
#   e.g. bench/dynamic_auc.sh build full modulo
# Environment: CAPACITY (2000), DRIFT (0.002), STEPS (1000), BATCH (2048),
# EVAL (131072), THREADS (0 = all cores; 1 on a loaded host), SPARSE_LR
# (0.1), ROW_PRECISION (fp32, fp16 or bf16: every table's weight_precision,
# dlrm_train --row-precision; default: fp32), OUT (/tmp/dynamic_auc).
set -euo pipefail
build=${1:-build}
shift || true
configs=("$@")
[[ ${#configs[@]} -eq 0 ]] && configs=(full modulo dynamic)
CAPACITY=${CAPACITY:-2000}
VOCAB=$((10 * CAPACITY))
DRIFT=${DRIFT:-0.002}
STEPS=${STEPS:-1000}
BATCH=${BATCH:-2048}
EVAL=${EVAL:-131072}
THREADS=${THREADS:-0}
SPARSE_LR=${SPARSE_LR:-0.1}
ROW_PRECISION=${ROW_PRECISION:-fp32}
OUT=${OUT:-/tmp/dynamic_auc}
mkdir -p "$OUT"
train=$build/model/dlrm_train
[[ -x $train ]] || { echo "no $train (build dlrm_train first)" >&2; exit 1; }

# The kaggle shape with every table of `rows` rows; `dynamic` true or false.
write_config() {  # NAME ROWS DYNAMIC
  local file=$OUT/$1.textproto
  {
    echo "# bench/dynamic_auc.sh: $1 (kaggle shape, $2 rows per table)"
    echo "num_dense_features: 13"
    echo "embedding_dim: 16"
    for t in $(seq 1 26); do
      if [[ $3 == true ]]; then
        echo "tables { name: \"C$t\" rows: $2 dynamic: true }"
      else
        echo "tables { name: \"C$t\" rows: $2 }"
      fi
    done
    echo "bottom_mlp: [512, 256, 64, 16]"
    echo "top_mlp: [512, 256, 1]"
    echo "interaction: INTERACTION_DOT"
    echo "dense_optimizer { type: SGD learning_rate: 0.1 }"
    echo "sparse_optimizer { type: ADAGRAD learning_rate: $SPARSE_LR }"
    echo "seed: 1234"
  } > "$file"
  echo "$file"
}

echo "vocabulary $VOCAB per table, capacity $CAPACITY rows, drift $DRIFT," \
     "$STEPS steps of $BATCH, eval $EVAL samples, $ROW_PRECISION rows"
status=0
for name in "${configs[@]}"; do
  case $name in
    full) config=$(write_config full "$VOCAB" false) ;;
    modulo) config=$(write_config modulo "$CAPACITY" false) ;;
    dynamic) config=$(write_config dynamic "$CAPACITY" true) ;;
    *) echo "unknown config $name (full, modulo, dynamic)" >&2; exit 2 ;;
  esac
  log=$OUT/$name.log
  start=$(date +%s)
  if "$train" --config "$config" --vocabulary "$VOCAB" --drift "$DRIFT" \
      --steps "$STEPS" --batch "$BATCH" --eval-samples "$EVAL" \
      --log-interval 100 --threads "$THREADS" \
      --row-precision "$ROW_PRECISION" > "$log" 2>&1; then
    line=$(grep '^eval step' "$log" | tail -1)
    auc=$(sed -n 's/^eval step [0-9]*: samples [0-9]*  auc \([0-9.]*\).*/\1/p' \
        <<< "$line")
    teacher=$(sed -n 's/.*teacher auc \([0-9.]*\).*/\1/p' <<< "$line")
    printf '%-8s rows %-8s eval auc %s%s  (%ss)\n' "$name" \
        "$([[ $name == full ]] && echo "$VOCAB" || echo "$CAPACITY")" \
        "$auc" "${teacher:+  teacher auc $teacher}" "$(( $(date +%s) - start ))"
  else
    echo "$name: dlrm_train failed: $(tail -1 "$log")"
    status=1
  fi
done
exit $status
