"""What the two peer programs share: the model shape (read from the project's
own configs/*.textproto), the synthetic batches, the command line, the timing
loop and the JSON line.

The shape comes from the same text-format ModelConfig the product's preset is
compiled from, so a peer and `dlrm_bench_train --config <preset>` build the
same layer sizes, tables, bags, interaction and optimizers by construction.
Only the fields the peers need are read (a small parser, no protobuf package).
"""
import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE_CONFIGS = {
    "kaggle": os.path.join(REPO, "configs", "kaggle.textproto"),
    "mlperf-dcnv2": os.path.join(REPO, "configs", "mlperf-dlrm-dcnv2.textproto"),
}


# ---------------------------------------------------------------- the shape


def _strip_comments(text):
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def _spans(text, name):
    """(start, body start, end) of each top-level `name { ... }` message,
    nested messages included in its body."""
    spans = []
    depth = 0
    i = 0
    pattern = re.compile(r"\b" + name + r"\s*:?\s*\{")
    while i < len(text):
        if depth == 0:
            m = pattern.match(text, i)
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                level, j = 1, m.end()
                while j < len(text) and level:
                    level += {"{": 1, "}": -1}.get(text[j], 0)
                    j += 1
                spans.append((i, m.end(), j))
                i = j
                continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return spans


def _blocks(text, name):
    """Bodies of the top-level `name { ... }` messages."""
    return [text[b:e - 1] for _, b, e in _spans(text, name)]


def _without(text, name):
    """`text` without its top-level `name { ... }` messages."""
    for start, _, end in reversed(_spans(text, name)):
        text = text[:start] + text[end:]
    return text


def _top_level(text):
    """`text` without anything inside braces: the fields of the message itself."""
    out, depth = [], 0
    for c in text:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


def _scalar(text, name, default=None):
    m = re.search(r"\b" + name + r"\s*:\s*(\"[^\"]*\"|[^\s\]]+)", text)
    if not m:
        return default
    return m.group(1).strip('"')


def _int_list(text, name):
    m = re.search(r"\b" + name + r"\s*:\s*\[([^\]]*)\]", text)
    if not m:
        return [int(v) for v in re.findall(r"\b" + name + r"\s*:\s*(\d+)", text)]
    return [int(v) for v in m.group(1).replace(",", " ").split()]


def _optimizer(body):
    if body is None:
        return {"type": "SGD", "lr": 0.01, "eps": 1e-10}
    body = _top_level(body)
    return {"type": _scalar(body, "type", "SGD"),
            "lr": float(_scalar(body, "learning_rate", "0.01")),
            "eps": float(_scalar(body, "eps", "1e-10"))}


def load_shape(path):
    """The peers' view of a ModelConfig text file: a dict of what they use."""
    with open(path) as f:
        text = _strip_comments(f.read())
    tables = []
    for body in _blocks(text, "tables"):
        tables.append({
            "name": _scalar(body, "name", f"t{len(tables)}"),
            "rows": int(_scalar(body, "rows", "0")),
            "hot": max(int(_scalar(body, "multi_hot_size", "1")), 1),
            "fixed": _scalar(body, "multi_hot_distribution", "") == "MULTI_HOT_FIXED",
            "pooling": _scalar(body, "pooling", "POOLING_SUM"),
        })
    # Drop the tables' bodies so table-level fields cannot shadow top-level ones.
    top_text = _without(text, "tables")
    opt_bodies = {name: (_blocks(top_text, name) or [None])[0]
                  for name in ("dense_optimizer", "sparse_optimizer")}
    top_text = _top_level(top_text)
    interaction = _scalar(top_text, "interaction", "INTERACTION_DOT")
    shape = {
        "config": path,
        "num_dense": int(_scalar(top_text, "num_dense_features", "13")),
        "dim": int(_scalar(top_text, "embedding_dim", "16")),
        "tables": tables,
        "bottom": _int_list(top_text, "bottom_mlp"),
        "top": _int_list(top_text, "top_mlp"),
        "interaction": {"INTERACTION_DOT": "dot",
                        "INTERACTION_DCN": "dcn"}.get(interaction, interaction),
        "dcn_layers": int(_scalar(top_text, "dcn_num_layers", "3")),
        "dcn_rank": int(_scalar(top_text, "dcn_low_rank_dim", "512")),
        "dense_optimizer": _optimizer(opt_bodies["dense_optimizer"]),
        "sparse_optimizer": _optimizer(opt_bodies["sparse_optimizer"]),
        "max_rows_per_table": int(_scalar(top_text, "max_rows_per_table", "0")),
    }
    for t in tables:
        if t["pooling"] != "POOLING_SUM":
            sys.exit(f"{path}: table {t['name']}: the peers pool by sum only")
    if shape["bottom"][-1] != shape["dim"]:
        sys.exit(f"{path}: the bottom MLP must end at embedding_dim")
    return shape


# --------------------------------------------------------------- the command


def parse_args(peer_name, description, extra=None):
    p = argparse.ArgumentParser(prog=peer_name, description=description)
    p.add_argument("--shape", default="kaggle",
                   help="kaggle, mlperf-dcnv2, or a ModelConfig text file "
                        "(default kaggle: configs/kaggle.textproto)")
    p.add_argument("--rows", type=int, default=0,
                   help="give every table this many rows, as dlrm_bench_train "
                        "--rows does (0: the config's vocabularies, capped by "
                        "--max-rows)")
    p.add_argument("--max-rows", type=int, default=None,
                   help="cap every table at this many rows (default: the "
                        "config's max_rows_per_table; 0: no cap)")
    p.add_argument("--batch", "--batch-size", type=int, default=2048,
                   help="samples per step (--batch-size: the old name)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (0: torch's default, the cores)")
    p.add_argument("--steps", "--iters", dest="iters", type=int, default=30,
                   help="timed steps per repetition (--iters: the old name)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--repeats", type=int, default=5,
                   help="repetitions; the JSON line's samples_per_s is their median")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the dense part (MLPs, interaction) under "
                        "torch.autocast('cpu', torch.bfloat16); tables, their "
                        "optimizer and the loss stay fp32")
    p.add_argument("--interaction", choices=["dot", "dcn"], default=None,
                   help="default: the config's (kaggle dot, mlperf-dcnv2 dcn)")
    p.add_argument("--optimizer", choices=["sgd", "adagrad"], default=None,
                   help="both the MLPs' and the tables' optimizer (default: the "
                        "config's: kaggle SGD, mlperf-dcnv2 Adagrad)")
    p.add_argument("--alpha", type=float, default=1.05,
                   help="Zipf exponent of the ids (dlrm_bench_train's default)")
    p.add_argument("--batches", type=int, default=4,
                   help="distinct pre-generated batches used in rotation "
                        "(dlrm_bench_train's default)")
    p.add_argument("--seed", type=int, default=1)
    if extra:
        extra(p)
    a = p.parse_args()
    for name, flag in (("batch", "batch"), ("iters", "steps"),
                       ("repeats", "repeats"), ("batches", "batches")):
        if getattr(a, name) < 1:
            p.error(f"--{flag} must be at least 1")
    if a.warmup < 0 or a.threads < 0 or a.rows < 0:
        p.error("--warmup, --threads and --rows must not be negative")
    path = SHAPE_CONFIGS.get(a.shape, a.shape)
    if not os.path.isfile(path):
        p.error(f"--shape {a.shape}: neither a known shape "
                f"({', '.join(SHAPE_CONFIGS)}) nor a file")
    shape = load_shape(path)
    cap = shape["max_rows_per_table"] if a.max_rows is None else a.max_rows
    for t in shape["tables"]:
        if a.rows > 0:
            t["rows"] = a.rows
        elif cap > 0:
            t["rows"] = min(t["rows"], cap)
    if a.interaction is None:
        a.interaction = shape["interaction"]
    if a.interaction not in ("dot", "dcn"):
        p.error(f"the config's interaction {a.interaction} is not one the peers have")
    for key in ("dense_optimizer", "sparse_optimizer"):
        o = shape[key]
        if a.optimizer is not None:
            o["type"] = a.optimizer.upper()
        if o["type"] not in ("SGD", "ADAGRAD"):
            p.error(f"{key} {o['type']}: the peers have SGD and ADAGRAD")
    if a.threads:
        torch.set_num_threads(a.threads)
    return a, shape


def top_input_width(shape, interaction):
    n = len(shape["tables"]) + 1
    if interaction == "dot":
        return shape["dim"] + n * (n - 1) // 2
    return n * shape["dim"]


def check_memory(shape, bytes_per_row_extra_fp32):
    """Exits with a message when the tables (weights + optimizer state, as
    `bytes_per_row_extra_fp32` floats per element more) would not fit."""
    rows = sum(t["rows"] for t in shape["tables"])
    need = rows * shape["dim"] * 4 * (1 + bytes_per_row_extra_fp32)
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is not None and need > 0.85 * avail:
        sys.exit(f"the tables need about {need / 2**30:.1f} GiB ({rows} rows x "
                 f"dim {shape['dim']} with optimizer state); "
                 f"{avail / 2**30:.1f} GiB available: pass --rows or --max-rows")


# ----------------------------------------------------------------- the data


def zipf_ids(n, rows, alpha, gen):
    """dlrm_bench_train's id distribution (data/synthetic.cc, ZipfSampler):
    id = floor(r) - 1, r drawn by inverse CDF from the continuous density
    proportional to r^-alpha on [1, rows + 1), so id 0 is the hottest."""
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    a = 1.0 - alpha
    log_n1 = math.log(rows + 1.0)
    if abs(a) < 1e-9:
        r = torch.exp(u * log_n1)
    else:
        r = torch.exp(torch.log1p(u * math.expm1(a * log_n1)) / a)
    return (r.long() - 1).clamp_(0, rows - 1)


def dense_features(batch, num_dense, gen):
    """Criteo-like dense values as data/synthetic.cc draws them: feature j is
    0 with a fixed probability in [0.05, 0.4], else log1p(floor(exp(m_j + s_j
    g))), g standard normal, m_j in [0.5, 3.5], s_j in [0.5, 1.2] fixed per
    feature (here drawn from the peers' own seed, not the product's hash)."""
    spec = torch.Generator().manual_seed(12345)
    p0 = 0.05 + 0.35 * torch.rand(num_dense, generator=spec, dtype=torch.float64)
    m = 0.5 + 3.0 * torch.rand(num_dense, generator=spec, dtype=torch.float64)
    s = 0.5 + 0.7 * torch.rand(num_dense, generator=spec, dtype=torch.float64)
    g = torch.randn(batch, num_dense, generator=gen, dtype=torch.float64)
    x = torch.log1p(torch.floor(torch.exp(torch.clamp(m + s * g, max=40.0))))
    zero = torch.rand(batch, num_dense, generator=gen, dtype=torch.float64) < p0
    return x.masked_fill_(zero, 0.0).float()


def make_batches(a, shape):
    """`--batches` batches, each (dense [B x D] float32, ids: per table a 1-D
    int64 tensor, lengths: per table a 1-D int64 tensor of bag sizes, labels
    [B] float32). Bags: exactly multi_hot_size ids under MULTI_HOT_FIXED, else
    1..multi_hot_size uniformly (1 id when multi_hot_size is 1), as the
    product's generator. Labels are Bernoulli(0.25), the CTR of the product's
    teacher (labels do not change the work of a step)."""
    gen = torch.Generator().manual_seed(a.seed)
    batches = []
    for _ in range(a.batches):
        dense = dense_features(a.batch, shape["num_dense"], gen)
        ids, lengths = [], []
        for t in shape["tables"]:
            if t["hot"] == 1 or t["fixed"]:
                ln = torch.full((a.batch,), t["hot"], dtype=torch.int64)
            else:
                ln = torch.randint(1, t["hot"] + 1, (a.batch,), generator=gen)
            lengths.append(ln)
            ids.append(zipf_ids(int(ln.sum()), t["rows"], a.alpha, gen))
        labels = (torch.rand(a.batch, generator=gen) < 0.25).float()
        batches.append((dense, ids, lengths, labels))
    return batches


# ------------------------------------------------------- the loop and report


def time_steps(a, step):
    """Runs `step(i)` warmup times, then `repeats` x `iters` timed; returns
    the samples/s of each repetition."""
    i = 0
    for _ in range(a.warmup):
        step(i)
        i += 1
    rates = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.iters):
            step(i)
            i += 1
        rates.append(a.batch * a.iters / (time.perf_counter() - t0))
    return rates


def autocast_ctx(a):
    if a.precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def library_versions():
    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        from importlib import metadata
        for dist, key in (("torchrec", "torchrec"), ("fbgemm-gpu-cpu", "fbgemm_gpu"),
                          ("fbgemm-gpu", "fbgemm_gpu")):
            if key not in v:
                try:
                    v[key] = metadata.version(dist)
                except metadata.PackageNotFoundError:
                    pass
    except ImportError:
        pass
    return v


def cpu_has_bf16():
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


def report(peer, a, shape, rates, extra=None):
    rows = [t["rows"] for t in shape["tables"]]
    line = {
        "peer": peer,
        "shape": a.shape,
        "interaction": a.interaction,
        "optimizer": shape["dense_optimizer"]["type"].lower(),
        "sparse_optimizer": shape["sparse_optimizer"]["type"].lower(),
        "precision": a.precision,
        "threads": torch.get_num_threads(),
        "batch": a.batch,
        "tables": len(rows),
        "dim": shape["dim"],
        "rows": max(rows),
        "total_rows": sum(rows),
        "ids_per_sample": sum(t["hot"] for t in shape["tables"]),
        "bottom_mlp": [shape["num_dense"]] + shape["bottom"],
        "top_mlp": [top_input_width(shape, a.interaction)] + shape["top"],
        "iters": a.iters,
        "warmup": a.warmup,
        "repeats": a.repeats,
        "batches": a.batches,
        "alpha": a.alpha,
        "samples_per_s": round(statistics.median(rates)),
        "min": round(min(rates)),
        "max": round(max(rates)),
        "cpu_bf16": cpu_has_bf16(),
    }
    if a.interaction == "dcn":
        line["dcn_layers"] = shape["dcn_layers"]
        line["dcn_rank"] = shape["dcn_rank"]
    line.update(extra or {})
    line["versions"] = library_versions()
    print(json.dumps(line), flush=True)
