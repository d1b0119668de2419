"""Runs a dlrm_server binary as a child process, for examples and tests."""

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time

_LISTENING = re.compile(
    r"^dlrm_server: listening on (\S+) metrics (\S+)\s*$")


def _die_with_parent():
    """In the child: ask Linux to SIGTERM the server if this process dies
    (even by SIGKILL), so a killed test never leaves a server behind."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class LocalServer:
    """Starts `binary` on a free port (--listen 127.0.0.1:0) and waits for
    its "dlrm_server: listening on HOST:PORT metrics HOST:PORT" line.

        with LocalServer("build/server/dlrm_server", config="tiny") as server:
            client = Client(server.address)

    stop() (or leaving the with block) sends SIGTERM, then SIGKILL after
    `stop_timeout` seconds. Raises RuntimeError when the server exits or
    stays silent for `start_timeout` seconds; the process is killed then.
    """

    def __init__(self, binary, config="tiny", checkpoint_dir=None,
                 data_dir=None, extra_args=(), start_timeout=60.0,
                 stop_timeout=10.0, env=None):
        self.binary = binary
        self.address = None
        self.metrics_address = None
        self.returncode = None
        self.output = []  # the server's stdout lines, for diagnostics
        self._stop_timeout = stop_timeout
        args = [binary, "--listen", "127.0.0.1:0",
                "--metrics-listen", "127.0.0.1:0", "--config", config]
        if checkpoint_dir is not None:
            args += ["--checkpoint-dir", checkpoint_dir]
        if data_dir is not None:
            args += ["--data-dir", data_dir]
        args += list(extra_args)
        self._process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, env=env if env is not None else os.environ.copy(),
            preexec_fn=_die_with_parent if sys.platform.startswith("linux")
            else None)
        self._ready = threading.Event()
        # Reads stdout to its end so a chatty server never blocks on a full
        # pipe.
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout
        while not self._ready.wait(0.05):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    "dlrm_server did not start (exit code %s); output:\n%s" %
                    (self.returncode, "\n".join(self.output)))

    def _read_stdout(self):
        for line in self._process.stdout:
            line = line.rstrip("\n")
            self.output.append(line)
            match = _LISTENING.match(line)
            if match and not self._ready.is_set():
                self.address, self.metrics_address = match.group(1, 2)
                self._ready.set()

    def stop(self):
        """Stops the server (SIGTERM, then SIGKILL); returns its exit code.
        Safe to call more than once."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=self._stop_timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self.returncode = self._process.returncode
        self._reader.join(timeout=5)
        return self.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
