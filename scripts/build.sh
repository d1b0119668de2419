#!/usr/bin/env bash
# Configures and builds dlrm-server (Release) into build/. Used by run.sh and
# test.sh; extra arguments go to CMake's configure step.
#
# With ccache installed (scripts/install-deps.sh installs it) the compiles
# go through it, its cache in build/ccache: base_dir is the checkout, so
# paths under it hash alike wherever it is cloned, compiler_check is the
# compiler's content, not its mtime, and sloppiness=locale leaves LANG and
# LC_* out of the hash (the image has no LANG; they only translate the
# compiler's messages). deploy/Dockerfile's compile uses the
# same settings on that folder, which the build context carries
# (.dockerignore), so the image's build of the project is mostly cache hits
# after a host build (docs/deployment.md "Tests"). DLRM_CCACHE=0 builds
# without it; a build/ configured without the launcher stays so.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
if [[ ${DLRM_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null; then
  export CCACHE_DIR=$PWD/build/ccache CCACHE_BASEDIR=$PWD
  export CCACHE_COMPILERCHECK=content CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS=locale
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f build/CMakeCache.txt || ( ! -f build/build.ninja && ! -f build/Makefile ) ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
elif [[ $# -gt 0 ]]; then
  cmake -S . -B build "$@" >/dev/null
fi
cmake --build build --parallel "$(nproc)"
