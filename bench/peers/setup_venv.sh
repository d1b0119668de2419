#!/usr/bin/env bash
# Makes the Python virtual environment the benchmark peers run in
# (bench/peers/*.py), from PyPI, with pinned versions: torch 2.14.1 (PyPI's
# Linux wheel, used on the CPU only), fbgemm-gpu-cpu 1.9.0 and torchrec 1.9.2,
# plus what they import at run time. About 5 GB of disk, a few minutes.
#
#   bench/peers/setup_venv.sh [DIR]    DIR: default ~/.cache/dlrm-peers-venv
#
# If DIR/.ready exists the venv is taken as built and the script returns at
# once (--check DIR runs the final check on it instead). Otherwise it creates
# or completes DIR, installs the packages, runs the final check (imports, a
# fused fbgemm embedding step that must move the weights, one training step
# of each peer) and writes DIR/.ready (the `pip freeze` of the venv).
# Environment: PYTHON (interpreter to make the venv from, default python3;
# made with 3.11), WHEEL_DIR (a folder of wheels tried before PyPI).
# Peers and test tools only: nothing the product builds or runs needs it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
check_only=0
if [[ ${1:-} == --check ]]; then
  check_only=1
  shift
fi
dir=${1:-"$HOME/.cache/dlrm-peers-venv"}
py=$dir/bin/python

final_check() {
  "$py" - <<'EOF'
import torch, fbgemm_gpu, torchrec
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

# Three tables of 20 rows x 4 on the host; one bag of 2 ids per table.
specs = [(20, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)] * 3
for opt in (EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD,
            EmbOptimType.EXACT_ROWWISE_ADAGRAD):
    tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=opt, learning_rate=0.5)
    old = torch.cat([w.flatten() for w in tbe.split_embedding_weights()]).clone()
    pooled = tbe(torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 2, 4, 6]))
    assert pooled.shape == (1, 12), pooled.shape
    pooled.sum().backward()  # a gradient of ones, whatever the initial weights
    new = torch.cat([w.flatten() for w in tbe.split_embedding_weights()])
    assert not torch.equal(old, new), f"{opt.name}: the fused backward changed nothing"
print(f"torch {torch.__version__}, torchrec {torchrec.__version__}, "
      f"fbgemm_gpu {fbgemm_gpu.__version__}: fused CPU embedding steps ok")
EOF
  local peer
  for peer in torch_eager_dlrm.py torchrec_dlrm.py; do
    "$py" "$here/$peer" --rows 100 --batch 16 --steps 1 --warmup 0 --repeats 1 \
      --threads 1 >/dev/null
    echo "$peer: one training step ok"
  done
}

if ((check_only)); then
  final_check
  exit 0
fi
if [[ -f $dir/.ready ]]; then
  echo "$dir is ready (remove $dir/.ready to rebuild, or run $0 --check $dir)"
  exit 0
fi

if [[ ! -x $py ]]; then
  "${PYTHON:-python3}" -m venv "$dir" || {
    echo "cannot make a venv with ${PYTHON:-python3} (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi

# Each install tries WHEEL_DIR alone first (pip would otherwise prefer the
# index's copy of a file both have), then PyPI.
install() {
  if [[ -n ${WHEEL_DIR:-} ]] && "$py" -m pip install -q --disable-pip-version-check \
    --no-index --find-links "$WHEEL_DIR" "$@"; then
    return
  fi
  "$py" -m pip install -q --disable-pip-version-check "$@"
}

install -U pip
# PyPI's Linux torch wheel is built for CUDA. Without its declared
# dependencies (triton, cuda-bindings: unused on the CPU), then with the
# Python packages it imports and the CUDA libraries libtorch_cuda.so is
# linked against, which must be present for `import torch` to load.
install --no-deps torch==2.14.1
install filelock 'typing-extensions>=4.10' 'setuptools>=77.0.3' 'sympy>=1.13.3' \
  'networkx>=2.5.1' jinja2 'fsspec>=0.8.5' numpy
install 'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3' \
  nvidia-cudnn-cu13==9.24.0.43 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 \
  nvidia-nvshmem-cu13==3.4.5
# torchrec declares the CUDA fbgemm-gpu; fbgemm-gpu-cpu installs the same
# fbgemm_gpu module with CPU kernels (1.9.0 is built against torch 2.14).
install --no-deps fbgemm-gpu-cpu==1.9.0 torchrec==1.9.2 tensordict==0.15.3 \
  torchmetrics==1.0.3 pyre-extensions==0.0.32
install cloudpickle 'pyvers>=0.2,<0.3' packaging 'lightning-utilities>=0.7' tqdm \
  typing-inspect safetensors

final_check
"$py" -m pip freeze --disable-pip-version-check >"$dir/.ready"
echo "$dir is ready: run the peers with $py"
