#!/usr/bin/env bash
# The kaggle fp32 comparison alone: bench/compare_peers.sh with SHAPES=kaggle
# and PRECISIONS=fp32 unless the environment sets them (that script lists
# its peers, flags and environment).
#
# Usage: bench/compare_peer.sh [rounds] [batch]
set -euo pipefail
SHAPES=${SHAPES:-kaggle} PRECISIONS=${PRECISIONS:-fp32} \
  exec "$(dirname "$0")/compare_peers.sh" "$@"
