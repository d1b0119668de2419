#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang++-14 (ASan + UBSan)
# into build-fuzz/ and runs each for a bounded time on its seed corpus
# (tests/fuzz/corpus/<target>/), as many at once as there are cores
# (DLRM_FUZZ_JOBS; each target is one process on one core for its whole
# time). Exits non-zero when a target finds a crash, leak, UB or broken
# invariant (after the targets running beside it end); the input is kept
# as build-fuzz/artifacts/<target>/crash-* (docs/fuzzing.md).
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#        scripts/fuzz.sh --build [TARGET...]   (only builds them)
#   SECONDS_PER_TARGET  default $DLRM_FUZZ_SECONDS or 20
#   TARGET              default: all six
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
if [[ ${1:-} == --build ]]; then
  build_only=1
  shift
  seconds=0
else
  seconds="${1:-${DLRM_FUZZ_SECONDS:-20}}"
  shift || true
fi
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(criteo_tsv_fuzz criteo_binary_fuzz model_config_fuzz wire_batch_fuzz
    npy_fuzz safetensors_fuzz)
fi

cxx="${DLRM_FUZZ_CXX:-clang++-14}"
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found (scripts/install-deps.sh installs clang-14)" >&2
  exit 1
fi
cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz --parallel "$(nproc)" -- "${targets[@]}"
if ((build_only)); then
  echo "fuzz: built ${targets[*]}"
  exit 0
fi

# Leaks are findings too; UBSan reports abort (-fno-sanitize-recover).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Runs target $1 for $seconds; its exit status is the finding's.
fuzz_target() {
  local t=$1
  # New inputs go to a scratch copy, so the checked-in seeds stay small.
  local work="build-fuzz/corpus/$t" artifacts="build-fuzz/artifacts/$t"
  mkdir -p "$work" "$artifacts"
  "build-fuzz/$t" -max_total_time="$seconds" -max_len=4096 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$work" "tests/fuzz/corpus/$t" \
    2>"build-fuzz/$t.log"
}
njobs=${DLRM_FUZZ_JOBS:-$(nproc)}
status=0
for ((i = 0; i < ${#targets[@]}; i += njobs)); do
  group=("${targets[@]:i:njobs}")
  pids=()
  echo "fuzz: ${group[*]} for ${seconds}s"
  for t in "${group[@]}"; do
    fuzz_target "$t" &
    pids+=($!)
  done
  for j in "${!group[@]}"; do
    t=${group[j]}
    if wait "${pids[j]}"; then
      grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" \
        "build-fuzz/$t.log" | sed "s/^/fuzz: $t /"
    else
      tail -n 60 "build-fuzz/$t.log" >&2
      echo "fuzz: $t FAILED; input in build-fuzz/artifacts/$t/ (see docs/fuzzing.md)" >&2
      status=1
    fi
  done
  ((status == 0)) || exit 1
done
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s each without a finding"
