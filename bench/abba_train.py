#!/usr/bin/env python3
"""Two dlrm_bench_train binaries (a before and an after build) run in
rounds of A B B A on one config, each run with --roofline, then the median
samples/s and stage milliseconds of each side.

Usage: bench/abba_train.py ROUNDS CONFIG STEPS THREADS BIN_A BIN_B [ARGS...]
  e.g. bench/abba_train.py 3 kaggle 20 2 /tmp/before/dlrm_bench_train \
         build/bench/dlrm_bench_train
ARGS go to both binaries (after --rows 100000 --batch 2048 --repeats 3).
Prints one line per run as it ends, then a MEDIAN line per side.
"""
import json
import statistics
import subprocess
import sys

STAGES = ('lookup', 'bottom_fwd', 'inter_fwd', 'top_fwd', 'top_bwd',
          'inter_bwd', 'bottom_bwd', 'emb_update', 'dense_update')


def main():
    if len(sys.argv) < 7:
        sys.exit(__doc__)
    rounds, config, steps, threads = (int(sys.argv[1]), sys.argv[2],
                                      sys.argv[3], sys.argv[4])
    bins, extra = sys.argv[5:7], sys.argv[7:]
    runs = {b: [] for b in bins}
    for r in range(rounds):
        order = bins + bins[::-1] if r % 2 == 0 else bins[::-1] + bins
        for b in order:
            out = subprocess.run(
                [b, '--config', config, '--rows', '100000', '--batch', '2048',
                 '--steps', steps, '--repeats', '3', '--threads', threads,
                 '--roofline'] + extra,
                capture_output=True, text=True, check=True).stdout
            line = next(l for l in out.splitlines()
                        if '"bench": "dlrm-server-cpu"' in l)
            d = json.loads(line)
            runs[b].append(d)
            print(b, d['samples_per_s'],
                  ' '.join('%s %.2f' % (k, d['stage_ms'][k]) for k in STAGES),
                  flush=True)
    for b in bins:
        stages = {k: statistics.median(d['stage_ms'][k] for d in runs[b])
                  for k in runs[b][0]['stage_ms']}
        print('MEDIAN', b,
              statistics.median(d['samples_per_s'] for d in runs[b]),
              'samples/s over', len(runs[b]), 'runs;',
              ' '.join('%s %.2f' % (k, v) for k, v in stages.items()
                       if v > 0.01))


if __name__ == '__main__':
    main()
