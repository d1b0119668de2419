#!/usr/bin/env bash
# Runs the CUDA tests on a GPU machine that cannot build the project (no
# gRPC/Protobuf/abseil packages there, nothing to fetch): `bundle` (here)
# builds the CUDA test binaries and copies them with their shared libraries,
# except the big CUDA libraries the GPU machine has, into build-gpu/;
# `run` (on the GPU machine, with build-gpu/ carried there) runs them,
# `bench` runs the kernel timings (dlrm_bench_cuda) and `train` the model's
# training throughput on the GPU (dlrm_bench_train: tables in device
# memory, and in host memory with the dense part on the GPU); `sanitize`
# runs compute-sanitizer's memcheck and racecheck over the embedding
# kernels' tests (cuda_embedding_test, and the device cache's slots in
# cuda_store_test) and fails on any report; `server-bench [dir]` runs
# dlrm_bench's throughput table (its GPU rows included) through the bundled
# dlrm_server. The NCCL tests (comm_test's device communicators,
# cuda_model_nccl_test) and dlrm_server take libnccl.so.2 from the GPU
# machine, as they take cuBLAS.
# Usage: scripts/cuda_bundle.sh bundle | run [gtest filter] | bench | train |
#        sanitize [gtest filter] | server-bench [dir]
set -euo pipefail
cd "$(dirname "$0")/.."
tests=(cuda_core_test cuda_embedding_test cuda_store_test cuda_dense_test
       cuda_model_test model_test predictor_test comm_test
       cuda_model_nccl_test)
out=build-gpu
# What is carried: one xz archive of the stripped binaries and libraries
# (about 38 MB of 155; the carry limit is 64 MiB with the source tree),
# unpacked into $bin on the GPU machine at the first run.
archive=$out/bundle.tar.xz
bin=$out/unpacked

case "${1:-}" in
  bundle)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build --parallel 2 --target "${tests[@]}" dlrm_bench_cuda \
      dlrm_bench_train dlrm_bench dlrm_server
    rm -rf "$out" && mkdir -p "$bin/lib"
    for b in "${tests[@]/#/build/tests/}" build/bench/dlrm_bench_cuda \
             build/bench/dlrm_bench_train build/clients/dlrm_bench \
             build/server/dlrm_server; do
      cp "$b" "$bin/"
      # Every resolved library except glibc's, the cuBLAS ones and NCCL's
      # (hundreds of MB; the GPU machine's CUDA 13 or PyTorch's wheels have
      # them). cudart is small and carried, so the runtime matches the one
      # the tests were built with.
      ldd "$b" | awk '$3 ~ /^\// {print $3}' |
        grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|libcublas|libnccl' |
        xargs -r -I{} cp -L -n {} "$bin/lib/"
    done
    # Symbols are of no use there and would double the carried bytes.
    find "$bin" -type f -exec strip --strip-unneeded {} +
    XZ_OPT="-6 -T2" tar -C "$bin" -cJf "$archive" .
    rm -rf "$bin"
    du -sh "$archive"
    ;;
  run | bench | train | sanitize | server-bench)
    if [[ ! -d $bin ]]; then
      mkdir -p "$bin"
      # python3's tarfile where tar has no xz.
      tar -C "$bin" -xJf "$archive" 2>/dev/null ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
          "$archive" "$bin"
    fi
    # cuBLAS and NCCL (libnccl.so.2, a stable ABI across 2.x): the
    # toolkit's, else the pip wheels' next to PyTorch.
    cublas_dirs=/usr/local/cuda/lib64
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu*/lib \
             /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib \
             /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib; do
      [[ -d $d ]] && cublas_dirs="$cublas_dirs:$d"
    done
    export LD_LIBRARY_PATH="$PWD/$bin/lib:$cublas_dirs:${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    if [[ $1 == bench ]]; then exec "$bin/dlrm_bench_cuda"; fi
    if [[ $1 == server-bench ]]; then
      # The throughput table through a real dlrm_server (docs/benchmark.md):
      # the CPU row and the two GPU rows; JSON into ${2:-bench-gpu}.
      exec "$bin/dlrm_bench" --server "$bin/dlrm_server" --config kaggle \
        --ranks 0 --no-chart --out "${2:-bench-gpu}"
    fi
    if [[ $1 == train ]]; then
      t=("$bin/dlrm_bench_train" --device cuda --warmup 5 --iters 20 --repeats 3)
      "${t[@]}" --config kaggle --batch 16384 --tables-on-device all
      "${t[@]}" --config mlperf-dlrm-v1 --rows 4000000 --batch 65536 \
        --tables-on-device all
      "${t[@]}" --config mlperf-dlrm-dcnv2 --rows 4000000 --batch 65536 \
        --tables-on-device all
      # The embeddings in host memory, the dense part on the GPU.
      "${t[@]}" --config mlperf-dlrm-v1 --rows 4000000 --batch 65536
      exit 0
    fi
    status=0
    if [[ $1 == sanitize ]]; then
      sanitizer=$(command -v compute-sanitizer ||
                  echo /usr/local/cuda/bin/compute-sanitizer)
      # The 8 GiB table of CudaLargeTableTest would take hours under the
      # tools; its kernels are the ones the other shapes run.
      filter=${2:-*:-CudaLargeTableTest.*}
      for tool in memcheck racecheck; do
        for t in cuda_embedding_test cuda_store_test; do
          f=$filter
          [[ $t == cuda_store_test && -z ${2:-} ]] && f='DeviceSlots*:RecordKernels*:CudaCachedStore*'
          echo "== $tool $t $f"
          "$sanitizer" --tool "$tool" --error-exitcode 1 "$bin/$t" \
            --gtest_filter="$f" --gtest_brief=1 || status=1
        done
      done
      exit $status
    fi
    for t in "${tests[@]}"; do
      if ldd "$bin/$t" | grep 'not found'; then
        echo "$t: missing libraries (above)"; status=1; continue
      fi
      f=${2:-*}
      # model_test: its GPU cases (the dense step on the device at fp32 and
      # bf16 against the CPU's); the rest reads files of the source tree by
      # the path it was built in.
      [[ $t == model_test && -z ${2:-} ]] && f='ModelTest.Cuda*'
      # predictor_test: its GPU cases (predictions beside a CUDA model's
      # step, a restore, the refusals).
      [[ $t == predictor_test && -z ${2:-} ]] && f='SnapshotPredictorTest.OnCuda*'
      # comm_test: the device communicators (NCCL at world size 1, the CUDA
      # host-staged one over Gloo between rank processes).
      [[ $t == comm_test && -z ${2:-} ]] && f='*CommNccl*:*CommDevice*'
      # cuda_model_nccl_test: cuda_model_test's source; only its NCCL case
      # is new.
      [[ $t == cuda_model_nccl_test && -z ${2:-} ]] && f='*Nccl*'
      "$bin/$t" --gtest_filter="$f" --gtest_brief=1 || status=1
    done
    exit $status
    ;;
  *)
    echo "usage: $0 bundle | run [gtest filter] | bench | train | sanitize [gtest filter] | server-bench [dir]" >&2
    exit 2
    ;;
esac
