#!/usr/bin/env python3
"""Notebook-style tour of the dlrm_client package: numpy data in, a Train
stream, a server-side job, evaluation and predictions out.

    pip install --no-index --no-build-isolation build/clients/python-package
    python3 clients/python/examples/notebook_style.py \
        --local-server build/server/dlrm_server

It TRAINS the model it talks to on random data. With --local-server it
starts a tiny dlrm_server of its own for that (and stops it at the end);
against a running server (HOST:PORT) it refuses unless you pass
--i-know-this-trains, so that a live model is not retrained by accident.

--json prints the results as one JSON object on the last line (for tests).
"""

import argparse
import json
import math
import sys

import numpy as np

import dlrm_client
from dlrm_client import Client, DlrmError, LocalServer, synthetic_dataset


def make_data(config, n, seed):
    """Random samples for the server's model with a learnable rule: the
    label is 1 when dense[:, 0] plus an effect of table 0's id is positive.
    dense float32 [n, d]; sparse: one array per table ([n] ids, or [n, k]
    for multi-hot tables); labels float32 [n]."""
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(n, config.num_dense_features)).astype(np.float32)
    sparse = []
    for table in config.tables:
        k = max(table.multi_hot_size, 1)
        shape = (n,) if k == 1 else (n, k)
        sparse.append(rng.integers(0, table.rows, size=shape))
    first = sparse[0] if sparse[0].ndim == 1 else sparse[0][:, 0]
    effect = np.where(first % 2 == 0, 1.0, -1.0)
    labels = (dense[:, 0] + effect > 0).astype(np.float32)
    return dense, sparse, labels


def run(address, steps, batch_size, token=None, tls_ca=None,
        tls_server_name=None):
    results = {"version": dlrm_client.__version__}
    with Client(address, auth_token=token, tls_ca=tls_ca,
                tls_server_name=tls_server_name) as client:
        # --- 1. What is the server running?
        print("health:", client.health())
        info = client.info()
        config = info.config
        print("model: %d dense features, tables %s, step %d" %
              (config.num_dense_features,
               [(t.name, t.rows) for t in config.tables], info.steps))

        # --- 2. Train on numpy arrays over a Train stream.
        dense, sparse, labels = make_data(config, steps * batch_size, seed=1)
        steps_done = client.train_arrays(dense, sparse, labels,
                                         batch_size=batch_size,
                                         shuffle_seed=0)
        losses = [r.loss for r in steps_done]
        print("stream: %d steps, loss %.4f -> %.4f" %
              (len(losses), losses[0], losses[-1]))
        results["stream_steps"] = len(losses)
        results["stream_losses_finite"] = all(math.isfinite(x)
                                              for x in losses)

        # --- 3. A job on data the server generates, then wait for it.
        job = client.start_job(train=synthetic_dataset(4 * batch_size),
                               eval_data=synthetic_dataset(512,
                                                           sample_seed=7),
                               batch_size=batch_size)
        final = client.wait_job(job.id, poll_interval=0.2, timeout=120)
        state = dlrm_client.service_pb2.JobStatus.State.Name(final.state)
        print("job %s: %s, %d steps, eval auc %.4f" %
              (final.id, state, final.steps, final.eval.auc))
        results["job_state"] = state
        results["jobs_listed"] = job.id in [j.id for j in client.list_jobs()]

        # --- 4. Evaluate on held-out numpy data.
        dense_t, sparse_t, labels_t = make_data(config, 1024, seed=2)
        metrics = client.evaluate(dense=dense_t, sparse=sparse_t,
                                  labels=labels_t).metrics
        print("eval: auc %.4f  log loss %.4f  accuracy %.4f  (%d samples)" %
              (metrics.auc, metrics.log_loss, metrics.accuracy,
               metrics.samples))
        results["eval_samples"] = metrics.samples
        results["eval_auc"] = metrics.auc

        # --- 5. Predict: a float32 array, one probability per sample.
        probabilities = client.predict(dense_t[:8], [s[:8] for s in sparse_t])
        print("predictions:", np.round(probabilities, 4))
        results["predictions"] = [float(p) for p in probabilities]
        results["steps"] = client.info().steps
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("server", nargs="?",
                        help="HOST:PORT of a running dlrm-server (its model "
                        "is trained: needs --i-know-this-trains)")
    parser.add_argument("--local-server", metavar="DLRM_SERVER",
                        help="start this dlrm_server binary (tiny config, a "
                        "free port) and tour it instead")
    parser.add_argument("--i-know-this-trains", action="store_true",
                        help="with HOST:PORT: train that server's model on "
                        "random data")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--token", help="the server's bearer token")
    parser.add_argument("--tls-ca", help="PEM CA of the server's certificate")
    parser.add_argument("--tls-server-name",
                        help="the name the server's certificate carries")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON on the last line")
    args = parser.parse_args()
    if (args.server is None) == (args.local_server is None):
        parser.error("give HOST:PORT or --local-server DLRM_SERVER")
    if args.server is not None and not args.i_know_this_trains:
        parser.error(
            "this example trains the model of %s on random data (%d steps "
            "and a job): pass --i-know-this-trains if that is what you "
            "want, or --local-server PATH/TO/dlrm_server to tour a server "
            "of its own" % (args.server, args.steps))
    try:
        if args.local_server is not None:
            with LocalServer(args.local_server, config="tiny") as server:
                results = run(server.address, args.steps, args.batch_size)
        else:
            results = run(args.server, args.steps, args.batch_size,
                          args.token, args.tls_ca, args.tls_server_name)
    except DlrmError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
