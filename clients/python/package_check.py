"""Run by package_test.py with the python of a venv where dlrm_client was
pip-installed: checks the installed package against a real dlrm_server.

    package_check.py SERVER_BINARY NOTEBOOK_EXAMPLE
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import grpc
import numpy as np

import dlrm_client
from dlrm_client import Client, DlrmError, LocalServer, batch_from_arrays

SERVER, EXAMPLE = sys.argv[1:3]


class InstalledPackageTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="dlrm_package_check_")
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.server = LocalServer(
            SERVER, config="tiny",
            checkpoint_dir=os.path.join(cls.tmp.name, "ckpt"),
            data_dir=cls.tmp.name)
        cls.addClassCleanup(cls.server.stop)
        cls.client = Client(cls.server.address)
        cls.addClassCleanup(cls.client.close)
        cls.config = cls.client.config()

    def test_00_installed_in_the_venv(self):
        self.assertTrue(dlrm_client.__file__.startswith(sys.prefix),
                        dlrm_client.__file__)
        self.assertNotEqual(sys.prefix, sys.base_prefix)
        self.assertRegex(dlrm_client.__version__, r"^\d+\.\d+\.\d+")
        self.assertTrue(dlrm_client.service_pb2.__file__.startswith(
            os.path.dirname(dlrm_client.__file__)))

    def test_01_notebook_example(self):
        # Against a running server it refuses to train without being told.
        steps_before = self.client.info().steps
        refused = subprocess.run(
            [sys.executable, EXAMPLE, self.server.address],
            capture_output=True, text=True, timeout=180, check=False)
        self.assertEqual(refused.returncode, 2,
                         refused.stdout + refused.stderr)
        self.assertIn("--i-know-this-trains", refused.stderr)
        self.assertEqual(self.client.info().steps, steps_before)
        out = subprocess.run(
            [sys.executable, EXAMPLE, self.server.address, "--steps", "10",
             "--batch-size", "64", "--json", "--i-know-this-trains"],
            capture_output=True, text=True, timeout=180, check=False)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        results = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(results["version"], dlrm_client.__version__)
        self.assertEqual(results["stream_steps"], 10)
        self.assertTrue(results["stream_losses_finite"])
        self.assertEqual(results["job_state"], "SUCCEEDED")
        self.assertTrue(results["jobs_listed"])
        self.assertEqual(results["eval_samples"], 1024)
        self.assertTrue(0.0 <= results["eval_auc"] <= 1.0)
        self.assertEqual(len(results["predictions"]), 8)
        for p in results["predictions"]:
            self.assertTrue(0.0 < p < 1.0, p)
        self.assertGreaterEqual(results["steps"], 10 + 4)

    def test_02_notebook_example_on_a_server_of_its_own(self):
        steps_before = self.client.info().steps
        out = subprocess.run(
            [sys.executable, EXAMPLE, "--local-server", SERVER, "--steps",
             "3", "--batch-size", "32", "--json"],
            capture_output=True, text=True, timeout=180, check=False)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        results = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(results["stream_steps"], 3)
        self.assertEqual(results["job_state"], "SUCCEEDED")
        # It trained its own server, not this one.
        self.assertEqual(self.client.info().steps, steps_before)

    def _arrays(self, n, seed=0):
        rng = np.random.default_rng(seed)
        dense = rng.normal(size=(n, self.config.num_dense_features))
        sparse = [rng.integers(0, t.rows, size=n) for t in self.config.tables]
        return dense.astype(np.float32), sparse

    def test_predict_layouts_agree(self):
        dense, sparse = self._arrays(16)
        by_ids = self.client.predict(dense, sparse)
        self.assertIsInstance(by_ids, np.ndarray)
        self.assertEqual(by_ids.dtype, np.float32)
        self.assertEqual(by_ids.shape, (16,))
        by_offsets = self.client.predict(
            dense, [(np.arange(16), ids) for ids in sparse])
        by_bags = self.client.predict(
            dense, [[ids[i:i + 1] for i in range(16)] for ids in sparse])
        by_batch = self.client.predict(batch=batch_from_arrays(dense, sparse))
        np.testing.assert_allclose(by_offsets, by_ids, rtol=1e-6)
        np.testing.assert_allclose(by_bags, by_ids, rtol=1e-6)
        np.testing.assert_allclose(by_batch, by_ids, rtol=1e-6)

    def test_wrong_dense_width_is_invalid_argument(self):
        dense, sparse = self._arrays(4)
        wide = np.concatenate([dense, np.zeros((4, 1), np.float32)], axis=1)
        with self.assertRaises(DlrmError) as e:
            self.client.predict(wide, sparse)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(e.exception.message)
        with self.assertRaises(ValueError):
            batch_from_arrays(dense, [ids[:3] for ids in sparse])

    def test_health_metrics_checkpoint_export(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health("dlrm.Predictor"), "SERVING")
        self.assertIn("dlrm_model_steps", self.client.metrics())
        info = self.client.info(include_weight_checksum=True)
        self.assertNotEqual(info.weight_checksum, 0)
        path = os.path.join(self.tmp.name, "ckpt", "pkg")
        saved = self.client.save_checkpoint(path)
        self.assertEqual(self.client.restore_checkpoint(path).step,
                         saved.step)
        exported = self.client.export_weights("pkg.safetensors")
        self.assertTrue(os.path.isfile(exported.path))
        self.assertGreater(exported.tensors, 0)

    def test_train_arrays_and_evaluate(self):
        dense, sparse = self._arrays(300, seed=3)
        labels = (dense[:, 0] > 0).astype(np.float32)
        results = self.client.train_arrays(dense, sparse, labels,
                                           batch_size=100, epochs=2)
        self.assertEqual([r.samples for r in results], [100] * 6)
        self.assertTrue(all(math.isfinite(r.loss) for r in results))
        metrics = self.client.evaluate(dense=dense, sparse=sparse,
                                       labels=labels).metrics
        self.assertEqual(metrics.samples, 300)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
