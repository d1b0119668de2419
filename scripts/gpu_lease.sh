#!/usr/bin/env bash
# First contact with a lent GPU machine (docs/cuda.md "Running on a lent
# GPU"): that machine cannot build the project (no gRPC/Protobuf/abseil
# packages, nothing to fetch), and a lease is 15 minutes of device time, a
# command at most 10, 64 MiB carried with the tree, at most 8 files of
# under 16 MiB back from $OUT. So everything is built and packed here, and
# each phase there is one device command with a global deadline.
#
#   bundle [--no-build]  (here) builds the CUDA test binaries and the
#       benchmarks, copies them with their shared libraries except glibc's,
#       cuBLAS's and NCCL's (the GPU machine's toolkit or pip wheels have
#       them), strips them and packs one xz archive, $lease/bundle.tar.xz
#       (carry ["build-gpu"]; kXzOptions); fails when it is over 48 MiB or
#       the archive and the tree together pass the 64 MiB carry limit.
#   tests  (GPU, <= 400 s) a preamble (nvidia-smi -q, driver and runtime
#       versions, glibc, ldd -r of every binary, compute-sanitizer's
#       version), then each GPU test binary under its own timeout, in order
#       of risk, with DLRM_REQUIRE_CUDA=1 (a missing device fails rather
#       than skips) and gtest XML per binary.
#   perf  (GPU, <= 240 s) DCNv2 with tables in device memory (TF32, then
#       bf16 with CUDA graphs), compute-sanitizer memcheck on the tiny-table,
#       device-slot and mapped-record tests, dlrm_bench_cuda (embedding GB/s
#       against the measured device copy bandwidth), kaggle.
#   rerun NAME[:FILTER]...  (GPU, <= 400 s) the named test binaries again
#       (cuda_dense_test:'CudaBf16*'), as `tests` runs them.
#   server-bench [dir]  (GPU) dlrm_bench's throughput table through the
#       bundled dlrm_server (docs/benchmark.md); not bounded, not summarised.
#   dry-run  (here; the CTest test gpu_lease_dry_run) packs the bundle from
#       an existing build as `bundle` does, then runs `tests` and `perf`
#       from it with the GPU cases skipping, and checks the size and output
#       limits.
#
# Each GPU phase writes, directly under $OUT (default build-gpu-out-PHASE):
# 0-summary.txt (one row per step: what ran, pass/fail/skip counts,
# seconds, exit status, result), 1-preamble.txt (tests) or 1-numbers.txt
# (perf: the benchmarks' output), 2-failures.txt (the failing and skipping
# steps' messages), 3-logs.tar.gz (every log and gtest XML). It exits 1
# when any step failed, skipped, timed out or did not start before the
# deadline; 2 on bad usage.
#
# Environment: DLRM_BUILD_DIR (build), GPU_LEASE_DIR (build-gpu),
# GPU_LEASE_SECONDS (the phase's budget), DLRM_LEASE_DCN_ROWS (1000000).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

build=${DLRM_BUILD_DIR:-build}
lease=${GPU_LEASE_DIR:-build-gpu}
archive=$lease/bundle.tar.xz
# Unpacked beside the carried folder (which each carry replaces), so a warm
# machine unpacks once for both phases.
bin=${lease%/}-run
readonly kBundleLimit=$((48 << 20))
readonly kCarryLimit=$((64 << 20))
readonly kOutFiles=8
readonly kOutFileLimit=$((16 << 20))
# The bundle's xz settings, for `bundle` and `dry-run` alike. The test
# binaries are each mostly the same static code, so a dictionary larger
# than a binary (128 MiB of the ~170 MB tarball) finds every copy after
# the first; at preset 0 that packs smaller than -6 with xz's default 8 MiB
# dictionary, several times faster (2026-12-02, 173 MB: 27.4 MiB in 23 s;
# -0 49.9 MiB in 37 s, -6 41.2 MiB in 199 s). One thread: a block is the
# whole tarball. Compressing takes ~750 MiB of memory, unpacking ~130 MiB.
readonly kXzOptions="--lzma2=preset=0,dict=128MiB -T1"

test_binaries=(cuda_core_test cuda_embedding_test cuda_dense_test
               cuda_store_test cuda_model_test model_test comm_test
               cuda_model_nccl_test predictor_test)
bench_binaries=(bench/dlrm_bench_cuda bench/dlrm_bench_train
                bench/dlrm_bench server/dlrm_server)

die() { echo "gpu_lease: $*" >&2; exit 2; }
now() { date +%s.%N; }
bytes() { stat -c %s "$1"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# ---------------------------------------------------------------- bundle

# Packs the built binaries into $1, an xz archive (kXzOptions).
pack_bundle() {
  local out=$1 stage
  stage=$(mktemp -d)
  mkdir -p "$stage/lib"
  local b
  for b in "${test_binaries[@]/#/$build/tests/}" "${bench_binaries[@]/#/$build/}"; do
    [[ -x $b ]] || { rm -rf "$stage"; die "$b is not built (bundle without --no-build builds it)"; }
    cp "$b" "$stage/"
    # Every resolved library except glibc's, the cuBLAS ones and NCCL's
    # (hundreds of MB; the GPU machine's CUDA or PyTorch's wheels have
    # them). cudart is small and carried, so the runtime matches the one
    # the tests were built with.
    ldd "$b" | awk '$3 ~ /^\// {print $3}' |
      grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|libcublas|libnccl' |
      xargs -r -I{} cp -L -n {} "$stage/lib/"
  done
  # Symbols are of no use there and would double the carried bytes.
  find "$stage" -type f -exec strip --strip-unneeded {} +
  # What was built, for the preamble.
  {
    echo "commit $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (with changes)')"
    echo "packed $(date -u +%FT%TZ)"
    echo "nvcc $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
    ldd "$build/tests/cuda_core_test" | awk '/libcudart/ {print $3}' | xargs -r readlink -f |
      sed 's/^/cudart /'
  } >"$stage/BUNDLE.txt"
  du -sb "$stage" | awk '{printf "bundle: %s bytes unpacked\n", $1}'
  mkdir -p "$(dirname "$out")"
  # Sorted by name, so that the order (and the distance between the
  # binaries' common code) does not depend on the file system.
  XZ_OPT=$kXzOptions tar -C "$stage" --sort=name -cJf "$out" .
  rm -rf "$stage"
}

# Fails when the archive is over the bundle limit, or it and the tree
# (tracked and untracked files git does not ignore) over the carry limit.
check_bundle_size() {
  local size tree
  size=$(bytes "$1")
  tree=$(git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s 2>/dev/null |
         awk '{s += $1} END {print s + 0}')
  echo "bundle: $1 $(mib "$size") (limit $(mib $kBundleLimit)); tree $(mib "$tree"); carried $(mib $((size + tree))) (limit $(mib $kCarryLimit))"
  if (( size > kBundleLimit )); then
    echo "gpu_lease: the bundle is over $(mib $kBundleLimit)" >&2; return 1
  fi
  if (( size + tree > kCarryLimit )); then
    echo "gpu_lease: bundle and tree are over the carry limit" >&2; return 1
  fi
}

bundle() {
  if [[ ${1:-} != --no-build ]]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
    local targets=("${test_binaries[@]}")
    for b in "${bench_binaries[@]}"; do targets+=("$(basename "$b")"); done
    cmake --build "$build" --parallel 2 --target "${targets[@]}" || exit 1
  fi
  rm -rf "$lease" "$bin" && mkdir -p "$lease"
  pack_bundle "$archive"
  check_bundle_size "$archive" || exit 1
}

# ------------------------------------------------------- on the GPU machine

unpack() {
  [[ -f $archive ]] || die "no $archive: run 'scripts/gpu_lease.sh bundle' here and carry [\"$lease\"]"
  local stamp
  stamp=$(stat -c '%s %Y' "$archive")
  if [[ -f $bin/.stamp && $(cat "$bin/.stamp") == "$stamp" ]]; then return; fi
  rm -rf "$bin" && mkdir -p "$bin"
  # python3's tarfile where tar has no xz.
  tar -C "$bin" -xJf "$archive" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$archive" "$bin" || die "cannot unpack $archive"
  echo "$stamp" >"$bin/.stamp"
}

# The library path: the bundle's, then cuBLAS and NCCL (libnccl.so.2, a
# stable ABI across 2.x) from the toolkit, else the pip wheels'.
library_path() {
  local dirs=$B/lib d
  shopt -s nullglob
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
           /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
           /usr/lib/python3*/site-packages/nvidia/*/lib; do
    [[ -d $d ]] && dirs="$dirs:$d"
  done
  shopt -u nullglob
  echo "$dirs"
}

find_sanitizer() {
  local c
  c=$(command -v compute-sanitizer) && { echo "$c"; return; }
  shopt -s nullglob
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
           /opt/*/.venv/lib/python3*/site-packages/nvidia/*/compute-sanitizer/compute-sanitizer \
           /opt/*/.venv/lib/python3*/site-packages/nvidia/*/bin/compute-sanitizer; do
    [[ -x $c ]] && { echo "$c"; shopt -u nullglob; return; }
  done
  shopt -u nullglob
  return 1
}

# Step bookkeeping: one row per step in $work/rows, logs in $work/logs.
# A step's result: ok; FAIL (failed cases, or a nonzero exit); SKIP (a
# skipped case); NONE (a gtest filter that ran nothing); TIMEOUT; CRASH (a
# signal, no XML); LIBS (a library not found); NO-TOOL; NOT-RUN (the
# deadline came first). dry-run accepts skips and a benchmark that says
# the device is missing.
start_phase() {
  phase=$1 budget=$2
  [[ -n ${GPU_LEASE_SECONDS:-} ]] && budget=$GPU_LEASE_SECONDS
  out=${OUT:-${lease%/}-out-$phase}
  mkdir -p "$out"
  rm -f "$out"/0-summary.txt "$out"/1-preamble.txt "$out"/1-numbers.txt \
    "$out"/2-failures.txt "$out"/3-logs.tar.gz
  work=$(mktemp -d)
  mkdir -p "$work/logs"
  t0=$(now)
  # Packing the logs takes a few seconds; no step starts in the last 15.
  deadline=$(awk -v t="$t0" -v b="$budget" 'BEGIN { printf "%.3f", t + b - 15 }')
  nstep=0 failed=0
  : >"$work/rows"
  : >"$work/commands"
  unpack
  B=$(cd "$bin" && pwd)
  LD_LIBRARY_PATH="$(library_path):${LD_LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH
  # NCCL bootstraps over sockets: loopback in a VM without outside network.
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=1
  export NCCL_DEBUG=${NCCL_DEBUG:-VERSION}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
  if [[ -n ${dry:-} ]]; then unset DLRM_REQUIRE_CUDA; else export DLRM_REQUIRE_CUDA=1; fi
}

left() { awk -v d="$deadline" -v t="$(now)" 'BEGIN { printf "%d", d - t }'; }

row() {  # name what pass fail skip seconds rc result
  printf '%-3s %-34s %5s %5s %5s %7s %4s  %s\n' "$nstep" "$1" "$3" "$4" "$5" "$6" "$7" "$8" >>"$work/rows"
  printf '%-3s %s\n' "$nstep" "$2" >>"$work/commands"
  case $8 in
    ok) ;;
    SKIP | NO-TOOL) [[ -n ${dry:-} ]] || failed=1 ;;
    *) failed=1 ;;
  esac
}

# step KIND NAME CAP CMD...: KIND gtest (XML counted) or run (exit status;
# a bench). Runs CMD under `timeout` for min(CAP, time to the deadline).
step() {
  local kind=$1 name=$2 cap=$3
  shift 3
  nstep=$((nstep + 1))
  local id log xml
  id=$(printf '%02d-%s' "$nstep" "$name")
  log=$work/logs/$id.log xml=$work/logs/$id.xml
  local cmd=("$@")
  [[ $kind == gtest ]] && cmd+=(--gtest_output="xml:$xml" --gtest_brief=1)
  local what="${cmd[*]}"
  what=${what//$B\//}
  what=${what//$work\/logs\//}
  local t
  t=$(left)
  if (( t < 10 )); then
    row "$name" "$what" - - - 0 - NOT-RUN
    return
  fi
  (( t > cap )) && t=$cap
  local start rc secs
  start=$(now)
  echo "== $what (timeout ${t}s)" >"$log"
  timeout --kill-after=5 "$t" "${cmd[@]}" >>"$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  # A log over 4 MiB keeps its first and last 1 MiB.
  if (( $(bytes "$log") > (4 << 20) )); then
    { head -c $((1 << 20)) "$log"; echo; echo "[... cut ...]"; tail -c $((1 << 20)) "$log"; } >"$log.cut"
    mv "$log.cut" "$log"
  fi
  local pass=- fail=- skip=- result
  if [[ $kind == gtest && -s $xml ]]; then
    local tests
    tests=$(grep -c '<testcase ' "$xml")
    fail=$(grep -o -m1 '<testsuites [^>]*' "$xml" | grep -o ' failures="[0-9]*"' | tr -dc 0-9)
    skip=$(grep -c 'result="skipped"' "$xml")
    fail=${fail:-0}
    pass=$((tests - fail - skip))
  fi
  if (( rc == 124 || rc == 137 )); then result=TIMEOUT
  elif [[ $kind == gtest && ! -s $xml ]]; then result=CRASH
  elif [[ $kind == gtest ]] && (( fail > 0 || rc != 0 )); then result=FAIL
  elif [[ $kind == gtest ]] && (( pass + skip == 0 )); then result=NONE
  elif [[ $kind == gtest ]] && (( skip > 0 )); then result=SKIP
  elif (( rc != 0 )) && [[ -n ${dry:-} ]] &&
       grep -q -E 'FAILED_PRECONDITION: device cuda|no CUDA device' "$log"; then
    result=SKIP  # dry-run: the bench parsed its flags, then found no device
  elif (( rc != 0 )); then result=FAIL
  else result=ok
  fi
  row "$name" "$what" "$pass" "$fail" "$skip" "$secs" "$rc" "$result"
}

# A gtest binary of the bundle under `step`, unless a library is missing.
gtest_step() {
  local name=$1 cap=$2 filter=$3
  local b=$B/$name
  if ! [[ -x $b ]]; then
    nstep=$((nstep + 1)); row "$name" "$name (not in the bundle)" - - - 0 - FAIL; return
  fi
  if ldd "$b" 2>&1 | grep -q 'not found'; then
    nstep=$((nstep + 1))
    row "$name" "$name: $(ldd "$b" 2>&1 | grep 'not found' | tr -s ' \t\n' ' ')" - - - 0 - LIBS
    return
  fi
  step gtest "$name" "$cap" "$b" --gtest_filter="$filter"
}

# Writes $out's files and returns the phase's exit status.
finish_phase() {
  local elapsed
  elapsed=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }')
  {
    echo "gpu_lease $phase$( [[ -n ${dry:-} ]] && echo ' (dry-run: GPU cases skip, DLRM_REQUIRE_CUDA unset)')"
    echo "date $(date -u +%FT%TZ)  host $(hostname)  budget ${budget}s  elapsed ${elapsed}s  steps $( ((failed)) && echo FAILED || echo PASSED)"
    echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)"
    echo
    printf '%-3s %-34s %5s %5s %5s %7s %4s  %s\n' '#' step pass fail skip seconds rc result
    cat "$work/rows"
    echo
    echo "What each step ran (binaries in the unpacked bundle, $bin/):"
    cat "$work/commands"
  } >"$out/0-summary.txt"
  # The failing and skipping steps: their skip messages and the last lines
  # of their logs (gtest_brief prints only failing cases).
  {
    local id
    while read -r n name _ _ _ _ _ result; do
      [[ $result == ok ]] && continue
      id=$(printf '%02d-%s' "$n" "$name")
      echo "==== $n $name: $result"
      [[ -f $work/logs/$id.xml ]] &&
        grep -o -E 'name="[^"]*"[^>]*result="skipped"|skipped message="[^"]*"' "$work/logs/$id.xml" | head -40
      [[ -f $work/logs/$id.log ]] && tail -n 80 "$work/logs/$id.log"
      echo
    done <"$work/rows"
  } >"$out/2-failures.txt"
  [[ -f $work/numbers ]] && cp "$work/numbers" "$out/1-numbers.txt"
  [[ -f $work/preamble ]] && cp "$work/preamble" "$out/1-preamble.txt"
  tar -C "$work" -czf "$out/3-logs.tar.gz" logs
  rm -rf "$work"
  check_out "$out" || failed=1
  cat "$out/0-summary.txt"
  return $failed
}

# The device tool brings back at most kOutFiles files of under
# kOutFileLimit bytes, directly under $OUT.
check_out() {
  local n=0 f ok=0
  for f in "$1"/* "$1"/.[!.]*; do
    [[ -e $f ]] || continue
    n=$((n + 1))
    if [[ ! -f $f ]]; then echo "gpu_lease: $f is not a plain file" >&2; ok=1; continue; fi
    if (( $(bytes "$f") >= kOutFileLimit )); then
      echo "gpu_lease: $f is $(mib "$(bytes "$f")"), over the limit" >&2; ok=1
    fi
  done
  if (( n > kOutFiles )); then echo "gpu_lease: $n files under $1, over $kOutFiles" >&2; ok=1; fi
  return $ok
}

preamble() {
  local p=$work/preamble b sanitizer
  {
    echo "== date"; date -u +%FT%TZ
    echo "== uname"; uname -a
    echo "== cpus, memory, disk"; nproc; free -g 2>/dev/null; df -h . 2>/dev/null
    echo "== nvidia-smi"; timeout 30 nvidia-smi 2>&1
    echo "== nvidia-smi -q"; timeout 30 nvidia-smi -q 2>&1
    echo "== driver"; cat /proc/driver/nvidia/version 2>&1
    echo "== bundle"; cat "$bin/BUNDLE.txt" 2>&1
    echo "== glibc"; ldd --version 2>&1 | head -1; getconf GNU_LIBC_VERSION 2>&1
    echo "== library path"; echo "$LD_LIBRARY_PATH" | tr : '\n'
    echo "== cuBLAS and NCCL found"
    echo "$LD_LIBRARY_PATH" | tr : '\n' | while read -r d; do
      [[ -d $d ]] && ls -d "$d"/libcublas.so* "$d"/libcublasLt.so* "$d"/libnccl.so* 2>/dev/null
    done
    echo "== environment"; env | grep -E '^(NCCL_|DLRM_|OMP_|CUDA_)' | sort
    echo "== compute-sanitizer"
    if sanitizer=$(find_sanitizer); then echo "$sanitizer"; "$sanitizer" --version 2>&1; else echo "not found"; fi
    for b in "$bin"/*; do
      [[ -f $b && -x $b && $b != *.txt ]] || continue
      echo "== ldd -r $(basename "$b")"; ldd -r "$b" 2>&1 | head -200
    done
  } >"$p" 2>&1
}

tests_phase() {
  start_phase tests 400
  preamble
  # In order of risk: the RAII wrappers and one kernel first, the model
  # and the NCCL library last. Caps add up past the budget: the deadline
  # cuts the last ones short.
  gtest_step cuda_core_test 30 '*'
  gtest_step cuda_embedding_test 90 '*'
  gtest_step cuda_dense_test 60 '*'
  gtest_step cuda_store_test 45 '*'
  gtest_step cuda_model_test 90 '*'
  # model_test's GPU cases (the rest reads the source tree by the path it
  # was built in).
  gtest_step model_test 30 'ModelTest.Cuda*'
  # The NCCL and device communicators at one rank; CommNcclRanksTest needs
  # 2-4 GPUs and would skip on one.
  gtest_step comm_test 45 '*CommNccl*:*CommDevice*:-*CommNcclRanksTest*'
  gtest_step cuda_model_nccl_test 30 '*Nccl*'
  gtest_step predictor_test 30 'SnapshotPredictorTest.OnCuda*'
  finish_phase
}

rerun_phase() {
  (( $# > 0 )) || die "rerun NAME[:FILTER]..."
  start_phase rerun 400
  local a
  for a in "$@"; do
    local name=${a%%:*} filter='*'
    [[ $a == *:* ]] && filter=${a#*:}
    gtest_step "$name" 300 "$filter"
  done
  finish_phase
}

perf_phase() {
  start_phase perf 240
  local rows=${DLRM_LEASE_DCN_ROWS:-1000000} batch=65536 kaggle_batch=16384
  # dry-run: the same flags on shapes a CPU-only machine dismisses at once.
  [[ -n ${dry:-} ]] && rows=1000 batch=512 kaggle_batch=512
  local b=$B train=("$B/dlrm_bench_train" --device cuda --batches 2)
  # DCNv2 (26 tables of dim 128, 214 ids a sample) with every table in
  # device memory, rows capped (every table gets `rows`) so it fits and
  # starts in seconds.
  local dcn=("${train[@]}" --config mlperf-dlrm-dcnv2 --rows "$rows"
             --batch "$batch" --tables-on-device all --warmup 3 --steps 10
             --repeats 3)
  step run train-dcnv2-tf32 60 "${dcn[@]}" --tf32 on
  step run train-dcnv2-bf16-graphs 60 "${dcn[@]}" --precision bf16 --cuda-graphs on
  # memcheck on the kernels most likely to index out of bounds: the chunked
  # backward's tiny tables, the device cache's slots and the mapped-record
  # copies (its direct path).
  local sanitizer mc=()
  if sanitizer=$(find_sanitizer); then
    mc=("$sanitizer" --tool memcheck --error-exitcode 1)
  elif [[ -z ${dry:-} ]]; then
    nstep=$((nstep + 1)); row memcheck "compute-sanitizer not found" - - - 0 - NO-TOOL
  fi
  # (dry-run without the tool: the same binaries and filters, plainly.)
  if (( ${#mc[@]} > 0 )) || [[ -n ${dry:-} ]]; then
    step gtest memcheck-tiny-table 40 "${mc[@]}" "$b/cuda_embedding_test" \
      --gtest_filter='*CudaTinyTableTest*'
    step gtest memcheck-slots-records 50 "${mc[@]}" "$b/cuda_store_test" \
      --gtest_filter='DeviceSlotsTest.*:RecordKernelsTest.*:CudaCachedStoreTest.*'
  fi
  # Embedding GB/s as a share of the device's measured copy bandwidth.
  step run bench-cuda 40 "$b/dlrm_bench_cuda"
  step run train-kaggle 30 "${train[@]}" --config kaggle --batch "$kaggle_batch" \
    --tables-on-device all --warmup 5 --steps 20 --repeats 3
  # The benchmarks' numbers in one file.
  local f
  for f in "$work"/logs/*train-* "$work"/logs/*bench-cuda*; do
    [[ -f $f ]] && { cat "$f"; echo; }
  done >"$work/numbers"
  finish_phase
}

server_bench() {
  unpack
  B=$(cd "$bin" && pwd)
  LD_LIBRARY_PATH="$(library_path):${LD_LIBRARY_PATH:-}" exec "$B/dlrm_bench" \
    --server "$B/dlrm_server" --config kaggle --ranks 0 --no-chart \
    --out "${1:-bench-gpu}"
}

dry_run() {
  dry=1
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  lease=$tmp/lease bin=$tmp/lease-run archive=$tmp/lease/bundle.tar.xz
  mkdir -p "$lease"
  # The same archive `bundle` packs, so the size check is the real one.
  local t
  t=$(now)
  pack_bundle "$archive"
  check_bundle_size "$archive" || return 1
  echo "dry-run: bundle packed and checked in $(awk -v a="$t" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }') s"
  local status=0
  OUT=$tmp/out-tests tests_phase || status=1
  OUT=$tmp/out-perf perf_phase || status=1
  # The summary is the first file, and says what ran.
  for p in tests perf; do
    [[ $(ls "$tmp/out-$p" | head -1) == 0-summary.txt ]] ||
      { echo "gpu_lease: out-$p does not start with 0-summary.txt" >&2; status=1; }
  done
  grep -q 'cuda_core_test' "$tmp/out-tests/0-summary.txt" || status=1
  grep -q 'nvidia-smi -q' "$tmp/out-tests/1-preamble.txt" || status=1
  echo "dry-run: exit $status"
  return $status
}

case "${1:-}" in
  bundle) shift; bundle "$@" ;;
  tests) tests_phase ;;
  perf) perf_phase ;;
  rerun) shift; rerun_phase "$@" ;;
  server-bench) shift; server_bench "$@" ;;
  dry-run | --dry-run) dry_run ;;
  *)
    echo "usage: $0 bundle [--no-build] | tests | perf | rerun NAME[:FILTER]... | server-bench [dir] | dry-run" >&2
    exit 2
    ;;
esac
