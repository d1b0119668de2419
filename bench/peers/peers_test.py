#!/usr/bin/env python3
"""CTest for the benchmark peers (label `peers`): checks that the two peers'
models give the same logits from the same weights (check_same_model.py),
then runs each peer for 2 timed steps on tiny tables in both shapes and both
precisions, and checks that its
JSON line parses, names what ran, has the config's layer sizes, and a positive
samples/s (never a timing beyond that). With --compare BENCH it also runs
bench/compare_peers.sh for one tiny round against that dlrm_bench_train and
checks the final tables.

Needs the peers' venv (bench/peers/setup_venv.sh; DLRM_PEERS_VENV or
~/.cache/dlrm-peers-venv): without it, it prints why and exits 77, which CTest
reports as skipped.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SKIP = 77

# (peer script, expected "peer", shape, precision, extra flags)
RUNS = [
    ("torchrec_dlrm.py", "torchrec-fbgemm", "kaggle", "fp32", []),
    ("torchrec_dlrm.py", "torchrec-fbgemm", "mlperf-dcnv2", "bf16", []),
    ("torch_eager_dlrm.py", "pytorch-eager", "kaggle", "bf16", []),
    ("torch_eager_dlrm.py", "pytorch-eager", "mlperf-dcnv2", "fp32", []),
]
EXPECTED = {
    "kaggle": dict(interaction="dot", optimizer="sgd", dim=16, ids_per_sample=26,
                   bottom_mlp=[13, 512, 256, 64, 16], top_mlp=[367, 512, 256, 1]),
    "mlperf-dcnv2": dict(interaction="dcn", optimizer="adagrad", dim=128,
                         ids_per_sample=214, bottom_mlp=[13, 512, 256, 128],
                         top_mlp=[3456, 1024, 1024, 512, 256, 1],
                         dcn_layers=3, dcn_rank=512),
}
TINY = ["--batch", "32", "--iters", "2", "--warmup", "1", "--repeats", "1",
        "--threads", "1", "--batches", "2"]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def venv_python():
    venv = os.environ.get("DLRM_PEERS_VENV",
                          os.path.expanduser("~/.cache/dlrm-peers-venv"))
    py = os.path.join(venv, "bin", "python")
    if not (os.access(py, os.X_OK) and os.path.isfile(os.path.join(venv, ".ready"))):
        print(f"SKIP: no peer venv at {venv} (make it with bench/peers/setup_venv.sh "
              "or point DLRM_PEERS_VENV at one)")
        sys.exit(SKIP)
    return venv, py


def check_line(line, peer, shape, precision):
    try:
        j = json.loads(line)
    except json.JSONDecodeError as e:
        fail(f"{peer} {shape}: last line is not JSON ({e}): {line!r}")
    want = dict(EXPECTED[shape], peer=peer, shape=shape, precision=precision,
                threads=1, batch=32, tables=26, rows=50, iters=2)
    for key, value in want.items():
        if j.get(key) != value:
            fail(f"{peer} {shape} {precision}: {key} = {j.get(key)!r}, want {value!r}")
    if not (isinstance(j.get("samples_per_s"), (int, float)) and j["samples_per_s"] > 0):
        fail(f"{peer} {shape}: samples_per_s = {j.get('samples_per_s')!r}")
    if "torch" not in j.get("versions", {}):
        fail(f"{peer} {shape}: no torch version in {j.get('versions')!r}")
    if peer == "torchrec-fbgemm" and "torchrec" not in j["versions"]:
        fail(f"{peer}: no torchrec version in {j['versions']!r}")
    print(f"ok: {peer} {shape} {precision}: {j['samples_per_s']} samples/s")


def run_peers(py):
    # The two peers' models compute the same logits from the same weights.
    cmd = [py, os.path.join(HERE, "check_same_model.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print(p.stdout, end="")
    if p.returncode != 0:
        fail(f"check_same_model.py exited {p.returncode}:\n{p.stderr[-3000:]}")
    for script, peer, shape, precision, extra in RUNS:
        cmd = [py, os.path.join(HERE, script), "--shape", shape, "--rows", "50",
               "--precision", precision] + TINY + extra
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if p.returncode != 0:
            fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
        lines = p.stdout.strip().splitlines()
        if not lines:
            fail(f"{' '.join(cmd)} printed nothing; stderr:\n{p.stderr[-3000:]}")
        check_line(lines[-1], peer, shape, precision)


def run_compare(venv, bench):
    env = dict(os.environ, VENV=venv, BENCH=bench, SHAPES="kaggle mlperf-dcnv2",
               PRECISIONS="fp32", PEER_THREADS="1", OUR_THREADS="1",
               KAGGLE_ROWS="50", DCN_MAX_ROWS="50", KAGGLE_ITERS="2",
               KAGGLE_WARMUP="1", DCN_ITERS="1", DCN_WARMUP="1", REPEATS="1")
    cmd = [os.path.join(REPO, "bench", "compare_peers.sh"), "1", "32"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    if p.returncode != 0:
        fail(f"compare_peers.sh exited {p.returncode}:\n{p.stderr[-3000:]}")
    out = p.stdout.splitlines()
    jsons = [json.loads(line) for line in out if line.startswith("{")]
    if len(jsons) != 6:  # ours + 2 peers, 2 shapes
        fail(f"compare_peers.sh printed {len(jsons)} JSON lines, want 6:\n{p.stdout}")
    ours = [j for j in jsons if j.get("bench") == "dlrm-server-cpu"]
    if [j["rows"] for j in ours] != [50, 50]:
        fail(f"our side's tables: {[j.get('rows') for j in ours]}, want 50 rows each")
    ratios = [line for line in out if line.startswith("| kaggle | fp32 | ")
              or line.startswith("| mlperf-dcnv2 | fp32 | ")]
    ratio_rows = [r for r in ratios if r.rstrip().endswith("x |")]
    if len(ratio_rows) != 4:  # 2 shapes x 2 peers
        fail(f"want 4 ratio rows in the final table:\n{p.stdout}")
    print("ok: compare_peers.sh, one tiny round:\n" + "\n".join(ratio_rows))


def main():
    venv, py = venv_python()
    if len(sys.argv) == 3 and sys.argv[1] == "--compare":
        run_compare(venv, sys.argv[2])
    elif len(sys.argv) == 1:
        run_peers(py)
    else:
        fail("usage: peers_test.py [--compare DLRM_BENCH_TRAIN]")


if __name__ == "__main__":
    main()
