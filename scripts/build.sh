#!/usr/bin/env bash
# Configures and builds dlrm-server (Release) into build/. Used by run.sh and
# test.sh; extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f build/CMakeCache.txt || ( ! -f build/build.ninja && ! -f build/Makefile ) ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [[ $# -gt 0 ]]; then
  cmake -S . -B build "$@" >/dev/null
fi
cmake --build build --parallel "$(nproc)"
