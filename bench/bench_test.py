"""dlrm_bench end to end: the CPU scenario on the tiny model, a few steps.

Checks the printed table, the JSON file and the PNG chart by parsing them,
never by timing. Usage: bench_test.py DLRM_BENCH DLRM_SERVER
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

BENCH, SERVER = sys.argv[1], sys.argv[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HAVE_CHART_TOOL = shutil.which("gnuplot") is not None or subprocess.run(
    ["python3", "-c", "import matplotlib"], capture_output=True).returncode == 0


class BenchTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dlrm_bench_test.")
        cmd = [BENCH, "--server", SERVER, "--config", "tiny", "--batch", "64",
               "--warmup", "1", "--steps", "3", "--repeats", "2",
               "--ranks", "2", "--project-ranks", "8,16", "--out", cls.dir]
        cls.proc = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=80)
        cls.stdout = cls.proc.stdout
        print(cls.stdout)
        print(cls.proc.stderr, file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_exits_zero(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)

    def test_table(self):
        lines = self.stdout.splitlines()
        self.assertIn("Measured", lines)
        projected = [i for i, l in enumerate(lines) if l.startswith("Projected")]
        self.assertEqual(len(projected), 1)
        measured_rows = [l for l in lines[:projected[0]] if l.startswith("| ")
                         and not l.startswith("| hardware")]
        self.assertIn("| hardware | scenario | feed | samples/s median "
                      "[min-max] | speedup over CPU |", lines)
        self.assertTrue(any("server-side synthetic job" in l and "1.00x" in l
                            for l in measured_rows), measured_rows)
        self.assertTrue(any("client stream" in l for l in measured_rows))
        self.assertTrue(any("2 rank processes" in l for l in measured_rows))
        # The two GPU rows: both measured, or both say why not (no GPU
        # here, or a build without CUDA), never with a number.
        gpu_rows = [l for l in measured_rows
                    if l.startswith("| 1 GPU + host memory |")
                    or l.startswith("| GPU node |")]
        self.assertEqual(len(gpu_rows), 2, measured_rows)
        unmeasured = [l for l in gpu_rows if "not measured: " in l]
        self.assertIn(len(unmeasured), (0, 2), gpu_rows)
        if os.environ.get("DLRM_REQUIRE_CUDA") == "1":
            self.assertEqual(unmeasured, [])
        for row in unmeasured:
            self.assertTrue("not measured: not built with CUDA" in row or
                            "not measured: no CUDA device" in row, row)
            self.assertNotRegex(row, r"\| [0-9]+ \[")
        # No projected row among the measured ones, and every projected row
        # says so.
        self.assertFalse(any("projected" in l for l in measured_rows))
        projected_rows = [l for l in lines[projected[0]:] if
                          l.startswith("| ") and not l.startswith("| hardware")
                          and not l.startswith("| ---")]
        self.assertEqual(len(projected_rows), 2)
        for row in projected_rows:
            self.assertIn("projected from measured stage times", row)

    def test_json(self):
        with open(os.path.join(self.dir, "dlrm_bench.json")) as f:
            doc = json.load(f)
        for key in ("git_commit", "machine", "config", "measured", "projected",
                    "stage_ms", "command"):
            self.assertIn(key, doc)
        self.assertTrue(doc["git_commit"])
        self.assertTrue(doc["machine"]["cpu_model"])
        self.assertGreater(doc["machine"]["cores"], 0)
        config = doc["config"]
        self.assertEqual(config["model"], "tiny")
        self.assertEqual(config["repeats"], 2)
        self.assertGreater(config["embedding_parameters"], 0)
        self.assertIn("tables", config["model_config"])
        available = [r for r in doc["measured"] if r.get("available", True)]
        unavailable = [r for r in doc["measured"]
                       if not r.get("available", True)]
        self.assertIn(len(unavailable), (0, 2))
        self.assertEqual(len(available), 6 - len(unavailable))
        for row in available:
            self.assertEqual(len(row["repetitions"]), 2)
            for v in row["repetitions"]:
                self.assertGreater(v, 0)
            s = row["samples_per_s"]
            self.assertLessEqual(s["min"], s["median"])
            self.assertLessEqual(s["median"], s["max"])
            self.assertGreater(s["min"], 0)
            self.assertGreater(row["speedup_over_cpu"], 0)
            self.assertNotIn("model_ms", row)
        self.assertEqual(available[0]["feed"], "server-side synthetic job")
        self.assertAlmostEqual(available[0]["speedup_over_cpu"], 1.0)
        for row in unavailable:
            self.assertNotIn("samples_per_s", row)
            self.assertIn(row["hardware"], ("1 GPU + host memory", "GPU node"))
            self.assertTrue(row["note"].startswith("not measured: "), row)
        self.assertGreater(sum(doc["stage_ms"]["one_process"].values()), 0)
        self.assertIn("input_dist", doc["stage_ms"]["rank0_of_multi_rank"])
        rows = doc["projected"]["rows"]
        self.assertEqual(len(rows), 2)
        for row in rows:
            self.assertGreater(row["samples_per_s"]["median"], 0)
            self.assertGreater(row["model_ms"]["step"], 0)
            for v in row["bytes_per_step"].values():
                self.assertGreater(v, 0)
            self.assertNotIn("repetitions", row)
        self.assertGreater(doc["projected"]["parameters"]["nvlink_gbps"], 0)

    def test_png(self):
        if not HAVE_CHART_TOOL:
            self.skipTest("neither gnuplot nor python3-matplotlib installed")
        path = os.path.join(self.dir, "dlrm_bench.png")
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], PNG_SIGNATURE)
        self.assertGreater(len(data), 5000)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
