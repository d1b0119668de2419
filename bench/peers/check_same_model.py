#!/usr/bin/env python3
"""Checks that the two peers compute the same function: for each shape
(kaggle: dot interaction; mlperf-dcnv2: DCN), TorchRec's DLRM / DLRM_DCN
(with a plain EmbeddingBagCollection, tiny tables) and torch_eager_dlrm.py's
model, given the same weights, give the same logits and the same loss on one
of the peers' synthetic batches. TorchRec lists the dot interaction's pairs
in upper-triangle order and the eager model in the product's lower-triangle
order, so the top MLP's first-layer columns are permuted when copied.
Prints one line per shape; exits 1 on a mismatch. Run with the peer venv's
python (peers_test.py does).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import peer_common as pc  # noqa: E402
import torch_eager_dlrm as eager  # noqa: E402


def linears(module):
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def check(shape_name):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.models.dlrm import DLRM, DLRM_DCN

    sys.argv = ["check", "--shape", shape_name, "--rows", "40", "--batch", "8",
                "--batches", "1", "--threads", "1"]
    a, shape = pc.parse_args("check_same_model.py", "")
    torch.manual_seed(0)
    keys = [f"f{k}" for k in range(len(shape["tables"]))]
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=t["name"], embedding_dim=shape["dim"],
                           num_embeddings=t["rows"], feature_names=[keys[k]])
        for k, t in enumerate(shape["tables"])])
    common = dict(embedding_bag_collection=ebc, dense_in_features=shape["num_dense"],
                  dense_arch_layer_sizes=shape["bottom"],
                  over_arch_layer_sizes=shape["top"])
    if a.interaction == "dcn":
        trec = DLRM_DCN(dcn_num_layers=shape["dcn_layers"],
                        dcn_low_rank_dim=shape["dcn_rank"], **common)
    else:
        trec = DLRM(**common)
    ours = eager.DenseArch(shape, a.interaction)
    tables = [nn.EmbeddingBag(t["rows"], shape["dim"], mode="sum") for t in shape["tables"]]

    with torch.no_grad():
        for k, t in enumerate(shape["tables"]):
            tables[k].weight.copy_(trec.sparse_arch.embedding_bag_collection
                                   .embedding_bags[t["name"]].weight)
        for dst, src in zip(linears(ours.bottom), linears(trec.dense_arch), strict=True):
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)
        top_src = linears(trec.over_arch)
        for dst, src in zip(linears(ours.top), top_src, strict=True):
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)
        if a.interaction == "dcn":
            cross = trec.inter_arch.crossnet
            for l_ in range(shape["dcn_layers"]):
                ours.cross.v[l_].weight.copy_(cross.V_kernels[l_])
                ours.cross.w[l_].weight.copy_(cross.W_kernels[l_])
                ours.cross.w[l_].bias.copy_(cross.bias[l_])
        else:
            # Column of TorchRec's top input for each of ours: the bottom output
            # first in both, then pair (i, j), ours i > j, TorchRec's j < i.
            d = shape["dim"]
            tri = trec.inter_arch.triu_indices
            where = {(int(i), int(j)): d + c for c, (i, j) in enumerate(zip(tri[0], tri[1]))}
            cols = list(range(d)) + [where[(int(j), int(i))]
                                     for i, j in zip(ours.li, ours.lj)]
            linears(ours.top)[0].weight.copy_(top_src[0].weight[:, cols])

    dense, ids, lengths, labels = pc.make_batches(a, shape)[0]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(ids),
                                              lengths=torch.cat(lengths))
    offsets = [torch.cat([torch.zeros(1, dtype=torch.int64), ln.cumsum(0)[:-1]])
               for ln in lengths]
    with torch.no_grad():
        want = trec(dense, kjt).squeeze(1)
        got = ours(dense, [tables[k](ids[k], offsets[k]) for k in range(len(tables))])
    loss = nn.BCEWithLogitsLoss()
    err = (got - want).abs().max().item()
    scale = want.abs().max().item() + 1e-6
    ok = err <= 1e-5 * max(scale, 1.0)
    print(f"{'ok' if ok else 'MISMATCH'}: {shape_name} ({a.interaction}): logits max |diff| "
          f"{err:.2e} (max |logit| {scale:.3f}), loss {loss(got, labels).item():.6f} vs "
          f"{loss(want, labels).item():.6f}")
    return ok


def main():
    results = [check(name) for name in ("kaggle", "mlperf-dcnv2")]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
