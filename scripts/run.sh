#!/usr/bin/env bash
# The main job: installs what is missing, builds, then trains the default
# model (the Criteo Kaggle shape) on a synthetic Criteo-shaped dataset,
# evaluates it, and prints loss, AUC and samples/s.
# Extra arguments go to dlrm_train (see build/model/dlrm_train --help).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
exec ./build/model/dlrm_train --config kaggle --steps 1500 --eval-interval 500 \
  --eval-samples 131072 "$@"
