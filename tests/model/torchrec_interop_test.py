#!/usr/bin/env python3
"""TorchRec interop against the real TorchRec (docs/torchrec.md).

Builds torchrec.models.dlrm.DLRM and DLRM_DCN with small tables (one of them
mean-pooled) and random weights, saves their state_dicts (safetensors, and
torch.save converted by scripts/torchrec_convert.py), imports them with
dlrm_torchrec and checks that this project's predictions (model::Model
through tests/tools/torchrec_check) equal sigmoid(TorchRec's logits) within
1e-5 on multi-hot inputs with empty bags. The imported checkpoint is also
served: dlrm_server --restore, Criteo TSV samples predicted through
dlrm_client equal TorchRec's on the same (transformed) inputs, and the
server trains on from it. Then the reverse: a model of ours
trained a few steps, exported with dlrm_torchrec, loaded into a TorchRec
DLRM with load_state_dict(strict=True) (from safetensors and from .pt),
predicts the same. A bad state_dict is refused naming the tensor. Dynamic
tables the same way against TorchRec's managed-collision modules (their
maps as an MCHManagedCollisionModule's buffers, both directions).

Usage: torchrec_interop_test.py DLRM_TORCHREC TORCHREC_CHECK DLRM_SERVER
                                DLRM_CLIENT SOURCE_DIR

Run by any python3: it finds the peer venv's python ($DLRM_PEERS_PYTHON,
/root/.cache/dlrm-peers-venv/bin/python, ~/.cache/dlrm-peers-venv/bin/python)
and runs itself under it. Without one that imports torch and torchrec it
exits 77 (CTest: skipped), or fails when DLRM_REQUIRE_TORCHREC=1.
"""

import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
TOLERANCE = 1e-5


def find_python():
    candidates = [os.environ.get("DLRM_PEERS_PYTHON", ""),
                  "/root/.cache/dlrm-peers-venv/bin/python",
                  os.path.expanduser("~/.cache/dlrm-peers-venv/bin/python")]
    tried = []
    for python in candidates:
        if not python:
            continue
        if not os.path.exists(python):
            tried.append(f"{python}: missing")
            continue
        check = subprocess.run(
            [python, "-c", "import torch, torchrec"], capture_output=True,
            text=True)
        if check.returncode == 0:
            return python, tried
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        tried.append(f"{python}: {last}")
    return None, tried


def launch():
    python, tried = find_python()
    if python is None:
        why = "; ".join(tried) or "no candidate"
        if os.environ.get("DLRM_REQUIRE_TORCHREC") == "1":
            print(f"FAIL: DLRM_REQUIRE_TORCHREC=1 but no python with torch "
                  f"and torchrec ({why})")
            return 1
        print(f"SKIP: no python with torch and torchrec ({why}); set "
              "DLRM_PEERS_PYTHON or build the venv with "
              "/work/shared/peers/setup_venv.sh")
        return SKIP
    print(f"using {python}", flush=True)
    env = dict(os.environ, DLRM_TORCHREC_INNER="1")
    return subprocess.run([python, os.path.abspath(__file__)] + sys.argv[1:],
                          env=env).returncode


# --------------------------------------------------------------- the test


def run(cmd, expect_ok=True):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    if not expect_ok and result.returncode == 0:
        raise AssertionError(f"{cmd} succeeded, expected a failure")
    return result


def inner(tool, check, server, client, source_dir):
    with tempfile.TemporaryDirectory(prefix="torchrec_interop_") as work:
        return check_interop(tool, check, server, client, source_dir, work)


def serve(server, client, ckpt, tsv):
    """Starts dlrm_server on the checkpoint `ckpt`, returns dlrm_client's
    predictions of the TSV file `tsv`, then trains 2 steps through it."""
    proc = subprocess.Popen(
        [server, "--restore", ckpt, "--listen", "127.0.0.1:0",
         "--metrics-listen", ""], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    try:
        address = None
        for line in proc.stdout:
            if "listening on" in line:
                address = line.split("listening on")[1].split()[0]
                break
        assert address, "dlrm_server did not start"
        out = run([client, "--server", address, "predict", tsv]).stdout
        probs = [float(x) for x in out.split()]
        trained = run([client, "--server", address, "train", "--synthetic",
                       "128", "--steps", "2", "--batch-size", "64"]).stdout
        assert "2 steps" in trained, trained
        return probs
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_interop(tool, check, server, client, source_dir, work):
    import torch
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_configs import (EmbeddingBagConfig,
                                                    PoolingType)
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    sys.path.insert(0, os.path.join(source_dir, "scripts"))
    import torchrec_convert

    rows = [23, 7, 41, 16]
    pooling = ["POOLING_SUM", "POOLING_MEAN", "POOLING_SUM", "POOLING_SUM"]
    dim, num_dense = 4, 5
    bottom, top = [8, dim], [6, 3, 1]
    layers, rank = 2, 3
    batch = 32

    def build(kind, seed):
        torch.manual_seed(seed)
        tables = [EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=dim, num_embeddings=rows[i],
            feature_names=[f"f{i}"],
            pooling=PoolingType.MEAN if pooling[i] == "POOLING_MEAN"
            else PoolingType.SUM) for i in range(len(rows))]
        ebc = EmbeddingBagCollection(tables=tables)
        if kind == "dcn":
            m = DLRM_DCN(ebc, num_dense, bottom, top, dcn_num_layers=layers,
                         dcn_low_rank_dim=rank)
        else:
            m = DLRM(ebc, num_dense, bottom, top)
        with torch.no_grad():
            for p in m.parameters():  # biases too (DCN's start at zero)
                p.normal_(0.0, 0.6)
        return m.eval()

    def config_text(kind):
        lines = [f"num_dense_features: {num_dense}"]
        for i, r in enumerate(rows):
            lines.append(f'tables {{ name: "t{i}" rows: {r} dim: {dim} '
                         f'pooling: {pooling[i]} }}')
        lines.append(f"bottom_mlp: {bottom}")
        lines.append(f"top_mlp: {top}")
        if kind == "dcn":
            lines += ["interaction: INTERACTION_DCN",
                      f"dcn_num_layers: {layers}", f"dcn_low_rank_dim: {rank}"]
        else:
            lines.append("interaction: INTERACTION_DOT")
        lines += ["dense_optimizer { type: SGD learning_rate: 0.05 }",
                  "sparse_optimizer { type: SGD learning_rate: 0.05 }",
                  # TorchRec's arithmetic (auto is bf16 on an AMX host).
                  "dense_precision: PRECISION_FP32",
                  "seed: 11"]
        return "\n".join(lines) + "\n"

    # Fixed inputs: bags of 0..3 ids (empty ones included), feature-major.
    gen = torch.Generator().manual_seed(1234)
    dense = torch.randn(batch, num_dense, generator=gen)
    lengths = [torch.randint(0, 4, (batch,), generator=gen) for _ in rows]
    ids = [torch.randint(0, r, (int(l.sum()),), generator=gen)
           for r, l in zip(rows, lengths)]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(len(rows))], values=torch.cat(ids),
        lengths=torch.cat(lengths))
    assert any(int(l.min()) == 0 for l in lengths), "want an empty bag"

    inputs = os.path.join(work, "inputs.json")
    with open(inputs, "w") as f:
        json.dump({"dense": dense.tolist(),
                   "sparse": [{"offsets": [0] + torch.cumsum(l, 0).tolist(),
                               "ids": i.tolist()}
                              for l, i in zip(lengths, ids)]}, f)

    def torchrec_probs(m):
        with torch.no_grad():
            return torch.sigmoid(m(dense, kjt)).reshape(-1).double()

    def our_probs(ckpt, tag):
        out = os.path.join(work, f"{tag}_probs.json")
        run([check, "predict", ckpt, inputs, out])
        with open(out) as f:
            return torch.tensor(json.load(f)["probs"], dtype=torch.float64)

    def compare(what, theirs, ours):
        diff = float((theirs - ours).abs().max())
        spread = float(theirs.std())
        print(f"{what}: max |difference| {diff:.3g} over {len(ours)} "
              f"predictions in [{float(theirs.min()):.3f}, "
              f"{float(theirs.max()):.3f}] (std {spread:.3g})", flush=True)
        assert len(ours) == batch, what
        assert spread > 0.01, f"{what}: predictions barely vary"
        assert diff <= TOLERANCE, f"{what}: {diff} > {TOLERANCE}"

    for kind in ("dot", "dcn"):
        cfg = os.path.join(work, f"{kind}.textproto")
        with open(cfg, "w") as f:
            f.write(config_text(kind))

        # TorchRec -> ours, from safetensors and from a torch.save file.
        theirs = build(kind, seed=1)
        expected = torchrec_probs(theirs)
        st = os.path.join(work, f"{kind}_torchrec.safetensors")
        torchrec_convert.write_safetensors(
            torchrec_convert.to_float32_tensors(theirs.state_dict()), st)
        # As a training script might save it: wrapped, under DDP's prefix.
        pt = os.path.join(work, f"{kind}_torchrec.pt")
        torch.save({"state_dict": {f"module.{k}": v for k, v in
                                   theirs.state_dict().items()},
                    "epoch": 3}, pt)
        converted = os.path.join(work, f"{kind}_from_pt.safetensors")
        run([sys.executable, os.path.join(source_dir, "scripts",
                                          "torchrec_convert.py"),
             "to-safetensors", pt, converted])
        for tag, path in (("safetensors", st), ("pt", converted)):
            ckpt = os.path.join(work, f"{kind}_{tag}_ckpt")
            run([tool, "import", "--config", cfg, "--in", path, "--out", ckpt])
            compare(f"{kind} TorchRec -> ours ({tag})", expected,
                    our_probs(ckpt, f"{kind}_{tag}"))

        # The same checkpoint served: Criteo TSV lines (label, integer
        # features, hex categoricals), which the server turns into
        # log(1 + max(x, 0)) and single-id bags of value % rows.
        tsv = os.path.join(work, f"{kind}.tsv")
        ints = torch.randint(-2, 30, (batch, num_dense), generator=gen)
        cats = torch.randint(0, 2**31, (batch, len(rows)), generator=gen)
        with open(tsv, "w") as f:
            for s in range(batch):
                fields = ["0"] + [str(int(x)) for x in ints[s]]
                fields += [format(int(c), "08x") for c in cats[s]]
                f.write("\t".join(fields) + "\n")
        tsv_dense = torch.log1p(ints.clamp(min=0).double()).float()
        tsv_ids = [cats[:, k] % r for k, r in enumerate(rows)]
        tsv_kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{i}" for i in range(len(rows))],
            values=torch.cat(tsv_ids),
            lengths=torch.ones(batch * len(rows), dtype=torch.int64))
        with torch.no_grad():
            tsv_expected = torch.sigmoid(
                theirs(tsv_dense, tsv_kjt)).reshape(-1).double()
        served = serve(server, client, ckpt, tsv)
        compare(f"{kind} TorchRec -> dlrm_server", tsv_expected,
                torch.tensor(served, dtype=torch.float64))

        # A state_dict of another shape is refused naming the tensor.
        bad_cfg = os.path.join(work, f"{kind}_bad.textproto")
        with open(bad_cfg, "w") as f:
            f.write(config_text(kind).replace("rows: 7 ", "rows: 8 "))
        bad = run([tool, "import", "--config", bad_cfg, "--in", st, "--out",
                   os.path.join(work, f"{kind}_bad_ckpt")], expect_ok=False)
        assert ("sparse_arch.embedding_bag_collection.embedding_bags.t1.weight"
                in bad.stderr), bad.stderr
        assert "INVALID_ARGUMENT" in bad.stderr, bad.stderr

        # Ours -> TorchRec: a model of ours trained a few steps.
        ours_ckpt = os.path.join(work, f"{kind}_ours_ckpt")
        run([check, "train", cfg, "5", ours_ckpt])
        exported = os.path.join(work, f"{kind}_ours.safetensors")
        run([tool, "export", "--checkpoint", ours_ckpt, "--out", exported])
        ours = our_probs(ours_ckpt, f"{kind}_ours")
        loaded = build(kind, seed=2)
        loaded.load_state_dict(torchrec_convert.read_safetensors(exported),
                               strict=True)
        compare(f"{kind} ours -> TorchRec (safetensors)",
                torchrec_probs(loaded), ours)
        if kind == "dot":
            # The pair columns left in our order would mis-predict: the
            # comparison above is sensitive to the reordering.
            state = torchrec_convert.read_safetensors(exported)
            key = "over_arch.model.0._mlp.0._linear.weight"
            n = len(rows) + 1
            unordered = state[key].clone()
            for i in range(1, n):
                for j in range(i):
                    ours_col = dim + i * (i - 1) // 2 + j
                    their_col = dim + j * n - j * (j + 1) // 2 + (i - j - 1)
                    unordered[:, ours_col] = state[key][:, their_col]
            state[key] = unordered
            loaded.load_state_dict(state, strict=True)
            wrong = float((torchrec_probs(loaded) - ours).abs().max())
            print(f"dot, pair columns not reordered: max |difference| "
                  f"{wrong:.3g}", flush=True)
            assert wrong > 100 * TOLERANCE, wrong
        exported_pt = os.path.join(work, f"{kind}_ours.pt")
        run([sys.executable, os.path.join(source_dir, "scripts",
                                          "torchrec_convert.py"),
             "to-pt", exported, exported_pt])
        loaded = build(kind, seed=3)
        loaded.load_state_dict(torch.load(exported_pt, weights_only=True),
                               strict=True)
        compare(f"{kind} ours -> TorchRec (.pt)", torchrec_probs(loaded),
                ours)
    check_dynamic(tool, check, work, torchrec_convert, rows, pooling, dim,
                  num_dense, bottom, top, compare, our_probs)
    print("OK")
    return 0


def check_dynamic(tool, check, work, torchrec_convert, rows, pooling, dim,
                  num_dense, bottom, top, compare, our_probs):
    """Dynamic tables against TorchRec's managed-collision modules: t0 (LRU)
    and t2 (LFU, a shared row for unadmitted ids) dynamic. Ours -> TorchRec:
    a model trained on raw ids from a vocabulary 10x the capacity, exported,
    loaded into a DLRM and a ManagedCollisionCollection of
    MCHManagedCollisionModules (strict), predicts the same on raw ids, known
    and unknown. TorchRec -> ours: a collection that admitted a few raw ids
    in training, imported, predicts the same."""
    import torch
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import (EmbeddingBagConfig,
                                                    PoolingType)
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.mc_modules import (LFU_EvictionPolicy,
                                             LRU_EvictionPolicy,
                                             MCHManagedCollisionModule,
                                             ManagedCollisionCollection)
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    prefix = torchrec_convert.MC_PREFIX
    dynamic = {0: "LRU", 2: "LFU"}
    batch = 32

    lines = [f"num_dense_features: {num_dense}"]
    for i, r in enumerate(rows):
        extra = ""
        if dynamic.get(i) == "LRU":
            extra = " dynamic: true"
        elif dynamic.get(i) == "LFU":
            extra = (" dynamic: true eviction { kind: EVICT_LFU } "
                     "unadmitted: UNADMITTED_SHARED_ROW")
        lines.append(f'tables {{ name: "t{i}" rows: {r} dim: {dim} '
                     f'pooling: {pooling[i]}{extra} }}')
    lines += [f"bottom_mlp: {bottom}", f"top_mlp: {top}",
              "interaction: INTERACTION_DOT",
              "dense_optimizer { type: SGD learning_rate: 0.05 }",
              "sparse_optimizer { type: SGD learning_rate: 0.05 }",
              "dense_precision: PRECISION_FP32", "seed: 11"]
    cfg = os.path.join(work, "dynamic.textproto")
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")

    def configs():
        return [EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=dim, num_embeddings=rows[i],
            feature_names=[f"f{i}"],
            pooling=PoolingType.MEAN if pooling[i] == "POOLING_MEAN"
            else PoolingType.SUM) for i in range(len(rows))]

    def build(seed):
        torch.manual_seed(seed)
        m = DLRM(EmbeddingBagCollection(tables=configs()), num_dense, bottom,
                 top)
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0.0, 0.6)
        all_configs = configs()
        mcc = ManagedCollisionCollection(
            {f"t{i}": MCHManagedCollisionModule(
                zch_size=rows[i], device=torch.device("cpu"),
                eviction_policy=LRU_EvictionPolicy() if kind == "LRU"
                else LFU_EvictionPolicy(), eviction_interval=1)
             for i, kind in dynamic.items()},
            [all_configs[i] for i in dynamic])
        return m.eval(), mcc

    def remapped(mcc, lengths, ids):
        """The KJT of all tables, the dynamic ones' raw ids through mcc."""
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{i}" for i in dynamic],
            values=torch.cat([ids[i] for i in dynamic]),
            lengths=torch.cat([lengths[i] for i in dynamic]))
        out = mcc(kjt).to_dict()
        values = [out[f"f{i}"].values() if i in dynamic else ids[i]
                  for i in range(len(rows))]
        return KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{i}" for i in range(len(rows))],
            values=torch.cat(values), lengths=torch.cat(lengths))

    def inputs(tag, known, gen):
        """Bags of 0..3 ids: a dynamic table's from `known` (raw ids, half
        of them) and ids no map holds; the others' rows."""
        dense = torch.randn(batch, num_dense, generator=gen)
        lengths = [torch.randint(0, 4, (batch,), generator=gen) for _ in rows]
        ids = []
        for i, (r, l) in enumerate(zip(rows, lengths)):
            n = int(l.sum())
            if i in dynamic:
                pick = known[i][torch.randint(0, len(known[i]), (n,),
                                              generator=gen)]
                unknown = torch.randint(10**12, 10**13, (n,), generator=gen)
                half = torch.rand(n, generator=gen) < 0.5
                ids.append(torch.where(half, pick, unknown))
            else:
                ids.append(torch.randint(0, r, (n,), generator=gen))
        path = os.path.join(work, f"{tag}_inputs.json")
        with open(path, "w") as f:
            json.dump({"dense": dense.tolist(),
                       "sparse": [{"offsets": [0] + torch.cumsum(l, 0).tolist(),
                                   "ids": i.tolist()}
                                  for l, i in zip(lengths, ids)]}, f)
        return path, dense, lengths, ids

    def probs(m, mcc, dense, lengths, ids):
        mcc.eval()
        with torch.no_grad():
            return torch.sigmoid(m(dense, remapped(mcc, lengths, ids))) \
                .reshape(-1).double()

    def predict_ours(ckpt, path, tag):
        out = os.path.join(work, f"{tag}_probs.json")
        run([check, "predict", ckpt, path, out])
        with open(out) as f:
            return torch.tensor(json.load(f)["probs"], dtype=torch.float64)

    # Ours -> TorchRec.
    ckpt = os.path.join(work, "dynamic_ours_ckpt")
    run([check, "train", cfg, "8", ckpt, str(10 * max(rows))])
    exported = os.path.join(work, "dynamic_ours.safetensors")
    run([tool, "export", "--checkpoint", ckpt, "--out", exported])
    state = torchrec_convert.read_safetensors(exported)
    m, mcc = build(seed=4)
    m.load_state_dict({k: v for k, v in state.items()
                       if not k.startswith(prefix)}, strict=True)
    mcc.load_state_dict({k[len(prefix):]: v for k, v in state.items()
                         if k.startswith(prefix)}, strict=True)
    empty = torch.iinfo(torch.int64).max
    known = {}
    for i in dynamic:
        held = state[f"{prefix}_managed_collision_modules.t{i}."
                     "_mch_sorted_raw_ids"]
        known[i] = held[held != empty]
        assert len(known[i]) > rows[i] // 2, known[i]
    gen = torch.Generator().manual_seed(99)
    path, dense, lengths, ids = inputs("dynamic_ours", known, gen)
    ours = predict_ours(ckpt, path, "dynamic_ours")
    compare("dynamic ours -> TorchRec MC (safetensors)",
            probs(m, mcc, dense, lengths, ids), ours)

    # TorchRec -> ours: the collection admits 5 raw ids per table in
    # training (few enough that every id finds a row of its bucket).
    m, mcc = build(seed=5)
    mcc.train()
    admitted = {i: torch.tensor([7 + 1000003 * j for j in range(5)]) + i
                for i in dynamic}
    for _ in range(3):
        lengths = [torch.ones(5, dtype=torch.int64) for _ in rows]
        ids = [admitted[i] if i in dynamic else torch.zeros(5, dtype=torch.int64)
               for i in range(len(rows))]
        remapped(mcc, lengths, ids)
    # t0 is UNADMITTED_ZERO: its kept row stays zero, where TorchRec's
    # default row trains as a shared one; zeroed here to compare (t2, a
    # shared row, takes TorchRec's as it is).
    with torch.no_grad():
        m.sparse_arch.embedding_bag_collection.embedding_bags["t0"] \
            .weight[rows[0] - 1].zero_()
    state = dict(m.state_dict())
    state.update({prefix + k: v for k, v in mcc.state_dict().items()})
    st = os.path.join(work, "dynamic_torchrec.safetensors")
    torchrec_convert.write_safetensors(
        torchrec_convert.to_float32_tensors(state), st)
    imported = os.path.join(work, "dynamic_torchrec_ckpt")
    out = run([tool, "import", "--config", cfg, "--in", st, "--out",
               imported]).stdout
    assert "10 ids of the managed-collision maps given a row, 0 without" \
        in out, out
    path, dense, lengths, ids = inputs("dynamic_torchrec", admitted, gen)
    compare("dynamic TorchRec MC -> ours", probs(m, mcc, dense, lengths, ids),
            predict_ours(imported, path, "dynamic_torchrec"))

    # A plain DLRM state_dict has no map for a dynamic table: refused,
    # naming the missing buffer.
    plain = os.path.join(work, "dynamic_plain.safetensors")
    torchrec_convert.write_safetensors(
        torchrec_convert.to_float32_tensors(m.state_dict()), plain)
    bad = run([tool, "import", "--config", cfg, "--in", plain, "--out",
               os.path.join(work, "dynamic_plain_ckpt")], expect_ok=False)
    assert f"missing tensor {prefix}_managed_collision_modules.t0." \
        "_mch_sorted_raw_ids" in bad.stderr, bad.stderr


if __name__ == "__main__":
    if len(sys.argv) != 6:
        print(__doc__)
        sys.exit(2)
    if os.environ.get("DLRM_TORCHREC_INNER") == "1":
        sys.exit(inner(*sys.argv[1:]))
    sys.exit(launch())
