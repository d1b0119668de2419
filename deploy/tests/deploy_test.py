#!/usr/bin/env python3
"""Checks of deploy/: the compose files, the image recipe and the binary agree.

Nothing here needs a Docker engine or starts a container (the image and
the CPU compose file run for real in docker_compose_test.py). Instead:
ComposeTest validates both compose files (docker-compose config, and the
topology: ranks, GPUs, ports, health, volumes); DryRunTest runs every
service's exact command line (the image's checkpoint and data directories,
which dlrm_server checks at start, mapped to local ones) through
`dlrm_server --dry-run` and checks the
Dockerfile's runtime packages against ldd; LauncherTest runs the CPU compose
topology as processes with deploy/launch_local.sh, trains, predicts and
stops it the way `docker-compose stop` does. KubernetesTest renders the
manifests of deploy/k8s (kubectl kustomize, or this file's own renderer
where no kubectl can), checks their topology and runs every rank's command
line and environment through `dlrm_server --dry-run`. ReplicaTest checks
the inference replicas (docker-compose.replicas.yml, deploy/k8s/replicas)
follow the job's checkpoint directory and pass `--dry-run`.

Environment: DLRM_SERVER, DLRM_CLIENT (the built binaries; set by CTest).
"""
import atexit
import functools
import json
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


def interpolate_all(node, env):
    """`node` (a parsed compose file) with interpolate() applied to every
    string in it."""
    if isinstance(node, dict):
        return {k: interpolate_all(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate_all(v, env) for v in node]
    if isinstance(node, str):
        return interpolate(node, env)
    return node


def load_compose(kind, env_overrides=None):
    """The compose file with its variables resolved from deploy/.env."""
    env = read_env(env_overrides)
    with open(os.path.join(DEPLOY, COMPOSE_FILES[kind])) as f:
        return interpolate_all(yaml.safe_load(f), env)


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


# The image's checkpoint and data directories (server.toml's), which
# dlrm_server checks at start (--dry-run too), stand for these here.
LOCAL_DIRS = {"--checkpoint-dir": "checkpoints", "--data-dir": "data"}


@functools.lru_cache(maxsize=None)
def local_dir(name):
    parent = tempfile.mkdtemp(prefix="deploy-test-dirs-")
    atexit.register(shutil.rmtree, parent, True)
    path = os.path.join(parent, name)
    os.makedirs(path)
    return path


def host_command(command):
    """The container command with image paths mapped to the repository,
    and the image's checkpoint and data directories (on the command line
    or in the server config) mapped to local ones."""
    out = []
    reads_config = False
    for arg in command:
        key, sep, value = arg.partition("=")
        if sep and key in LOCAL_DIRS:
            out.append(key + "=" + local_dir(LOCAL_DIRS[key]))
            continue
        reads_config |= key == "--server-config"
        out.append(key + sep + IMAGE_PATHS[value]
                   if sep and value in IMAGE_PATHS else arg)
    if reads_config:
        given = {a.partition("=")[0] for a in out}
        out += [f"{k}={local_dir(v)}" for k, v in LOCAL_DIRS.items()
                if k not in given]
    return out


def ranks(compose):
    return {int(flags(s["command"])["--rank"]): (name, s)
            for name, s in compose["services"].items()}


def docker_compose_config(test, files):
    """`docker-compose config` of `files` (names in deploy/, in order),
    parsed; asserts that it succeeds. Skips `test` without docker-compose."""
    tool = shutil.which("docker-compose")
    if tool is None:
        test.skipTest("docker-compose is not installed (install-deps.sh)")
    args = [tool]
    for name in files:
        args += ["-f", os.path.join(DEPLOY, name)]
    out = subprocess.run(args + ["config"], capture_output=True, text=True,
                         timeout=60)
    test.assertEqual(out.returncode, 0, out.stderr)
    return yaml.safe_load(out.stdout)


class ComposeTest(unittest.TestCase):
    def test_docker_compose_config_accepts_both_files(self):
        for kind, name in COMPOSE_FILES.items():
            with self.subTest(kind):
                resolved = docker_compose_config(self, [name])
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
                        # One GPU per rank: the dense part on it, NCCL
                        # between the ranks' device tables.
                        self.assertEqual(f["--device"], "cuda", name)
                        self.assertEqual(f["--device-comm"], "nccl", name)
                        self.assertIn(f["--tf32"], ("on", "off"), name)
                    else:
                        self.assertIsNone(devices, name)
                        self.assertNotEqual(f.get("--device"), "cuda", name)
                        self.assertNotIn("--device-comm", f, name)
                        self.assertNotIn("--tf32", f, name)
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

        # `docker-compose stop` signals rank0 first: it drains, saves
        # <checkpoint-dir>/final (checkpoint-on-exit in server.toml) and
        # shuts the followers down; every rank exits 0.
        launcher.send_signal(signal.SIGTERM)
        self.assertEqual(launcher.wait(timeout=60), 0)
        manifest = os.path.join(work, "checkpoints", "final", "MANIFEST.json")
        self.assertTrue(os.path.exists(manifest), manifest)



# ---- Kubernetes (deploy/k8s) ----------------------------------------------

K8S = os.path.join(DEPLOY, "k8s")
# The job's variants (kustomizations) and the one with the shared volumes.
K8S_VARIANTS = ("cpu", "gpu")
K8S_STORAGE = "storage"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# The namespace the tests put the pods in.
K8S_NAMESPACE = "dlrm-test"
# The lists a strategic merge patch merges item by item, and their keys
# (what deploy/k8s patches; others are replaced whole, as kubectl does).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name",
              "volumes": "name", "volumeMounts": "mountPath",
              "ports": "containerPort"}


@functools.lru_cache(maxsize=None)
def kubectl_kustomize():
    """kubectl, when it has a kustomize that reads deploy/k8s; else None.

    Debian 12's kubernetes-client (kubectl 1.20, kustomize 2.0) does not
    know the `patches` field (kubectl >= 1.21 does)."""
    tool = shutil.which("kubectl")
    if tool is None:
        return None
    out = subprocess.run([tool, "version", "--client", "-o", "json"],
                         capture_output=True, text=True, timeout=60)
    try:
        version = json.loads(out.stdout)["clientVersion"]
        minor = int(re.match(r"\d+", version["minor"]).group(0))
    except (ValueError, KeyError, AttributeError):
        return None
    return tool if (int(version["major"]), minor) >= (1, 21) else None


def strategic_merge(base, patch, key=None):
    """`patch` merged into `base` as kubectl's strategic merge does for
    the fields deploy/k8s patches: maps recursively, MERGE_KEYS lists item
    by item (the patch's items first, then the base's others), null
    deletes, anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = strategic_merge(out[k], v, k) if k in out else v
        return out
    if (isinstance(base, list) and isinstance(patch, list)
            and key in MERGE_KEYS):
        mk = MERGE_KEYS[key]
        by_key = {item[mk]: item for item in base}
        patched = {item[mk] for item in patch}
        return ([strategic_merge(by_key[p[mk]], p) if p[mk] in by_key else p
                 for p in patch] +
                [item for item in base if item[mk] not in patched])
    return patch


def render_kustomization(path):
    """The objects of the kustomization in `path`, rendered without kubectl:
    `resources` (files and kustomization folders) and `patches` of
    strategic merge files. A field it does not know is an error, so that
    the fallback never checks something other than what kubectl renders."""
    with open(os.path.join(path, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - {"apiVersion", "kind", "resources", "patches"}
    if unknown:
        raise NotImplementedError(
            f"{path}/kustomization.yaml: {sorted(unknown)}: the test's "
            "renderer (deploy_test.py) does not know these; teach it")
    objects = []
    for resource in k.get("resources", []):
        full = os.path.join(path, resource)
        if os.path.isdir(full):
            objects += render_kustomization(full)
        else:
            with open(full) as f:
                objects += [o for o in yaml.safe_load_all(f) if o]
    for p in k.get("patches", []):
        if set(p) != {"path"}:
            raise NotImplementedError(f"{path}: patch {p}: only path: files")
        with open(os.path.join(path, p["path"])) as f:
            patch = yaml.safe_load(f)
        ident = (patch["kind"], patch["metadata"]["name"])
        targets = [i for i, o in enumerate(objects)
                   if (o["kind"], o["metadata"]["name"]) == ident]
        if len(targets) != 1:
            raise ValueError(f"{path}/{p['path']}: no single {ident} to patch")
        objects[targets[0]] = strategic_merge(objects[targets[0]], patch)
    return objects


def render_k8s(variant):
    """deploy/k8s/<variant> rendered, by kubectl where it can."""
    tool = kubectl_kustomize()
    path = os.path.join(K8S, variant)
    if tool is None:
        return render_kustomization(path)
    out = subprocess.run([tool, "kustomize", path], capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path}:\n{out.stderr}")
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def the_job(objects):
    jobs = by_kind(objects, "Job")
    assert len(jobs) == 1, f"one Job expected, found {sorted(jobs)}"
    return next(iter(jobs.values()))


def rank_container(job):
    containers = job["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "one container per rank pod"
    return containers[0]


def env_spec(container):
    return {e["name"]: e for e in container.get("env", [])}


def expand(value, env):
    """Kubernetes' $(VAR) in args and env values: a variable defined so far
    is replaced, `$$` is a `$`, anything else stays as written."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, value)


def pod_env(job, rank, pod_ip, namespace=K8S_NAMESPACE):
    """The environment the kubelet gives the container of the job's pod of
    completion index `rank`: its env entries in order, the downward API's
    fields filled in, plus what Kubernetes adds for an Indexed Job."""
    name = job["metadata"]["name"]
    fields = {
        "status.podIP": pod_ip,
        "metadata.namespace": namespace,
        "metadata.name": f"{name}-{rank}-x7k2p",
        f"metadata.annotations['{INDEX_KEY}']": str(rank),
        f"metadata.labels['{INDEX_KEY}']": str(rank),
    }
    env = {"JOB_COMPLETION_INDEX": str(rank), "HOSTNAME": f"{name}-{rank}"}
    for e in rank_container(job).get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields:
                raise AssertionError(f"{e['name']}: the test does not know "
                                     f"the downward API field {path}")
            env[e["name"]] = fields[path]
    return env


def clean_env(extra):
    """This process's environment without any launcher's variables (CTest
    may itself run under Slurm or mpirun), plus `extra`."""
    launcher = re.compile(r"^(SLURM_|OMPI_|PMIX_|RANK$|WORLD_SIZE$|"
                          r"LOCAL_RANK$|LOCAL_WORLD_SIZE$|MASTER_)")
    env = {k: v for k, v in os.environ.items() if not launcher.match(k)}
    env.update(extra)
    return env


def server_toml():
    """The image's /etc/dlrm/server.toml, as flags."""
    with open(IMAGE_PATHS["/etc/dlrm/server.toml"]) as f:
        return dict(re.findall(r'^([\w-]+) = "(.*)"', f.read(), re.M))


def port_of(address):
    return int(address.rsplit(":", 1)[1])


# Stands in for dlrm_server under launch_local.sh: records its
# CUDA_VISIBLE_DEVICES and arguments in $FAKE_OUT/rank-R.txt; once every
# rank has, rank 0 ends the job (the file "done") and every rank exits 0.
FAKE_SERVER = r"""#!/bin/bash
# The launcher's SIGTERM is an orderly stop, as for dlrm_server.
trap 'exit 0' TERM
rank=0
args=("$@")
for ((i = 0; i < $#; i++)); do
  [[ ${args[i]} == --rank ]] && rank=${args[i + 1]}
done
printf '%s\n' "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}" "$@" \
  >"$FAKE_OUT/rank-$rank.tmp"
mv "$FAKE_OUT/rank-$rank.tmp" "$FAKE_OUT/rank-$rank.txt"
for _ in $(seq 600); do
  if [[ $rank == 0 ]] &&
    (($(ls "$FAKE_OUT" | grep -c 'txt$') >= FAKE_WORLD)); then
    touch "$FAKE_OUT/done"
  fi
  [[ -e $FAKE_OUT/done ]] && exit 0
  sleep 0.05
done
exit 3
"""


class LaunchLocalGpuTest(unittest.TestCase):
    """launch_local.sh --gpus G: the GPU and the flags each rank process
    gets, recorded by a stand-in for dlrm_server (needs no GPU)."""

    def launch(self, launcher_args, world, server_args, visible=None):
        work = tempfile.mkdtemp(prefix="launch-gpu-test-")
        self.addCleanup(shutil.rmtree, work, True)
        fake = os.path.join(work, "fake_server")
        with open(fake, "w") as f:
            f.write(FAKE_SERVER)
        os.chmod(fake, 0o755)
        os.makedirs(f"{work}/out")
        env = dict(os.environ, DLRM_SERVER=fake, DLRM_LOG_DIR=f"{work}/logs",
                   FAKE_OUT=f"{work}/out", FAKE_WORLD=str(world))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        out = subprocess.run(
            [os.path.join(DEPLOY, "launch_local.sh")] + launcher_args +
            [str(world)] + server_args,
            capture_output=True, text=True, env=env, timeout=60)
        ranks = {}
        for r in range(world):
            path = f"{work}/out/rank-{r}.txt"
            if os.path.exists(path):
                with open(path) as f:
                    lines = f.read().splitlines()
                ranks[r] = (lines[0].split("=", 1)[1], lines[1:])
        return out, ranks

    def test_ranks_take_gpus_in_turn_and_the_device_comm_fits(self):
        # (G, N, expected GPUs by rank, expected --device-comm)
        cases = [(2, 4, ["0", "1", "0", "1"], "host-staged"),
                 (4, 2, ["0", "1"], "nccl"),
                 (3, 3, ["0", "1", "2"], "nccl"),
                 (1, 2, ["0", "0"], "host-staged"),
                 (1, 1, ["0"], "nccl")]
        for gpus, world, expected, comm in cases:
            with self.subTest(gpus=gpus, world=world):
                out, ranks = self.launch(["--gpus", str(gpus)], world,
                                         ["--config", "tiny"])
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertEqual(sorted(ranks), list(range(world)),
                                 out.stderr)
                for r, (visible, args) in ranks.items():
                    self.assertEqual(visible, expected[r], (r, args))
                    f = dict(zip(args[::2], args[1::2]))
                    self.assertEqual(f["--device"], "cuda")
                    self.assertEqual(f["--device-comm"], comm)
                    self.assertEqual(f["--rank"], str(r))
                    self.assertEqual(f["--world-size"], str(world))
                    self.assertEqual(f["--config"], "tiny")

    def test_gpus_come_from_the_launchers_visible_devices(self):
        out, ranks = self.launch(["--gpus", "2"], 3, [], visible="5,7,9")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([ranks[r][0] for r in range(3)], ["5", "7", "5"])
        out, _ = self.launch(["--gpus", "4"], 2, [], visible="5,7")
        self.assertEqual(out.returncode, 2)
        self.assertIn("CUDA_VISIBLE_DEVICES lists 2", out.stderr)

    def test_a_named_device_comm_is_kept(self):
        out, ranks = self.launch(
            ["--restart-on-failure", "0", "--gpus", "2"], 2,
            ["--device-comm", "host-staged"])
        self.assertEqual(out.returncode, 0, out.stderr)
        for r, (_, args) in ranks.items():
            self.assertEqual(args.count("--device-comm"), 1, args)
            self.assertEqual(args[args.index("--device-comm") + 1],
                             "host-staged")

    def test_without_gpus_the_environment_is_left_alone(self):
        out, ranks = self.launch([], 2, ["--config", "tiny"], visible="3")
        self.assertEqual(out.returncode, 0, out.stderr)
        for r, (visible, args) in ranks.items():
            self.assertEqual(visible, "3")
            self.assertNotIn("--device", args)
            self.assertNotIn("--device-comm", args)
        out, ranks = self.launch([], 1, [])
        self.assertEqual(ranks[0][0], "<unset>")

    def test_bad_gpu_counts_are_refused(self):
        for bad in (["--gpus", "0"], ["--gpus", "x"], ["--gpus"]):
            with self.subTest(bad=bad):
                out, ranks = self.launch(bad, 2, [])
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertIn("usage", out.stderr)
                self.assertEqual(ranks, {})


class KubernetesTest(unittest.TestCase):
    """deploy/k8s: what kubectl would apply, checked without a cluster.

    `kubectl apply --dry-run=client` cannot run here (it downloads the
    cluster's OpenAPI schema first), so nothing validates field names
    against the API: the tests check the fields the job depends on."""

    def rendered(self):
        return {v: render_k8s(v) for v in K8S_VARIANTS + (K8S_STORAGE,)}

    def test_kubectl_and_the_test_render_alike(self):
        tool = kubectl_kustomize()
        if tool is None:
            self.skipTest("needs kubectl >= 1.21 (kubectl kustomize); the "
                          "other tests render deploy/k8s themselves")
        for variant in K8S_VARIANTS + (K8S_STORAGE,):
            with self.subTest(variant):
                # kubectl orders the objects by kind; within them, the
                # same fields, values and list orders.
                def key(o):
                    return (o["kind"], o["metadata"]["name"])
                self.assertEqual(
                    sorted(render_k8s(variant), key=key),
                    sorted(render_kustomization(os.path.join(K8S, variant)),
                           key=key))

    def test_topology(self):
        rendered = self.rendered()
        claims = by_kind(rendered[K8S_STORAGE], "PersistentVolumeClaim")
        toml = server_toml()
        listen, metrics = port_of(toml["listen"]), port_of(toml["metrics-listen"])
        for variant in K8S_VARIANTS:
            with self.subTest(variant):
                objects = rendered[variant]
                # The volumes stay when the job is deleted.
                self.assertEqual(by_kind(objects, "PersistentVolumeClaim"), {})
                job = the_job(objects)
                spec, pod = job["spec"], job["spec"]["template"]["spec"]
                labels = job["spec"]["template"]["metadata"]["labels"]
                c = rank_container(job)
                env = env_spec(c)
                world = int(env["WORLD_SIZE"]["value"])
                self.assertEqual(spec["completionMode"], "Indexed")
                self.assertEqual(spec["completions"], world)
                self.assertEqual(spec["parallelism"], world)
                self.assertEqual(pod["restartPolicy"], "OnFailure")
                self.assertEqual(
                    env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
                    f"metadata.annotations['{INDEX_KEY}']")
                self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]
                                 ["fieldPath"], "status.podIP")
                self.assertIn("--comm-bind-address=$(POD_IP)", c["args"])
                # The image's entrypoint runs the args: dlrm_server.
                self.assertNotIn("command", c)
                with open(os.path.join(DEPLOY, "Dockerfile")) as f:
                    self.assertIn('ENTRYPOINT ["dlrm_server"]', f.read())

                # Rank 0 by its name in the headless Service.
                services = by_kind(objects, "Service")
                ranks_svc = services[pod["subdomain"]]
                self.assertEqual(ranks_svc["spec"]["clusterIP"], "None")
                self.assertTrue(ranks_svc["spec"]["publishNotReadyAddresses"])
                self.assertLessEqual(ranks_svc["spec"]["selector"].items(),
                                     labels.items())
                self.assertEqual(
                    env["MASTER_ADDR"]["value"],
                    f"{job['metadata']['name']}-0.{pod['subdomain']}"
                    ".$(POD_NAMESPACE).svc.cluster.local")
                coordinator = int(env["MASTER_PORT"]["value"])
                self.assertIn(coordinator, [p["port"] for p in
                                            ranks_svc["spec"]["ports"]])

                # The public Service selects rank 0's pod and nothing else.
                public = [s for n, s in services.items()
                          if n != pod["subdomain"]]
                self.assertEqual(len(public), 1)
                selector = dict(public[0]["spec"]["selector"])
                self.assertEqual(selector.pop(INDEX_KEY), "0")
                self.assertLessEqual(selector.items(), labels.items())
                container_ports = {p["name"]: p["containerPort"]
                                   for p in c["ports"]}
                targets = {container_ports.get(p["targetPort"], p["targetPort"])
                           for p in public[0]["spec"]["ports"]}
                self.assertEqual(targets, {listen, metrics})
                self.assertEqual(
                    public[0]["metadata"]["annotations"]["prometheus.io/port"],
                    str(metrics))
                self.assertIn(coordinator, container_ports.values())

                # One GPU per rank pod, none on the CPU variant.
                limits = c["resources"].get("limits", {})
                if variant == "gpu":
                    self.assertEqual(str(limits["nvidia.com/gpu"]), "1")
                    self.assertEqual(env["DLRM_DEVICE"]["value"], "cuda")
                    self.assertTrue(any(t["key"] == "nvidia.com/gpu"
                                        for t in pod["tolerations"]))
                else:
                    self.assertNotIn("nvidia.com/gpu", limits)
                    self.assertEqual(env["DLRM_DEVICE"]["value"], "cpu")
                self.assertEqual(str(c["resources"]["requests"]["cpu"]),
                                 env["DLRM_THREADS"]["value"])

                # Every rank mounts the same ReadWriteMany claims at the
                # checkpoint and data dirs of server.toml.
                volumes = {v["name"]: v for v in pod["volumes"]}
                mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
                for key in ("checkpoint-dir", "data-dir"):
                    claim = (volumes[mounts[toml[key]]]
                             ["persistentVolumeClaim"]["claimName"])
                    self.assertIn("ReadWriteMany",
                                  claims[claim]["spec"]["accessModes"], key)

                # Probes and the stop (what they run: test_probes_...).
                for probe in ("startupProbe", "readinessProbe",
                              "livenessProbe"):
                    self.assertEqual(c[probe]["exec"]["command"][:2],
                                     ["sh", "-c"], probe)
                    self.assertIn(f"--health-check 127.0.0.1:{listen}",
                                  c[probe]["exec"]["command"][2], probe)
                self.assertEqual(c["lifecycle"]["preStop"]["exec"]["command"]
                                 [:2], ["sh", "-c"])

    def run_hook(self, command, rank, world, stub):
        """Runs a probe's or hook's `sh -c` command as the kubelet would in
        rank `rank`'s container, with `stub` (a program recording its
        arguments) in place of dlrm_server and sleep. Its exit status and
        the argument lists the stubs got."""
        work = tempfile.mkdtemp(prefix="deploy-k8s-")
        self.addCleanup(shutil.rmtree, work, True)
        for name in ("dlrm_server", "sleep"):
            with open(os.path.join(work, name), "w") as f:
                f.write(f"#!/bin/sh\necho {name} \"$@\" >> {work}/calls\n"
                        f"exit {stub}\n")
            os.chmod(os.path.join(work, name), 0o755)
        env = clean_env({"RANK": str(rank), "WORLD_SIZE": str(world),
                         "PATH": work + os.pathsep + os.environ["PATH"]})
        out = subprocess.run(command, env=env, timeout=30)
        calls = []
        if os.path.exists(f"{work}/calls"):
            with open(f"{work}/calls") as f:
                calls = [line.split() for line in f]
        return out.returncode, calls

    def test_probes_ask_rank_0_and_pass_followers(self):
        listen = port_of(server_toml()["listen"])
        for variant in K8S_VARIANTS:
            job = the_job(render_k8s(variant))
            c = rank_container(job)
            world = job["spec"]["completions"]
            grace = job["spec"]["template"]["spec"][
                "terminationGracePeriodSeconds"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                with self.subTest(f"{variant}/{probe}"):
                    command = c[probe]["exec"]["command"]
                    # Rank 0: the probe is dlrm_server's health check, and
                    # its result (the stub's exit status 3) is the probe's.
                    status, calls = self.run_hook(command, 0, world, 3)
                    self.assertEqual(status, 3)
                    self.assertEqual(calls, [
                        ["dlrm_server", "--health-check",
                         f"127.0.0.1:{listen}"]])
                    # The real binary takes those flags (a probe of a port
                    # where nothing listens is a plain failure).
                    real = subprocess.run(
                        [SERVER] + calls[0][1:-1] + ["127.0.0.1:1"],
                        capture_output=True, text=True, timeout=30)
                    self.assertEqual(real.returncode, 1, real.stderr)
                    self.assertIn("health of 127.0.0.1:1", real.stderr)
                    # Followers serve nothing: they pass without asking.
                    for rank in range(1, world):
                        self.assertEqual(
                            self.run_hook(command, rank, world, 3), (0, []))
            with self.subTest(f"{variant}/preStop"):
                command = c["lifecycle"]["preStop"]["exec"]["command"]
                self.assertEqual(self.run_hook(command, 0, world, 0), (0, []))
                status, calls = self.run_hook(command, 1, world, 0)
                self.assertEqual(status, 0)
                self.assertEqual(len(calls), 1)
                self.assertEqual(calls[0][0], "sleep")
                # A follower's held-back SIGTERM, then its 10 s wait for
                # rank 0, end before the grace period's SIGKILL.
                self.assertLessEqual(int(calls[0][1]) + 10, grace - 5)

    def dry_run(self, job, rank, args=None):
        pod_ip = f"10.1.0.{rank + 11}"
        env = pod_env(job, rank, pod_ip)
        args = [expand(a, env) for a in
                (args or rank_container(job)["args"])]
        cmd = [SERVER, "--dry-run"] + host_command(args)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                             env=clean_env(env))
        return out, env, pod_ip, cmd

    def test_every_rank_passes_dry_run(self):
        for variant in K8S_VARIANTS:
            job = the_job(render_k8s(variant))
            world = job["spec"]["completions"]
            for rank in range(world):
                with self.subTest(f"{variant}/rank {rank}"):
                    out, env, pod_ip, cmd = self.dry_run(job, rank)
                    self.assertEqual(out.returncode, 0,
                                     f"{cmd}\n{out.stdout}{out.stderr}")
                    # Every $(VAR) names a variable defined before it (the
                    # kubelet leaves the others as written).
                    for value in list(env.values()) + cmd:
                        self.assertNotIn("$(", value)
                    pod = job["spec"]["template"]["spec"]
                    self.assertEqual(
                        env["MASTER_ADDR"],
                        f"{job['metadata']['name']}-0.{pod['subdomain']}."
                        f"{K8S_NAMESPACE}.svc.cluster.local")
                    coordinator = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
                    self.assertIn(
                        f"rank {rank} of {world} from the torchrun "
                        f"launcher's environment, coordinator {coordinator}",
                        out.stdout + out.stderr)
                    self.assertIn(f"rank {rank} of {world}\n", out.stdout)
                    self.assertIn(f"coordinator {coordinator} (", out.stdout)
                    self.assertIn(f"collectives bind {pod_ip} (Gloo",
                                  out.stdout)
                    self.assertIn(f"sharding plan over {world} ranks",
                                  out.stdout)
                    self.assertIn(f"device {env['DLRM_DEVICE']} ", out.stdout)
                    if rank == 0:
                        self.assertIn("gRPC listen 0.0.0.0:50051", out.stdout)
                        self.assertIn("(rank 0 hosts it", out.stdout)
                    else:
                        self.assertIn("serves nothing", out.stdout)
                    self.assertIn("(saves final/ on exit)", out.stdout)

    def test_dry_run_fails_where_the_pod_would(self):
        job = the_job(render_k8s("gpu"))
        args = rank_container(job)["args"]
        for bad in (args + ["--no-such-flag"],
                    # A variable the pod does not define stays as written.
                    args + ["--threads=$(NOT_IN_THE_POD)"]):
            with self.subTest(bad[-1]):
                out, _, _, _ = self.dry_run(job, 1, bad)
                self.assertNotEqual(out.returncode, 0, out.stdout)


REPLICAS_FILE = "docker-compose.replicas.yml"
K8S_REPLICAS = "replicas"


def load_replicas_compose():
    """docker-compose.replicas.yml with its variables resolved."""
    env = read_env()
    with open(os.path.join(DEPLOY, REPLICAS_FILE)) as f:
        raw = yaml.safe_load(f)
    return interpolate_all(raw, env)


class ReplicaTest(unittest.TestCase):
    """Inference replicas that follow training: the compose override and
    deploy/k8s/replicas, checked as the job's files are (docs/server.md
    "Replicas that follow training")."""

    def dry_run(self, args, follow_dir):
        args = [("--follow=" + follow_dir) if a.startswith("--follow=") else a
                for a in args]
        cmd = [SERVER, "--dry-run"] + host_command(args)
        return subprocess.run(cmd, capture_output=True, text=True,
                              timeout=30, env=clean_env({})), cmd

    def check_follows_the_job(self, args, mounts, job_checkpoint_dir):
        f = flags(args)
        self.assertIn("--inference-only", f)
        # Follows the directory the job checkpoints into, mounted read-only.
        self.assertEqual(f["--follow"], job_checkpoint_dir)
        self.assertIn((job_checkpoint_dir, True), mounts)
        # Listens where its health probe asks.
        self.assertEqual(port_of(f["--listen"]), 50051)
        with tempfile.TemporaryDirectory() as empty:
            out, cmd = self.dry_run(args, empty)
            self.assertEqual(out.returncode, 0,
                             f"{cmd}\n{out.stdout}{out.stderr}")
            self.assertIn("follow " + empty, out.stdout)
            self.assertIn("model: none yet", out.stdout)
        # Without --inference-only the same command is refused.
        bad = [a for a in args if a != "--inference-only"]
        out, _ = self.dry_run(bad, "/nonexistent")
        self.assertNotEqual(out.returncode, 0, out.stdout)
        self.assertIn("--follow needs --inference-only", out.stderr)

    def test_compose_replicas_follow_the_jobs_checkpoints(self):
        replicas = load_replicas_compose()["services"]
        self.assertEqual(list(replicas), ["replica"])
        svc = replicas["replica"]
        self.assertGreaterEqual(int(svc["deploy"]["replicas"]), 2)
        # N containers: no host port (they cannot share one).
        self.assertNotIn("ports", svc)
        mounts = []
        for v in svc["volumes"]:
            parts = v.split(":")
            mounts.append((parts[1], parts[2:] == ["ro"]))
        self.assertEqual(svc["healthcheck"]["test"],
                         ["CMD", "dlrm_server", "--health-check",
                          "127.0.0.1:50051"])
        for kind in COMPOSE_FILES:
            with self.subTest(kind):
                job = load_compose(kind)
                volume = svc["volumes"][0].split(":")[0]
                self.assertIn(volume, job["volumes"])
                rank0 = ranks(job)[0][1]
                self.assertIn(f"{volume}:{server_toml()['checkpoint-dir']}",
                              rank0["volumes"])
                self.check_follows_the_job(svc["command"], mounts,
                                           server_toml()["checkpoint-dir"])

    def test_docker_compose_config_accepts_the_override(self):
        for kind, name in COMPOSE_FILES.items():
            with self.subTest(kind):
                resolved = docker_compose_config(self, [name, REPLICAS_FILE])
                self.assertEqual(
                    resolved["services"]["replica"]["command"],
                    load_replicas_compose()["services"]["replica"]["command"])

    def test_kubernetes_replicas_follow_the_jobs_checkpoints(self):
        objects = render_k8s(K8S_REPLICAS)
        deployment = by_kind(objects, "Deployment")["dlrm-replica"]
        service = by_kind(objects, "Service")["dlrm-predict"]
        pod = deployment["spec"]["template"]
        labels = pod["metadata"]["labels"]
        self.assertEqual(deployment["spec"]["selector"]["matchLabels"],
                         labels)
        # Headless, over the replicas only: DNS names every Ready replica.
        self.assertEqual(service["spec"]["clusterIP"], "None")
        self.assertEqual(service["spec"]["selector"], labels)
        self.assertNotEqual(labels["app.kubernetes.io/component"], "rank")
        self.assertGreaterEqual(deployment["spec"]["replicas"], 2)
        container = pod["spec"]["containers"][0]
        claims = by_kind(render_k8s(K8S_STORAGE), "PersistentVolumeClaim")
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = []
        for m in container["volumeMounts"]:
            claim = volumes[m["name"]]["persistentVolumeClaim"]["claimName"]
            self.assertIn("ReadWriteMany", claims[claim]["spec"]["accessModes"])
            mounts.append((m["mountPath"], m.get("readOnly", False)))
        job = the_job(render_k8s("cpu"))
        job_mounts = {m["mountPath"]: m["name"]
                      for m in rank_container(job)["volumeMounts"]}
        job_volumes = {v["name"]: v for v in
                       job["spec"]["template"]["spec"]["volumes"]}
        checkpoint_dir = server_toml()["checkpoint-dir"]
        self.assertEqual(
            job_volumes[job_mounts[checkpoint_dir]]["persistentVolumeClaim"]
            ["claimName"],
            volumes[[m["name"] for m in container["volumeMounts"]
                     if m["mountPath"] == checkpoint_dir][0]]
            ["persistentVolumeClaim"]["claimName"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(container[probe]["exec"]["command"],
                             ["dlrm_server", "--health-check",
                              "127.0.0.1:50051"])
        self.check_follows_the_job(container["args"], mounts, checkpoint_dir)


if __name__ == "__main__":
    unittest.main()
