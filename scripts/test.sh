#!/usr/bin/env bash
# Installs what is missing, builds, runs every test through CTest, then the
# fuzz targets for a bounded time (scripts/fuzz.sh; DLRM_FUZZ_SECONDS per
# target, default 20; 0 skips them), then the container deployment test
# (CTest label `docker`, deploy/tests/docker_compose_test.py).
#
# The container test builds the image, which compiles the project again
# inside it: about 1 minute with its caches warm, up to ~13 minutes cold on
# 2 cores (docs/deployment.md "Tests"). DLRM_DOCKER_TEST=1 always runs it,
# 0 never; by default (auto) it runs when the run so far took at most
# DLRM_DOCKER_TEST_BEFORE_MIN minutes (default 16), so that the whole run
# stays within the 30 minutes CI allows, and says so when it does not.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
./scripts/install-deps.sh
./scripts/build.sh
(cd build && ctest --output-on-failure --parallel "$(nproc)" --timeout 900 \
  -LE docker)
if [[ "${DLRM_FUZZ_SECONDS:-20}" != "0" ]]; then
  ./scripts/fuzz.sh "${DLRM_FUZZ_SECONDS:-20}"
fi
docker_test=${DLRM_DOCKER_TEST:-auto}
elapsed_min=$(((SECONDS - start) / 60))
if [[ $docker_test == auto ]]; then
  if ((elapsed_min <= ${DLRM_DOCKER_TEST_BEFORE_MIN:-16})); then
    docker_test=1
  else
    echo "test.sh: not running the container test (deploy_DockerComposeTest):" \
      "the run took ${elapsed_min} min so far and a cold image build can take" \
      "~13 min more; DLRM_DOCKER_TEST=1 runs it"
    docker_test=0
  fi
fi
if [[ $docker_test == 1 ]]; then
  (cd build && ctest --output-on-failure -L docker)
fi
