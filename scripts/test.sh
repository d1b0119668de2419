#!/usr/bin/env bash
# Installs what is missing, builds, runs every test through CTest, then the
# fuzz targets for a bounded time (scripts/fuzz.sh; DLRM_FUZZ_SECONDS per
# target, default 20; 0 skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
(cd build && ctest --output-on-failure --parallel "$(nproc)" --timeout 900)
if [[ "${DLRM_FUZZ_SECONDS:-20}" != "0" ]]; then
  ./scripts/fuzz.sh "${DLRM_FUZZ_SECONDS:-20}"
fi
