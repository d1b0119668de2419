"""End-to-end test of the Python client against a real dlrm_server (tiny
config): train a few batches, predict, evaluate, run a job (on synthetic
data and on numpy-written days), checkpoints, the weights export.
The server binary comes from $DLRM_SERVER (set by CTest)."""

import json
import math
import os
import struct
import shutil
import tempfile
import unittest

import grpc

from dlrm_client import service_pb2
import numpy as np

from dlrm_client import (Client, DlrmError, LocalServer, make_batch,
                         npy_dataset, random_batch, synthetic_dataset)


class ConnectTest(unittest.TestCase):

    def test_refused_connection_fails_at_once_naming_the_address(self):
        # With an hour to wait, a client that retried until the timeout
        # would never come back.
        with self.assertRaises(DlrmError) as raised:
            Client("127.0.0.1:1", connect_timeout=3600)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("at 127.0.0.1:1: the connection failed",
                      str(raised.exception))


class ClientTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        binary = os.environ.get("DLRM_SERVER", "")
        if not binary or not os.access(binary, os.X_OK):
            raise unittest.SkipTest(
                "set DLRM_SERVER to a built dlrm_server (got %r)" % binary)
        cls.tmp = tempfile.mkdtemp(prefix="dlrm_client_test_")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.server = LocalServer(binary, config="tiny",
                                 checkpoint_dir=os.path.join(cls.tmp, "ckpt"),
                                 data_dir=cls.tmp)
        cls.addClassCleanup(cls.server.stop)
        cls.client = Client(cls.server.address)
        cls.addClassCleanup(cls.client.close)
        cls.config = cls.client.config()

    def test_info_is_the_tiny_model(self):
        info = self.client.info()
        self.assertEqual(info.config.num_dense_features, 4)
        self.assertEqual([t.name for t in info.config.tables],
                         ["t0", "t1", "t2"])
        self.assertGreater(info.embedding_parameters, 0)

    def test_train_then_predict(self):
        before = self.client.info().steps
        batches = [random_batch(self.config, 64, seed=s) for s in range(6)]
        seen = []
        results = self.client.train(batches, callback=seen.append,
                                    max_in_flight=2)
        self.assertEqual(len(results), 6)
        self.assertEqual(seen, results)
        steps = [r.step for r in results]
        self.assertEqual(steps, sorted(steps))
        self.assertEqual(len(set(steps)), 6)
        self.assertGreater(steps[0], before)
        for r in results:
            self.assertTrue(math.isfinite(r.loss))
            self.assertEqual(r.samples, 64)

        probabilities = self.client.predict(
            dense=[[0.5, 0.1, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
            sparse=[[3, [1, 2], [7, 8]], [0, [5], 99]])
        self.assertEqual(len(probabilities), 2)
        for p in probabilities:
            self.assertGreater(p, 0.0)
            self.assertLess(p, 1.0)

        probabilities = self.client.predict(
            batch=random_batch(self.config, 33, seed=99))
        self.assertEqual(len(probabilities), 33)

    def test_evaluate_inline(self):
        response = self.client.evaluate(
            batches=[random_batch(self.config, 200, seed=7)])
        self.assertEqual(response.metrics.samples, 200)
        self.assertTrue(0.0 <= response.metrics.auc <= 1.0)
        self.assertTrue(math.isfinite(response.metrics.log_loss))

    def test_bad_batch_is_invalid_argument(self):
        bad = make_batch(dense=[[0.0] * 4], sparse=[[10**6, 0, 0]],
                         labels=[1])
        with self.assertRaises(DlrmError) as e:
            self.client.train([bad])
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(ValueError):
            make_batch(dense=[[0.0] * 4], sparse=[], labels=[1])

    def test_job_on_synthetic_data(self):
        job = self.client.start_job(train=synthetic_dataset(2048),
                                    eval_data=synthetic_dataset(
                                        512, sample_seed=99),
                                    batch_size=256)
        self.assertTrue(job.id)
        polls = []
        final = self.client.wait_job(job.id, poll_interval=0.1, timeout=60,
                                     callback=polls.append)
        self.assertEqual(final.state, service_pb2.JobStatus.SUCCEEDED,
                         final.error)
        self.assertEqual(final.samples, 2048)
        self.assertTrue(polls)
        self.assertIn(job.id, [j.id for j in self.client.list_jobs()])
        with self.assertRaises(DlrmError) as e:
            self.client.get_job("no-such-job")
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_job_on_numpy_days(self):
        # MLPerf DLRM-DCNv2's layout for the tiny model: dense and labels as
        # TorchRec writes them, the bags of each table in an .npz member.
        rng = np.random.default_rng(3)
        n = 300
        np.save(os.path.join(self.tmp, "day_0_dense.npy"),
                rng.standard_normal((n, 4)).astype(np.float32))
        np.save(os.path.join(self.tmp, "day_0_labels.npy"),
                rng.integers(0, 2, (n, 1), dtype=np.int32))
        bags = {str(t): rng.integers(0, t_rows, (n, k), dtype=np.int32)
                for t, (t_rows, k) in enumerate([(50, 1), (20, 3), (100, 2)])}
        np.savez(os.path.join(self.tmp, "day_0_sparse_multi_hot.npz"), **bags)
        job = self.client.start_job(train=npy_dataset(["day_0"]),
                                    batch_size=64)
        final = self.client.wait_job(job.id, poll_interval=0.1, timeout=60)
        self.assertEqual(final.state, service_pb2.JobStatus.SUCCEEDED,
                         final.error)
        self.assertEqual(final.samples, n)

    def test_source_errors_are_raised_as_they_are(self):
        def broken_source():
            yield random_batch(self.config, 8, seed=1)
            raise OSError("disk on fire")

        with self.assertRaisesRegex(OSError, "disk on fire"):
            self.client.train(broken_source())

    def test_checkpoint_round_trip(self):
        path = os.path.join(self.tmp, "ckpt", "py")
        saved = self.client.save_checkpoint(path)
        restored = self.client.restore_checkpoint(path)
        self.assertEqual(saved.step, restored.step)
        self.assertIn("dlrm_model_steps", self.client.metrics())

    def test_set_learning_rate_changes_the_running_model(self):
        answer = self.client.set_learning_rate(sparse=0.05)
        self.assertAlmostEqual(answer.sparse, 0.05, places=6)
        self.assertAlmostEqual(
            self.client.config().sparse_optimizer.learning_rate, 0.05,
            places=6)
        with self.assertRaises(DlrmError) as e:
            self.client.set_learning_rate(dense=float("nan"))
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("dense_optimizer.learning_rate", str(e.exception))
        # The other tests share the server: the preset's rate again.
        self.client.set_learning_rate(sparse=0.1)

    def test_export_weights_is_a_safetensors_file(self):
        exported = self.client.export_weights("py-weights.safetensors")
        self.assertEqual(exported.path,
                         os.path.realpath(os.path.join(
                             self.tmp, "ckpt", "py-weights.safetensors")))
        with open(exported.path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        self.assertEqual(os.path.getsize(exported.path), exported.bytes)
        self.assertEqual(len(header) - 1, exported.tensors)  # - __metadata__
        self.assertEqual(header["__metadata__"]["format"], "dlrm-server")
        self.assertEqual(header["bottom_mlp.0.weight"]["shape"], [8, 4])
        self.assertEqual(header["top_mlp.1.bias"]["shape"], [1])
        self.assertEqual(header["embedding_bags.t1.weight"]["shape"], [20, 4])
        self.assertEqual(header["embedding_bags.t1.weight"]["dtype"], "F32")


if __name__ == "__main__":
    unittest.main()
