#!/usr/bin/python3
"""Trains a dlrm-server model on a few random batches, evaluates it, and
predicts click probabilities, through the Python client.

    # against a running server
    PYTHONPATH=build/clients/python-package \
        /usr/bin/python3 clients/python/examples/train_and_predict.py \
        --server 127.0.0.1:50051
    # or start one (the tiny model) for the run
    ... train_and_predict.py --server-binary build/server/dlrm_server
"""

import argparse
import math
import sys

from dlrm_client import Client, DlrmError, LocalServer, random_batch


def run(address, steps, batch_size):
    with Client(address) as client:
        info = client.info()
        config = info.config
        print("model: %d dense features, %d tables, %d parameters, step %d" %
              (config.num_dense_features, len(config.tables),
               info.embedding_parameters + info.dense_parameters, info.steps))

        batches = [random_batch(config, batch_size, seed=s)
                   for s in range(steps)]
        results = client.train(
            batches,
            callback=lambda r: print("step %d  loss %.4f  %.0f samples/s" %
                                     (r.step, r.loss, r.samples_per_second)))
        assert all(math.isfinite(r.loss) for r in results)

        held_out = random_batch(config, 512, seed=10**6)
        metrics = client.evaluate(batches=[held_out]).metrics
        print("eval: auc %.4f  logloss %.4f  samples %d" %
              (metrics.auc, metrics.log_loss, metrics.samples))

        probabilities = client.predict(batch=random_batch(config, 5, seed=1))
        print("predictions:", " ".join("%.4f" % p for p in probabilities))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--server", default="127.0.0.1:50051",
                       help="address of a running dlrm-server")
    where.add_argument("--server-binary",
                       help="start this dlrm_server (tiny config) instead")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    try:
        if args.server_binary:
            with LocalServer(args.server_binary, config="tiny") as server:
                run(server.address, args.steps, args.batch_size)
        else:
            run(args.server, args.steps, args.batch_size)
    except DlrmError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
