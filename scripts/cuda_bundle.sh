#!/usr/bin/env bash
# Runs the CUDA tests on a GPU machine that cannot build the project (no
# gRPC/Protobuf/abseil packages there, nothing to fetch): `bundle` (here)
# builds the CUDA test binaries and copies them with their shared libraries,
# except the big CUDA libraries the GPU machine has, into build-gpu/;
# `run` (on the GPU machine, with build-gpu/ carried there) runs them, and
# `bench` runs the kernel timings (dlrm_bench_cuda).
# Usage: scripts/cuda_bundle.sh bundle | run [gtest filter] | bench
set -euo pipefail
cd "$(dirname "$0")/.."
tests=(cuda_core_test cuda_embedding_test cuda_store_test cuda_dense_test
       cuda_model_test)
out=build-gpu

case "${1:-}" in
  bundle)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build --parallel 2 --target "${tests[@]}" dlrm_bench_cuda
    rm -rf "$out" && mkdir -p "$out/lib"
    for bin in "${tests[@]/#/build/tests/}" build/bench/dlrm_bench_cuda; do
      cp "$bin" "$out/"
      # Every resolved library except glibc's and the cuBLAS ones (hundreds
      # of MB; the GPU machine's CUDA 13 has them). cudart is small and
      # carried, so the runtime matches the one the tests were built with.
      ldd "$bin" | awk '$3 ~ /^\// {print $3}' |
        grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|libcublas' |
        xargs -r -I{} cp -L -n {} "$out/lib/"
    done
    # Symbols are of no use there and would double the carried bytes.
    find "$out" -type f -exec strip --strip-unneeded {} +
    du -sh "$out"
    ;;
  run | bench)
    # cuBLAS: the toolkit's, else the pip wheel's next to PyTorch.
    cublas_dirs=/usr/local/cuda/lib64
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu*/lib \
             /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib; do
      [[ -d $d ]] && cublas_dirs="$cublas_dirs:$d"
    done
    export LD_LIBRARY_PATH="$PWD/$out/lib:$cublas_dirs:${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    if [[ $1 == bench ]]; then exec "$out/dlrm_bench_cuda"; fi
    status=0
    for t in "${tests[@]}"; do
      if ldd "$out/$t" | grep 'not found'; then
        echo "$t: missing libraries (above)"; status=1; continue
      fi
      "$out/$t" --gtest_filter="${2:-*}" --gtest_brief=1 || status=1
    done
    exit $status
    ;;
  *)
    echo "usage: $0 bundle | run [gtest filter] | bench" >&2
    exit 2
    ;;
esac
