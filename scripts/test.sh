#!/usr/bin/env bash
# Installs what is missing, builds, runs every test through CTest, then the
# fuzz targets for a bounded time (scripts/fuzz.sh; DLRM_FUZZ_SECONDS per
# target, default 20; 0 skips them), with the container deployment test
# (CTest label `docker`, deploy/tests/docker_compose_test.py) beside them.
# The fuzz targets' own build (clang, build-fuzz/) runs beside the host
# build at nice 19, in the cycles the host build leaves idle (its links
# and the configure step are one process each), so it is done when the
# fuzzers start.
#
# The container test builds the image, which compiles the project again
# inside it, through ccache on the host build's cache (build/ccache,
# scripts/build.sh), so mostly hits; cold it would take ~13 minutes on 2
# cores alone. Before that it needs a base image, made with debootstrap
# where no registry answers (about 4 minutes, mostly waiting on the mirror;
# docs/deployment.md "Tests"). So it starts before the host build: its
# daemon and base images come while the host compiles, and it waits for
# build/.host-build-done before building the image (the daemon's
# containers are a cgroup of their own, which nice does not hold back:
# their compile would slow the host build as much as it gained). The
# image's compile then runs at the lowest CPU priority (nice 19, which the
# Docker daemon it starts and the image's compilers inherit) beside the
# other tests and the fuzzers, taking the cores they leave idle (processes
# waiting on each other, one fuzzer at a time). It runs as CTest's
# deploy_DockerComposeTest would, but not through ctest (the other run
# holds build/Testing/); its output goes to build/docker_test.log, printed
# at the end. DLRM_DOCKER_TEST=0 skips it; by default (1) it runs, and
# skips itself (exit 77, the reason printed) where no Docker daemon can
# run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$SECONDS
./scripts/install-deps.sh
mkdir -p build
rm -f build/.host-build-done
docker_pid=""
if [[ "${DLRM_DOCKER_TEST:-1}" != "0" ]]; then
  # Run directly rather than through a second ctest, which would share
  # build/Testing/ with the one below; exit 77 is its skip.
  (cd deploy/tests && DLRM_CLIENT="$root/build/clients/dlrm_client" \
    DLRM_WAIT_FOR_FILE="$root/build/.host-build-done" \
    PYTHONDONTWRITEBYTECODE=1 exec nice -n 19 python3 docker_compose_test.py) \
    >build/docker_test.log 2>&1 &
  docker_pid=$!
  echo "test.sh: the container test runs beside the build and the tests" \
    "(build/docker_test.log)"
fi
fuzz_build_pid=""
if [[ "${DLRM_FUZZ_SECONDS:-20}" != "0" ]]; then
  # Its failure shows again, with the compiler's output, when fuzz.sh runs.
  # A process group of its own (setsid), so that its compilers can be
  # stopped with it.
  setsid nice -n 19 ./scripts/fuzz.sh --build >build/fuzz_build.log 2>&1 &
  fuzz_build_pid=$!
fi
# A failed build stops the container test (it then stops its daemon) and
# the fuzz build.
if ! ./scripts/build.sh; then
  if [[ -n $docker_pid ]]; then
    kill -TERM "$docker_pid" 2>/dev/null || true
    wait "$docker_pid" 2>/dev/null || true
  fi
  if [[ -n $fuzz_build_pid ]]; then
    kill -TERM -- "-$fuzz_build_pid" 2>/dev/null || true
    wait "$fuzz_build_pid" 2>/dev/null || true
  fi
  echo "test.sh: the build failed"
  exit 1
fi
touch build/.host-build-done
echo "test.sh: built in $(((SECONDS - start) / 60)) min"

# OpenMP threads sleep at barriers instead of spinning, in every test and
# the processes they start (tests/CMakeLists.txt sets it for the tests it
# registers): two tests' threads share the 2 cores, and spinning ones
# starve those with work.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
status=0
(cd build && ctest --output-on-failure --parallel "$(nproc)" --timeout 900 \
  -LE docker) || status=$?
echo "test.sh: ctest done at $(((SECONDS - start) / 60)) min"
if [[ -n $fuzz_build_pid ]]; then
  wait "$fuzz_build_pid" || true
  echo "test.sh: fuzz build (build/fuzz_build.log): $(tail -n 1 build/fuzz_build.log)"
fi
if [[ $status == 0 && "${DLRM_FUZZ_SECONDS:-20}" != "0" ]]; then
  ./scripts/fuzz.sh "${DLRM_FUZZ_SECONDS:-20}" || status=$?
fi
if [[ -n $docker_pid ]]; then
  docker_status=0
  wait "$docker_pid" || docker_status=$?
  echo "test.sh: the container test (build/docker_test.log):"
  cat build/docker_test.log
  if [[ $docker_status == 77 ]]; then docker_status=0; fi
  if [[ $status == 0 ]]; then status=$docker_status; fi
fi
echo "test.sh: done in $(((SECONDS - start) / 60)) min, exit $status"
exit "$status"
