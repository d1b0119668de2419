#!/usr/bin/env bash
# Installs the Debian packages dlrm-server needs to build, test and run.
# Idempotent and quiet when everything is present. CUDA is not installed
# here: the build uses /usr/local/cuda when nvcc is found there.
#
# Usage: scripts/install-deps.sh [--build | --peers]
#   --build  only what building needs (deploy/Dockerfile's build stage).
#   --peers  also build the benchmark peers' Python venv from PyPI
#            (bench/peers/setup_venv.sh: torch, torchrec, fbgemm-gpu-cpu;
#            ~/.cache/dlrm-peers-venv, returns at once when it is ready).
set -euo pipefail

# Building dlrm_server, dlrm_client and the tests (CMake requires GTest and
# benchmark at configure time).
build_packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  librocksdb-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev ocl-icd-opencl-dev libgloo-dev libcli11-dev libcpp-httplib-dev
  # Deflated .npz members (data/npy.cc).
  zlib1g-dev
  # The compiler cache scripts/build.sh and deploy/Dockerfile share.
  ccache
)
# Running the tests, the fuzz targets and the scripts.
test_packages=(
  clang-14 libclang-rt-14-dev
  python3 python3-grpcio python3-protobuf gnuplot-nox python3-yaml
  # The Python client package and its venv install test (python_package_test).
  python3-numpy python3-venv python3-setuptools python3-pip
  # Launchers the tests start jobs with (tests/server/launch_test.cc).
  openmpi-bin slurm-wlm munge
  # The container deployment test (deploy/tests/docker_compose_test.py): the
  # engine, Compose v1 and what makes the base images without a registry.
  docker.io docker-compose debootstrap
)
packages=("${build_packages[@]}")
peers=0
case "${1:-}" in
  --build) ;;
  --peers)
    packages+=("${test_packages[@]}")
    peers=1
    ;;
  *) packages+=("${test_packages[@]}") ;;
esac
setup_peers() {
  if ((peers)); then
    "$(dirname "$0")/../bench/peers/setup_venv.sh"
  fi
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  setup_peers
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
setup_peers
