#!/usr/bin/env python3
"""Checks of deploy/: the compose files, the image recipe and the binary agree.

No Docker engine runs in CI, so nothing here starts a container. Instead:
ComposeTest validates both compose files (docker-compose config, and the
topology: ranks, GPUs, ports, health, volumes); DryRunTest runs every
service's exact command line through `dlrm_server --dry-run` and checks the
Dockerfile's runtime packages against ldd; LauncherTest runs the CPU compose
topology as processes with deploy/launch_local.sh, trains, predicts and
stops it the way `docker compose stop` does.

Environment: DLRM_SERVER, DLRM_CLIENT (the built binaries; set by CTest).
"""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import yaml

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DEPLOY)
COMPOSE_FILES = {"gpu": "docker-compose.yml", "cpu": "docker-compose.cpu.yml"}
# Where the Dockerfile puts files the commands name, and their sources.
IMAGE_PATHS = {"/etc/dlrm/server.toml": os.path.join(DEPLOY, "server.toml")}
SERVER = os.environ.get("DLRM_SERVER",
                        os.path.join(ROOT, "build/server/dlrm_server"))
CLIENT = os.environ.get("DLRM_CLIENT",
                        os.path.join(ROOT, "build/clients/dlrm_client"))


def read_env(overrides=None):
    """deploy/.env as compose reads it, shell variables winning."""
    env = {}
    with open(os.path.join(DEPLOY, ".env")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key.strip()] = value.strip()
    for key in env:
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(overrides or {})
    return env


def interpolate(value, env):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR-default}."""
    def sub(m):
        name, op, default = m.group(1), m.group(2), m.group(3)
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")
    return re.sub(r"\$\{(\w+)(?:(:?-)([^}]*))?\}", sub, value)


def load_compose(kind, env_overrides=None):
    """The compose file with its variables resolved from deploy/.env."""
    env = read_env(env_overrides)

    def walk(node):
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str):
            return interpolate(node, env)
        return node
    with open(os.path.join(DEPLOY, COMPOSE_FILES[kind])) as f:
        return walk(yaml.safe_load(f))


def flags(command):
    """['--a=1', '--b', '2', '--c'] -> {'--a': '1', '--b': '2', '--c': None}."""
    out, i = {}, 0
    while i < len(command):
        arg = command[i]
        if "=" in arg:
            key, value = arg.split("=", 1)
        elif i + 1 < len(command) and not command[i + 1].startswith("--"):
            key, value = arg, command[i + 1]
            i += 1
        else:
            key, value = arg, None
        out[key] = value
        i += 1
    return out


def host_command(command):
    """The container command with image paths mapped to the repository."""
    out = []
    for arg in command:
        key, sep, value = arg.partition("=")
        out.append(key + sep + IMAGE_PATHS[value]
                   if sep and value in IMAGE_PATHS else arg)
    return out


def ranks(compose):
    return {int(flags(s["command"])["--rank"]): (name, s)
            for name, s in compose["services"].items()}


class ComposeTest(unittest.TestCase):
    def test_docker_compose_config_accepts_both_files(self):
        tool = shutil.which("docker-compose")
        if tool is None:
            self.skipTest("docker-compose is not installed (install-deps.sh)")
        for kind, name in COMPOSE_FILES.items():
            with self.subTest(kind):
                out = subprocess.run(
                    [tool, "-f", os.path.join(DEPLOY, name), "config"],
                    capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                resolved = yaml.safe_load(out.stdout)
                mine = load_compose(kind)
                for svc, spec in resolved["services"].items():
                    self.assertEqual(spec["command"],
                                     mine["services"][svc]["command"])

    def test_topology(self):
        for kind in COMPOSE_FILES:
            with self.subTest(kind):
                compose = load_compose(kind)
                by_rank = ranks(compose)
                world = len(by_rank)
                self.assertEqual(sorted(by_rank), list(range(world)))
                leader_name, leader = by_rank[0]
                coordinator = flags(leader["command"])["--coordinator"]
                for rank, (name, svc) in by_rank.items():
                    f = flags(svc["command"])
                    self.assertEqual(int(f["--world-size"]), world, name)
                    self.assertEqual(f["--coordinator"], coordinator, name)
                    # Peers dial the address a rank binds: its hostname.
                    self.assertEqual(f["--comm-bind-address"],
                                     svc["hostname"], name)
                    self.assertIn("--server-config", f)
                    self.assertEqual(svc["restart"], "on-failure")
                    self.assertTrue(svc["init"])
                    mounts = [v.split(":")[1] for v in svc["volumes"]]
                    self.assertIn("/var/lib/dlrm/checkpoints", mounts)
                    devices = (svc.get("deploy", {}).get("resources", {})
                               .get("reservations", {}).get("devices"))
                    if kind == "gpu":
                        self.assertEqual(devices[0]["device_ids"],
                                         [str(rank)], name)
                        self.assertIn("gpu", devices[0]["capabilities"])
                        self.assertIn("NCCL_SOCKET_IFNAME", svc["environment"])
                        self.assertIn("NCCL_DEBUG", svc["environment"])
                    else:
                        self.assertIsNone(devices, name)
                    if rank != 0:
                        self.assertNotIn("ports", svc, name)
                        self.assertTrue(svc["healthcheck"]["disable"])
                self.assertEqual(coordinator.rsplit(":", 1)[0],
                                 leader["hostname"])
                # rank0 is stopped first (it depends on every follower).
                self.assertEqual(sorted(leader["depends_on"]),
                                 sorted(n for r, (n, _) in by_rank.items()
                                        if r != 0))
                # Health probes the port dlrm_server listens on.
                with open(IMAGE_PATHS["/etc/dlrm/server.toml"]) as t:
                    listen = re.search(r'^listen = "(.*)"', t.read(),
                                       re.M).group(1)
                port = listen.rsplit(":", 1)[1]
                test = leader["healthcheck"]["test"]
                self.assertEqual(test[:3],
                                 ["CMD", "dlrm_server", "--health-check"])
                self.assertEqual(test[3], "127.0.0.1:" + port)
                published = [p.split(":")[-1] for p in leader["ports"]]
                self.assertIn(port, published)

    def test_env_example_matches_env(self):
        def keys(name):
            with open(os.path.join(DEPLOY, name)) as f:
                return sorted(l.split("=")[0] for l in f
                              if "=" in l and not l.startswith("#"))
        self.assertEqual(keys(".env"), keys(".env.example"))


class DryRunTest(unittest.TestCase):
    def test_every_service_command_passes_dry_run(self):
        for kind in COMPOSE_FILES:
            for rank, (name, svc) in sorted(ranks(load_compose(kind)).items()):
                with self.subTest(f"{kind}/{name}"):
                    cmd = [SERVER, "--dry-run"] + host_command(svc["command"])
                    out = subprocess.run(cmd, capture_output=True, text=True,
                                         timeout=30)
                    self.assertEqual(out.returncode, 0,
                                     f"{cmd}\n{out.stdout}{out.stderr}")
                    world = flags(svc["command"])["--world-size"]
                    self.assertIn(f"rank {rank} of {world}", out.stdout)
                    self.assertIn(f"sharding plan over {world} ranks",
                                  out.stdout)

    def test_dry_run_fails_where_a_run_would(self):
        _, svc = ranks(load_compose("gpu"))[1]
        bad = [a for a in host_command(svc["command"])
               if not a.startswith("--rank=")] + ["--rank=7"]
        out = subprocess.run([SERVER, "--dry-run"] + bad, capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn("--rank 7 is not in [0, --world-size", out.stderr)

    def test_health_check_probe_fails_without_a_server(self):
        out = subprocess.run([SERVER, "--health-check", "127.0.0.1:1"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1)

    def test_dockerfile_installs_every_runtime_library(self):
        if shutil.which("dpkg") is None or shutil.which("ldd") is None:
            self.skipTest("needs dpkg and ldd")
        with open(os.path.join(DEPLOY, "Dockerfile")) as f:
            text = f.read()
        runtime = text[text.index("AS runtime"):]
        self.assertIn("COPY deploy/server.toml /etc/dlrm/server.toml", runtime)
        self.assertIn("USER dlrm", runtime)
        listed = set(re.findall(r"\b(lib[\w.+-]+|zlib1g|ocl-icd-[\w-]+)\b",
                                runtime))
        in_base = {"libc6", "libgcc-s1", "libstdc++6"}
        libs = set()
        for binary in (SERVER, CLIENT):
            libs.update(re.findall(r"=> (/\S+)", subprocess.run(
                ["ldd", binary], capture_output=True, text=True).stdout))
        # One dpkg call for all (each call costs a fraction of a second);
        # a library may be owned under its link name or its real path.
        queries = {lib: {lib, os.path.realpath(lib)} for lib in libs}
        owners = subprocess.run(
            ["dpkg", "-S"] + sorted(set().union(*queries.values())),
            capture_output=True, text=True).stdout
        owner_of = {}
        for line in owners.splitlines():
            package, _, path = line.partition(": ")
            owner_of[path] = package.split(":")[0]
        for lib, paths in sorted(queries.items()):
            found = [owner_of[p] for p in paths if p in owner_of]
            if not found:
                # Not from Debian: the CUDA libraries of NVIDIA's
                # repository, installed under WITH_CUDA.
                self.assertIn("cuda", lib, lib)
            elif found[0] not in in_base:
                self.assertIn(found[0], listed, f"the binaries need {lib}")


class LauncherTest(unittest.TestCase):
    """The CPU compose topology as local processes (deploy/launch_local.sh),
    with rank 0's flags from the compose file; the tiny model keeps it fast
    (DLRM_CONFIG, as a user would set it for compose)."""

    def test_cpu_topology_trains_predicts_and_stops_in_order(self):
        compose = load_compose("cpu", {"DLRM_CONFIG": "tiny"})
        by_rank = ranks(compose)
        world = len(by_rank)
        work = tempfile.mkdtemp(prefix="deploy-test-")
        self.addCleanup(shutil.rmtree, work, True)
        # The launcher sets the rank flags, and container addresses and
        # paths mean nothing on this machine: those are replaced.
        replaced = {"--world-size": None, "--rank": None,
                    "--coordinator": None, "--comm-bind-address": None,
                    "--listen": "127.0.0.1:0",
                    "--metrics-listen": "127.0.0.1:0",
                    "--checkpoint-dir": f"{work}/checkpoints",
                    "--data-dir": work, "--threads": "1"}
        args = [a for a in host_command(by_rank[0][1]["command"])
                if a.split("=", 1)[0] not in replaced]
        args += [f"{k}={v}" for k, v in replaced.items() if v is not None]
        os.makedirs(f"{work}/checkpoints")
        env = dict(os.environ, DLRM_SERVER=SERVER,
                   DLRM_LOG_DIR=f"{work}/logs")
        launcher = subprocess.Popen(
            [os.path.join(DEPLOY, "launch_local.sh"), str(world)] + args,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=env, start_new_session=True)
        self.addCleanup(lambda: launcher.poll() is None and
                        os.killpg(launcher.pid, signal.SIGKILL))
        line = launcher.stdout.readline()
        launcher.stdout.close()
        self.assertIn("listening on", line, "no listening line")
        address = line.split()[3]

        health = subprocess.run([SERVER, "--health-check", address],
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(health.returncode, 0, health.stderr)
        self.assertIn("SERVING", health.stdout)
        train = subprocess.run(
            [CLIENT, "--server", address, "train", "--synthetic", "256",
             "--batch-size", "64", "--steps", "4"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(train.returncode, 0, train.stdout + train.stderr)
        sample = "\t".join(["1"] * 4 + ["0a"] * 3)
        predict = subprocess.run(
            [CLIENT, "--server", address, "predict", "-"], input=sample + "\n",
            capture_output=True, text=True, timeout=30)
        self.assertEqual(predict.returncode, 0, predict.stderr)
        probability = float(predict.stdout.split()[0])
        self.assertTrue(0 < probability < 1, predict.stdout)

        # `docker compose stop` signals rank0 first: it drains, saves
        # <checkpoint-dir>/final (checkpoint-on-exit in server.toml) and
        # shuts the followers down; every rank exits 0.
        launcher.send_signal(signal.SIGTERM)
        self.assertEqual(launcher.wait(timeout=60), 0)
        manifest = os.path.join(work, "checkpoints", "final", "MANIFEST.json")
        self.assertTrue(os.path.exists(manifest), manifest)


if __name__ == "__main__":
    unittest.main()
