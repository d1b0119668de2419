"""The Python client against a dlrm_server started with --auth-token-file
and with --tls-cert/--tls-key (certificates made here by the openssl tool).
The server binary comes from $DLRM_SERVER (set by CTest)."""

import os
import shutil
import subprocess
import tempfile
import unittest

import grpc

from dlrm_client import Client, DlrmError, LocalServer, random_batch

TOKEN = "0123456789abcdef0123456789abcdef"


def _server_binary():
    binary = os.environ.get("DLRM_SERVER", "")
    if not binary or not os.access(binary, os.X_OK):
        raise unittest.SkipTest(
            "set DLRM_SERVER to a built dlrm_server (got %r)" % binary)
    return binary


class TokenTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        binary = _server_binary()
        cls.tmp = tempfile.mkdtemp(prefix="dlrm_security_test_")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        token_file = os.path.join(cls.tmp, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        cls.server = LocalServer(binary, config="tiny",
                                 extra_args=["--auth-token-file", token_file])
        cls.addClassCleanup(cls.server.stop)

    def test_admin_and_trainer_need_the_token(self):
        with Client(self.server.address) as anonymous:
            with self.assertRaises(DlrmError) as e:
                anonymous.info()
            self.assertEqual(e.exception.code,
                             grpc.StatusCode.UNAUTHENTICATED)
        with Client(self.server.address, auth_token=TOKEN) as client:
            config = client.config()
            results = client.train(
                [random_batch(config, 16, seed=s) for s in range(2)])
            self.assertEqual(len(results), 2)
        with Client(self.server.address, auth_token="x" * 32) as wrong:
            with self.assertRaises(DlrmError) as e:
                wrong.train([random_batch(config, 16)])
            self.assertEqual(e.exception.code,
                             grpc.StatusCode.UNAUTHENTICATED)

    def test_predict_is_open(self):
        with Client(self.server.address, auth_token=TOKEN) as client:
            config = client.config()
        batch = random_batch(config, 4, seed=3)
        with Client(self.server.address) as anonymous:
            self.assertEqual(len(anonymous.predict(batch=batch)), 4)


class TlsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        binary = _server_binary()
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("no openssl tool to make certificates")
        cls.tmp = tempfile.mkdtemp(prefix="dlrm_tls_test_")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
               "-nodes"]
        with open(os.path.join(cls.tmp, "san.cnf"), "w") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        for args in (
                ["req", "-x509"] + key + ["-keyout", "ca.key", "-out",
                                          "ca.pem", "-days", "2", "-subj",
                                          "/CN=dlrm-test-ca"],
                ["req"] + key + ["-keyout", "server.key", "-out",
                                 "server.csr", "-subj", "/CN=localhost"],
                ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem",
                 "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem",
                 "-days", "2", "-extfile", "san.cnf"]):
            subprocess.run(["openssl"] + args, cwd=cls.tmp, check=True,
                           capture_output=True)
        cls.server = LocalServer(binary, config="tiny", extra_args=[
            "--tls-cert", os.path.join(cls.tmp, "server.pem"),
            "--tls-key", os.path.join(cls.tmp, "server.key")])
        cls.addClassCleanup(cls.server.stop)

    def test_tls_client_connects_and_plaintext_does_not(self):
        with Client(self.server.address,
                    tls_ca=os.path.join(self.tmp, "ca.pem")) as client:
            self.assertEqual(client.info().config.num_dense_features, 4)
        with self.assertRaises(DlrmError) as e:
            Client(self.server.address, connect_timeout=1)
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_server_name_override(self):
        # The certificate names localhost and 127.0.0.1: checking it as
        # "localhost" passes, as another name fails the handshake.
        ca = os.path.join(self.tmp, "ca.pem")
        with Client(self.server.address, tls_ca=ca,
                    tls_server_name="localhost") as client:
            self.assertEqual(client.health(), "SERVING")
        with self.assertRaises(DlrmError) as e:
            Client(self.server.address, tls_ca=ca, connect_timeout=1,
                   tls_server_name="elsewhere.example")
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
