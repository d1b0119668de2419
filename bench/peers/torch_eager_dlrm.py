#!/usr/bin/env python3
"""PyTorch eager DLRM: trains the model of one of the project's configs on
synthetic Zipf ids on the CPU and prints training samples/s as one JSON line.

The model, from the config (peer_common.load_shape reads the same textproto
the product's preset is compiled from):
- one torch.nn.EmbeddingBag per table (sum pooling, sparse=True: the backward
  gives each table a sparse gradient of the rows the batch touched), ids and
  per-sample offsets as inputs;
- bottom MLP (Linear + ReLU on every layer, the last one too, as the product
  and TorchRec do);
- dot interaction: the bottom output and the pooled vectors stacked [B x n x
  d], their Gram matrix by torch.bmm, its strict lower triangle (i > j)
  appended to the bottom output; or dcn: the low-rank DCNv2 cross network
  x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l over the concatenated n x d
  vector, whose output alone feeds the top MLP;
- top MLP (ReLU on all but the last layer), BCE-with-logits loss;
- optimizers: torch.optim.SGD or torch.optim.Adagrad (the config's type,
  learning rate and eps; Adagrad accumulators start at 0) for the MLPs and
  cross network, and another of the same type over the tables, which updates
  from the sparse gradients (element-wise Adagrad state on the tables).

--precision bf16 runs the MLPs and the interaction under
torch.autocast("cpu", dtype=torch.bfloat16); the tables, their optimizer and
the loss stay fp32. Run with the peer venv's python (bench/peers/setup_venv.sh).
"""
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import peer_common as pc  # noqa: E402


def mlp(widths, relu_last):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if relu_last or i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class CrossNet(nn.Module):
    """DCNv2's low-rank cross network: V_l [r x N] without bias, W_l [N x r]
    with bias; x_{l+1} = x_0 * W_l(V_l(x_l)) + x_l."""

    def __init__(self, width, layers, rank):
        super().__init__()
        self.v = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(layers))
        self.w = nn.ModuleList(nn.Linear(rank, width) for _ in range(layers))
        for lin in list(self.v) + list(self.w):
            nn.init.xavier_normal_(lin.weight)
        for lin in self.w:
            nn.init.zeros_(lin.bias)

    def forward(self, x0):
        x = x0
        for v, w in zip(self.v, self.w):
            x = x0 * w(v(x)) + x
        return x


class DenseArch(nn.Module):
    """Everything but the tables: bottom MLP, interaction, top MLP."""

    def __init__(self, shape, interaction):
        super().__init__()
        self.bottom = mlp([shape["num_dense"]] + shape["bottom"], relu_last=True)
        n = len(shape["tables"]) + 1
        self.interaction = interaction
        if interaction == "dcn":
            self.cross = CrossNet(n * shape["dim"], shape["dcn_layers"], shape["dcn_rank"])
        else:
            li, lj = torch.tril_indices(n, n, offset=-1)
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)
        self.top = mlp([pc.top_input_width(shape, interaction)] + shape["top"],
                       relu_last=False)

    def forward(self, dense, pooled):
        x = self.bottom(dense)
        # Under autocast x is bf16 and the pooled vectors fp32: one type for cat.
        t = torch.cat([x] + [p.to(x.dtype) for p in pooled], dim=1)
        if self.interaction == "dcn":
            z = self.cross(t)
        else:
            v = t.view(x.shape[0], -1, x.shape[1])
            gram = torch.bmm(v, v.transpose(1, 2))
            z = torch.cat([x, gram[:, self.li, self.lj]], dim=1)
        return self.top(z).squeeze(1)


def make_optimizer(spec, params):
    if spec["type"] == "SGD":
        return torch.optim.SGD(params, lr=spec["lr"])
    return torch.optim.Adagrad(params, lr=spec["lr"], eps=spec["eps"])


def main():
    # torch.optim.Adagrad's sparse path warns once that it skips invariant checks.
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    a, shape = pc.parse_args(
        "torch_eager_dlrm.py",
        "DLRM in PyTorch eager mode (nn.EmbeddingBag with sparse gradients) on "
        "the CPU: training samples/s as one JSON line.")
    # Weights, the Adagrad state, and a sparse gradient per touched row.
    adagrad = shape["sparse_optimizer"]["type"] == "ADAGRAD"
    pc.check_memory(shape, 1.0 if adagrad else 0.0)
    torch.manual_seed(a.seed)
    tables = nn.ModuleList(nn.EmbeddingBag(t["rows"], shape["dim"], mode="sum",
                                           sparse=True)
                           for t in shape["tables"])
    dense_arch = DenseArch(shape, a.interaction)
    dense_opt = make_optimizer(shape["dense_optimizer"], dense_arch.parameters())
    sparse_opt = make_optimizer(shape["sparse_optimizer"], tables.parameters())
    loss_fn = nn.BCEWithLogitsLoss()

    batches = []
    for dense, ids, lengths, labels in pc.make_batches(a, shape):
        offsets = [torch.cat([torch.zeros(1, dtype=torch.int64), ln.cumsum(0)[:-1]])
                   for ln in lengths]
        batches.append((dense, ids, offsets, labels))

    def step(i):
        dense, ids, offsets, labels = batches[i % len(batches)]
        dense_opt.zero_grad(set_to_none=True)
        sparse_opt.zero_grad(set_to_none=True)
        pooled = [emb(ids[k], offsets[k]) for k, emb in enumerate(tables)]
        with pc.autocast_ctx(a):
            logits = dense_arch(dense, pooled)
        loss = loss_fn(logits.float(), labels)
        loss.backward()
        dense_opt.step()
        sparse_opt.step()

    rates = pc.time_steps(a, step)
    pc.report("pytorch-eager", a, shape, rates, {
        "embedding": "nn.EmbeddingBag(sparse=True) per table",
        "sparse_optimizer": ("adagrad (torch.optim.Adagrad on sparse gradients, "
                             "element-wise)" if adagrad else
                             "sgd (torch.optim.SGD on sparse gradients)"),
    })


if __name__ == "__main__":
    main()
