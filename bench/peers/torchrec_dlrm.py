#!/usr/bin/env python3
"""TorchRec DLRM with fbgemm's fused CPU table-batched embeddings: trains the
model of one of the project's configs on synthetic Zipf ids on the CPU and
prints training samples/s as one JSON line.

The model, from the config (peer_common.load_shape reads the same textproto
the product's preset is compiled from):
- the tables: torchrec.modules.fused_embedding_modules.FusedEmbeddingBagCollection,
  one fbgemm SplitTableBatchedEmbeddingBagsCodegen over every table (host
  memory, CPU kernels, sum pooling) with the tables' optimizer fused into its
  backward, so no embedding gradient is materialised: EXACT_SGD for SGD;
  for Adagrad EXACT_ADAGRAD (one accumulator per element, what TorchRec's
  MLPerf DLRM-DCNv2 reference gets from torch.optim.Adagrad) or, with
  --sparse-adagrad rowwise, EXACT_ROWWISE_ADAGRAD (one accumulator per row,
  the product's Adagrad on tables). Input: a KeyedJaggedTensor per batch.
- the dense part: torchrec.models.dlrm.DLRM (dot interaction) or DLRM_DCN
  (LowRankCrossNet with the config's layers and rank; the top MLP reads its
  output alone), with the config's bottom and top MLP widths: ReLU after
  every bottom layer and every top layer but the last, BCE-with-logits loss,
  torch.optim.SGD or torch.optim.Adagrad (the config's learning rate and eps).

--precision bf16 runs the dense part (dense_arch, inter_arch, over_arch)
under torch.autocast("cpu", dtype=torch.bfloat16); the table lookups, their
fused optimizer and the loss stay fp32. Run with the peer venv's python
(bench/peers/setup_venv.sh); fbgemm's CPU kernels and the GEMMs both follow
--threads (torch.set_num_threads).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import peer_common as pc  # noqa: E402


def extra_flags(p):
    p.add_argument("--sparse-adagrad", choices=["exact", "rowwise"], default="exact",
                   help="the tables' Adagrad: exact (fbgemm EXACT_ADAGRAD, "
                        "element-wise, as MLPerf's reference; default) or rowwise "
                        "(EXACT_ROWWISE_ADAGRAD, as the product)")


def main():
    a, shape = pc.parse_args(
        "torchrec_dlrm.py",
        "TorchRec DLRM with fbgemm's fused CPU table-batched embeddings: "
        "training samples/s as one JSON line.", extra_flags)
    sparse = shape["sparse_optimizer"]
    rowwise = sparse["type"] == "ADAGRAD" and a.sparse_adagrad == "rowwise"
    exact_adagrad = sparse["type"] == "ADAGRAD" and not rowwise
    pc.check_memory(shape, 1.0 if exact_adagrad else 0.0)

    import fbgemm_gpu  # noqa: F401  (registers the torch.ops.fbgemm kernels)
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad

    torch.manual_seed(a.seed)
    cpu = torch.device("cpu")
    keys = [f"f{k}" for k in range(len(shape["tables"]))]
    configs = [EmbeddingBagConfig(name=t["name"], embedding_dim=shape["dim"],
                                  num_embeddings=t["rows"], feature_names=[keys[k]])
               for k, t in enumerate(shape["tables"])]
    if sparse["type"] == "SGD":
        sparse_cls, sparse_kw, kernel = torch.optim.SGD, {"lr": sparse["lr"]}, "EXACT_SGD"
    elif rowwise:
        sparse_cls, sparse_kw = RowWiseAdagrad, {"lr": sparse["lr"], "eps": sparse["eps"]}
        kernel = "EXACT_ROWWISE_ADAGRAD"
    else:
        sparse_cls, sparse_kw = torch.optim.Adagrad, {"lr": sparse["lr"], "eps": sparse["eps"]}
        kernel = "EXACT_ADAGRAD"
    ebc = FusedEmbeddingBagCollection(tables=configs, optimizer_type=sparse_cls,
                                      optimizer_kwargs=sparse_kw, device=cpu)
    common = dict(embedding_bag_collection=ebc, dense_in_features=shape["num_dense"],
                  dense_arch_layer_sizes=shape["bottom"],
                  over_arch_layer_sizes=shape["top"], dense_device=cpu)
    if a.interaction == "dcn":
        model = DLRM_DCN(dcn_num_layers=shape["dcn_layers"],
                         dcn_low_rank_dim=shape["dcn_rank"], **common)
    else:
        model = DLRM(**common)
    dense_params = [p for name, p in model.named_parameters()
                    if not name.startswith("sparse_arch.")]
    d = shape["dense_optimizer"]
    if d["type"] == "SGD":
        dense_opt = torch.optim.SGD(dense_params, lr=d["lr"])
    else:
        dense_opt = torch.optim.Adagrad(dense_params, lr=d["lr"], eps=d["eps"])
    loss_fn = nn.BCEWithLogitsLoss()

    batches = []
    for dense, ids, lengths, labels in pc.make_batches(a, shape):
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.cat(ids), lengths=torch.cat(lengths))
        batches.append((dense, kjt, labels))

    def step(i):
        dense, kjt, labels = batches[i % len(batches)]
        dense_opt.zero_grad(set_to_none=True)
        # DLRM.forward's four stages, so the lookups can stay out of autocast.
        pooled = model.sparse_arch(kjt)
        with pc.autocast_ctx(a):
            x = model.dense_arch(dense)
            z = model.inter_arch(dense_features=x, sparse_features=pooled.to(x.dtype))
            logits = model.over_arch(z)
        loss = loss_fn(logits.float().squeeze(1), labels)
        loss.backward()  # also updates the tables (the fused optimizer)
        dense_opt.step()

    rates = pc.time_steps(a, step)
    pc.report("torchrec-fbgemm", a, shape, rates, {
        "embedding": "FusedEmbeddingBagCollection (fbgemm CPU TBE, optimizer "
                     "fused into the backward)",
        "sparse_optimizer": f"{sparse['type'].lower()} (fbgemm {kernel})",
    })


if __name__ == "__main__":
    main()
