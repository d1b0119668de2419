#!/usr/bin/env python3
"""The CPU image and the CPU compose file, run for real on a Docker daemon.

What a new user does after reading docs/deployment.md, checked step by step:
build the CPU image from deploy/Dockerfile (WITH_CUDA=0), bring
deploy/docker-compose.cpu.yml up with Debian 12's docker-compose (v1), wait
for rank0's health check, train a short dataset job through the published
gRPC port, predict, read /metrics on the published metrics port, start a
long job, `docker-compose stop` (every rank exits 0, `final` is written
with the job in it), `docker-compose up -d` again and check that the model
and the job resumed from `final` and train on. Then `docker-compose down -v`.

The daemon: the one DOCKER_HOST or /var/run/docker.sock names when it
answers, else one this test starts as root (Debian's dockerd, its own
--data-root, so that images and build layers stay cached between runs) and
stops at the end; one that an earlier, killed run left is used and stopped,
and emptied of its containers, volumes and networks (one run at a time:
the others wait on a lock). The base images: present ones are kept;
missing ones are pulled, and when no registry answers, made with
debootstrap from the mirror apt uses (the root file system cached as a
tarball under ~/.cache).

Exit status: 0 passed, 1 failed, 77 skipped (no daemon can run here: not
root and none reachable, or dockerd or a container fails to start; the
reason is printed).

Environment: DLRM_CLIENT (the built dlrm_client; set by CTest),
DLRM_WAIT_FOR_FILE (when set, the image build and the compose checks,
which drive DLRM_CLIENT, wait until this file exists: scripts/test.sh
starts this test before its build and creates the file when the build is
done),
DLRM_DOCKER_DATA_ROOT (the started daemon's --data-root, default
/var/lib/dlrm-docker-test), DLRM_DOCKER_CACHE (the base image tarball's
folder, default ~/.cache/dlrm-server), DLRM_DEBIAN_MIRROR (debootstrap's
mirror; default: the one apt uses for bookworm).
"""
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DEPLOY)
COMPOSE_FILE = os.path.join(DEPLOY, "docker-compose.cpu.yml")
CLIENT = os.environ.get("DLRM_CLIENT",
                        os.path.join(ROOT, "build/clients/dlrm_client"))
IMAGE = "dlrm-server:ctest-cpu"
BASE_IMAGES = ("debian:bookworm", "debian:bookworm-slim")
SKIP = 77
CHECKPOINTS = "/var/lib/dlrm/checkpoints"
# The daemon this test starts when none answers.
DATA_ROOT = os.environ.get("DLRM_DOCKER_DATA_ROOT",
                           "/var/lib/dlrm-docker-test")
EXEC_ROOT = "/run/dlrm-docker-test"
SOCKET = "/run/dlrm-docker-test.sock"
# Held for the whole run: one run at a time uses (and stops) that daemon.
LOCK = "/run/dlrm-docker-test.lock"
CACHE = os.environ.get("DLRM_DOCKER_CACHE",
                       os.path.expanduser("~/.cache/dlrm-server"))
# Seconds: a cold image build compiles dlrm_server on the machine's cores.
BUILD_TIMEOUT = 2400
# Seconds rank0 may take to turn healthy (its start_period is 180 s).
HEALTHY_TIMEOUT = 240

START = time.monotonic()


class Skip(Exception):
    """This machine cannot run a Docker daemon or its containers."""


class Failure(Exception):
    """A check failed."""


def log(message):
    print(f"[{time.monotonic() - START:7.1f}s] {message}", flush=True)


def run(cmd, timeout, check=True, env=None, input=None, quiet=False):
    """Runs cmd; a non-zero exit (with check) is a Failure with its output."""
    if not quiet:
        log("$ " + " ".join(cmd))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                             input=input, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''}: no end "
                      f"within {timeout} s\n{e.stdout or ''}{e.stderr or ''}")
    if check and out.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {out.returncode}\n"
                      f"{out.stdout}{out.stderr}")
    return out


def check(condition, message):
    """A Failure with message (a string, or a function making one) unless
    condition holds."""
    if not condition:
        raise Failure(message() if callable(message) else message)


def docker_binary():
    """Debian's docker CLI (docker.io) where installed, else the PATH's."""
    if os.path.exists("/usr/bin/docker"):
        return "/usr/bin/docker"
    return shutil.which("docker")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the daemon -------------------------------------------------------------

class Daemon:
    """A Docker daemon to talk to: a running one, or one started here."""

    def __init__(self, work):
        self.work = work
        self.docker = docker_binary()
        self.host = None       # the DOCKER_HOST value the clients use
        self.process = None    # the dockerd this test started, if any
        self.left_pid = None   # one an earlier, killed run left running
        self.log_path = os.path.join(work, "dockerd.log")

    @property
    def ours(self):
        """Whether this test started the daemon (and may clean it up)."""
        return self.process is not None or self.left_pid is not None

    def env(self):
        return dict(os.environ, DOCKER_HOST=self.host)

    def answers(self, host):
        if self.docker is None:
            return False
        out = subprocess.run([self.docker, "version", "-f",
                              "{{.Server.Version}}"],
                             capture_output=True, text=True, timeout=30,
                             env=dict(os.environ, DOCKER_HOST=host))
        return out.returncode == 0

    def start(self):
        for host in (os.environ.get("DOCKER_HOST"), f"unix://{SOCKET}",
                     "unix:///var/run/docker.sock"):
            if host and self.answers(host):
                self.host = host
                if host == f"unix://{SOCKET}":
                    with open(os.path.join(EXEC_ROOT, "dockerd.pid")) as f:
                        self.left_pid = int(f.read())
                    log(f"dockerd {self.left_pid}, left running by an "
                        "earlier run of this test: used, then stopped")
                else:
                    log(f"using the running Docker daemon at {host}")
                return
        if os.geteuid() != 0:
            raise Skip("no Docker daemon answers (DOCKER_HOST, "
                       "/var/run/docker.sock) and starting dockerd needs "
                       "root")
        dockerd = shutil.which("dockerd") or (
            "/usr/sbin/dockerd" if os.path.exists("/usr/sbin/dockerd")
            else None)
        if dockerd is None or self.docker is None:
            raise Failure("dockerd or docker not found: install Debian's "
                          "docker.io (scripts/install-deps.sh does)")
        os.makedirs(DATA_ROOT, exist_ok=True)
        os.makedirs(EXEC_ROOT, exist_ok=True)
        self.host = f"unix://{SOCKET}"
        cmd = [dockerd, "--data-root", DATA_ROOT, "--exec-root", EXEC_ROOT,
               "--pidfile", os.path.join(EXEC_ROOT, "dockerd.pid"),
               "--host", self.host]
        log("$ " + " ".join(cmd))
        with open(self.log_path, "w") as out:
            self.process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Skip(f"dockerd cannot run here (exit "
                           f"{self.process.returncode}):\n" + self.log_tail())
            if self.answers(self.host):
                info = run([self.docker, "info", "-f",
                            "{{.Driver}} cgroup v{{.CgroupVersion}}"],
                           60, env=self.env(), quiet=True)
                log(f"dockerd {self.process.pid} answers: storage driver "
                    f"{info.stdout.strip()}")
                return
            time.sleep(0.5)
        raise Skip("dockerd started but did not answer within 90 s:\n" +
                   self.log_tail())

    def log_tail(self, lines=30):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def remove_leftovers(self):
        """Empties this test's own daemon of what a killed earlier run left
        (containers, volumes, networks); its images stay as the cache."""
        if not self.ours:
            return
        env = self.env()
        containers = run([self.docker, "ps", "-aq"], 60, env=env,
                         quiet=True).stdout.split()
        if containers:
            run([self.docker, "rm", "-f"] + containers, 120, env=env)
        run([self.docker, "volume", "prune", "-f"], 120, env=env)
        run([self.docker, "network", "prune", "-f"], 120, env=env)

    def stop(self):
        """Stops the daemon this test started (none otherwise)."""
        if self.left_pid is not None:
            log(f"stopping dockerd {self.left_pid}")
            os.kill(self.left_pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while (os.path.exists(f"/proc/{self.left_pid}") and
                   time.monotonic() < deadline):
                time.sleep(0.5)
            return
        if self.process is None or self.process.poll() is not None:
            return
        log(f"stopping dockerd {self.process.pid}")
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


# ---- base images --------------------------------------------------------------

def apt_mirrors():
    """The mirror apt uses for bookworm and for bookworm-security."""
    main = os.environ.get("DLRM_DEBIAN_MIRROR")
    security = None
    out = subprocess.run(["apt-get", "indextargets", "--format",
                          "$(REPO_URI) $(CODENAME)"],
                         capture_output=True, text=True, timeout=60)
    for line in out.stdout.splitlines():
        uri, _, suite = line.partition(" ")
        if suite == "bookworm" and main is None:
            main = uri
        elif suite == "bookworm-security" and security is None:
            security = uri
    return (main or "http://deb.debian.org/debian",
            security or "http://deb.debian.org/debian-security")


def mounts_under(path):
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f
                if line.split()[1].startswith(path.rstrip("/") + "/")]


def debootstrap_tarball():
    """A minbase bookworm root file system as a tarball, cached in CACHE.

    Its apt sources are those of the official image (bookworm,
    bookworm-updates, bookworm-security), at the mirror apt uses here."""
    tarball = os.path.join(CACHE, "debian-bookworm-minbase.tar")
    if os.path.exists(tarball):
        log(f"base file system from the cache: {tarball}")
        return tarball
    if shutil.which("debootstrap") is None:
        raise Failure("no registry answers and debootstrap is not "
                      "installed: install Debian's debootstrap "
                      "(scripts/install-deps.sh does)")
    main, security = apt_mirrors()
    os.makedirs(CACHE, exist_ok=True)
    rootfs = tempfile.mkdtemp(prefix="bookworm-", dir=CACHE)
    try:
        run(["debootstrap", "--variant=minbase", "bookworm", rootfs, main],
            900)
        shutil.rmtree(os.path.join(rootfs, "var/lib/apt/lists"))
        os.makedirs(os.path.join(rootfs, "var/lib/apt/lists/partial"))
        for deb in os.listdir(os.path.join(rootfs, "var/cache/apt/archives")):
            if deb.endswith(".deb"):
                os.remove(os.path.join(rootfs, "var/cache/apt/archives", deb))
        os.remove(os.path.join(rootfs, "etc/apt/sources.list"))
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        with open(os.path.join(rootfs, "etc/apt/sources.list.d/"
                               "debian.sources"), "w") as f:
            f.write(f"Types: deb\nURIs: {main}\n"
                    "Suites: bookworm bookworm-updates\nComponents: main\n"
                    f"Signed-By: {keyring}\n\n"
                    f"Types: deb\nURIs: {security}\n"
                    "Suites: bookworm-security\nComponents: main\n"
                    f"Signed-By: {keyring}\n")
        check(not mounts_under(rootfs),
              f"debootstrap left mounts: {mounts_under(rootfs)}")
        run(["tar", "-C", rootfs, "--numeric-owner", "-cf",
             tarball + ".tmp", "."], 300)
        os.rename(tarball + ".tmp", tarball)
    finally:
        if not mounts_under(rootfs):
            shutil.rmtree(rootfs, ignore_errors=True)
    return tarball


def ensure_base_images(daemon):
    """debian:bookworm and debian:bookworm-slim, present in the daemon."""
    env = daemon.env()
    missing = [t for t in BASE_IMAGES
               if run([daemon.docker, "image", "inspect", t], 60, check=False,
                      env=env, quiet=True).returncode != 0]
    if not missing:
        log(f"base images present: {', '.join(BASE_IMAGES)}")
        return
    unpulled = []
    for tag in missing:
        pull = run([daemon.docker, "pull", tag], 600, check=False, env=env)
        if pull.returncode != 0:
            log(f"no pull: {pull.stderr.strip()}")
            unpulled.append(tag)
    if not unpulled:
        return
    # One minbase tree serves as both: Debian's official bookworm image is a
    # minbase tree too, and bookworm-slim the same without documentation
    # and locales.
    tarball = debootstrap_tarball()
    run([daemon.docker, "import", "-c", 'CMD ["bash"]', "-c",
         "LABEL org.dlrm-server.base=debootstrap-minbase", tarball,
         unpulled[0]], 300, env=env)
    for tag in unpulled[1:]:
        run([daemon.docker, "tag", unpulled[0], tag], 60, env=env)


# ---- the image ------------------------------------------------------------------

def build_image(daemon, work):
    """docker build of the CPU image, as docs/deployment.md says; replaces
    the previous build of IMAGE (its layers stay as the build cache)."""
    env = daemon.env()
    old = run([daemon.docker, "image", "inspect", "-f", "{{.Id}}", IMAGE], 60,
              check=False, env=env, quiet=True).stdout.strip()
    build_log = os.path.join(work, "docker-build.log")
    cmd = [daemon.docker, "build", "-f", os.path.join(DEPLOY, "Dockerfile"),
           "--build-arg", "WITH_CUDA=0", "-t", IMAGE, ROOT]
    log("$ " + " ".join(cmd))
    with open(build_log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.monotonic() + BUILD_TIMEOUT
        for line in proc.stdout:
            out.write(line)
            # The steps, and the compile's ccache hits (deploy/Dockerfile).
            if line.startswith("Step ") or line.startswith("ccache: "):
                log("  " + line.strip()[:110])
            if time.monotonic() > deadline:
                proc.kill()
        proc.wait()
    if proc.returncode != 0:
        with open(build_log) as f:
            tail = "".join(f.readlines()[-60:])
        raise Failure(f"docker build exited {proc.returncode}:\n{tail}")
    new = run([daemon.docker, "image", "inspect", "-f", "{{.Id}}", IMAGE], 60,
              env=env, quiet=True).stdout.strip()
    if old and old != new:
        run([daemon.docker, "image", "rm", old], 120, check=False, env=env)
    log(f"built {IMAGE} ({new[:19]})")


def check_image_user(daemon):
    """The image runs as dlrm, uid and gid 10001 (deploy/k8s assumes both).
    A container that cannot start at all means containers cannot run here."""
    out = run([daemon.docker, "run", "--rm", "--entrypoint", "id", IMAGE],
              120, check=False, env=daemon.env())
    if out.returncode != 0:
        raise Skip("the daemon runs but cannot start a container:\n" +
                   out.stderr)
    check(out.stdout.strip() == "uid=10001(dlrm) gid=10001(dlrm) "
          "groups=10001(dlrm)", f"the image's user: {out.stdout!r}")


# ---- the compose job --------------------------------------------------------------

class Compose:
    """deploy/docker-compose.cpu.yml as one project, through docker-compose."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.project = f"dlrmtest{os.getpid()}"
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        # deploy/.env supplies the rest; variables set here win over it.
        self.env = dict(daemon.env(), DLRM_IMAGE=IMAGE, DLRM_CONFIG="tiny",
                        DLRM_CPU_THREADS="1",
                        DLRM_GRPC_PORT=str(self.grpc_port),
                        DLRM_METRICS_PORT=str(self.metrics_port))
        self.server = f"127.0.0.1:{self.grpc_port}"
        self.containers = {}

    def up(self):
        """`docker-compose up -d`, then waits for rank0 to be healthy."""
        self("up", "-d")
        self.containers = {}
        self.wait_healthy()

    def __call__(self, *args, timeout=300, check=True):
        compose = shutil.which("docker-compose")
        if compose is None:
            raise Failure("docker-compose not found: install Debian's "
                          "docker-compose (scripts/install-deps.sh does)")
        return run([compose, "-f", COMPOSE_FILE, "-p", self.project] +
                   list(args), timeout, check=check, env=self.env)

    def container(self, service):
        if service not in self.containers:
            cid = self("ps", "-q", service).stdout.strip()
            check(cid, f"no container for {service}")
            self.containers[service] = cid
        return self.containers[service]

    def state(self, service, template):
        return run([self.daemon.docker, "inspect", "-f", template,
                    self.container(service)], 60, env=self.daemon.env(),
                   quiet=True).stdout.strip()

    def logs(self, service):
        return self("logs", "--no-color", service).stdout

    def wait_healthy(self):
        """Waits for rank0's compose health check to report healthy."""
        deadline = time.monotonic() + HEALTHY_TIMEOUT
        while time.monotonic() < deadline:
            status = self.state("rank0", "{{.State.Status}} "
                                "{{.State.Health.Status}}")
            if status == "running healthy":
                log("rank0 is healthy")
                return
            check(status.split()[0] in ("created", "running"),
                  lambda: f"rank0 is {status}:\n{self.logs('rank0')}")
            time.sleep(1)
        raise Failure(f"rank0 not healthy within {HEALTHY_TIMEOUT} s:\n"
                      f"{self.logs('rank0')}\n{self.logs('rank1')}")

    def in_volume(self, *cmd):
        """stdout of cmd run in the image with the checkpoints volume."""
        return run([self.daemon.docker, "run", "--rm", "-v",
                    f"{self.project}_checkpoints:{CHECKPOINTS}:ro",
                    "--entrypoint", cmd[0], IMAGE] + list(cmd[1:]), 120,
                   env=self.daemon.env()).stdout


def client(compose, *args, timeout=120):
    return run([CLIENT, "--server", compose.server] + list(args), timeout)


def job_status(compose, job_id):
    """(state, steps) of a job, from `dlrm_client job status`."""
    out = client(compose, "job", "status", job_id).stdout
    m = re.search(rf"job {job_id} (\w+)\s+steps (\d+)", out)
    check(m, f"no job line in: {out}")
    return m.group(1), int(m.group(2))


def wait_job_steps(compose, job_id, steps, timeout=180):
    """Waits until the running job has taken at least `steps` steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, done = job_status(compose, job_id)
        check(state == "RUNNING", f"job {job_id} is {state}")
        if done >= steps:
            return done
        time.sleep(0.5)
    raise Failure(f"job {job_id} did not reach step {steps} in {timeout} s")


def model_steps(compose):
    out = client(compose, "info").stdout
    m = re.search(r"steps: (\d+)\s+world size: (\d+)", out)
    check(m, f"no steps in: {out}")
    check(m.group(2) == "2", f"world size {m.group(2)}, not 2")
    return int(m.group(1))


def metrics(compose):
    url = f"http://127.0.0.1:{compose.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def exercise(compose):
    """Up, train, predict, metrics, stop, up again, resume: the checks."""
    compose.up()
    check("no checkpoint in" in compose.logs("rank0"),
          "the first start did not start afresh")
    # A short job, run to its end.
    first = 20
    out = client(compose, "job", "start", "--synthetic", "4096",
                 "--batch-size", "64", "--steps", str(first), "--wait",
                 timeout=300).stdout
    check(re.search(rf"SUCCEEDED\s+steps {first}\b", out),
          f"the short job did not succeed with {first} steps: {out}")
    check(model_steps(compose) == first, "the model did not take the steps")
    sample = "\t".join(["1"] * 4 + ["0a"] * 3)  # the tiny config's shape
    predict = run([CLIENT, "--server", compose.server, "predict", "-"], 60,
                  input=f"{sample}\n{sample}\n")
    probabilities = [float(x) for x in predict.stdout.split()]
    check(len(probabilities) == 2 and all(0 < p < 1 for p in probabilities),
          f"predict gave {predict.stdout!r}")
    text = metrics(compose)
    check(re.search(rf"^dlrm_model_steps {first}$", text, re.M),
          "/metrics has no dlrm_model_steps " + str(first))

    # A long job, stopped in the middle by `docker-compose stop`.
    out = client(compose, "job", "start", "--synthetic", "0",
                 "--batch-size", "64", "--steps", "1000000").stdout
    m = re.search(r"job (\S+) ", out)
    check(m, f"no job id in: {out}")
    job = m.group(1)
    wait_job_steps(compose, job, 30)
    compose("stop", timeout=240)
    for service in ("rank0", "rank1"):
        code = compose.state(service, "{{.State.ExitCode}}")
        check(code == "0", lambda: f"{service} exited {code}:\n"
              f"{compose.logs(service)[-3000:]}")
    final = json.loads(compose.in_volume(
        "cat", f"{CHECKPOINTS}/final/MANIFEST.json"))
    owners = compose.in_volume("stat", "-c", "%u:%g %n", f"{CHECKPOINTS}/final",
                               f"{CHECKPOINTS}/final/MANIFEST.json")
    check(all(line.startswith("10001:10001 ")
              for line in owners.splitlines()),
          f"final is not the image user's:\n{owners}")
    saved_job = final.get("job", {})
    check(saved_job.get("id") == job,
          f"final does not record the running job {job}: {final.get('job')}")
    step, job_steps = int(final["step"]), int(saved_job["steps"])
    check(step == first + job_steps,
          f"final is at step {step}, the jobs took {first} + {job_steps}")
    log(f"final: step {step}, job {job} at step {job_steps}")

    # A plain restart resumes from the newest checkpoint, the job included.
    compose.up()
    logs = compose.logs("rank0")
    check(f"resuming from {CHECKPOINTS}/final at step {step}" in logs,
          f"rank0 did not resume from final at step {step}:\n{logs[-3000:]}")
    check(re.search(rf"resuming job {job} at step {job_steps} ", logs),
          f"rank0 did not resume job {job} at step {job_steps}")
    check(model_steps(compose) >= step, "the model went back")
    after = wait_job_steps(compose, job, job_steps + 20)
    log(f"job {job} trains on: step {after} (was {job_steps} at the stop)")
    check(re.search(r"^dlrm_model_steps \d+$", metrics(compose), re.M),
          "/metrics does not answer after the restart")
    client(compose, "job", "cancel", job)


def wait_for_host_build():
    """Waits for DLRM_WAIT_FOR_FILE, when set (the host build, which makes
    DLRM_CLIENT, is done then)."""
    path = os.environ.get("DLRM_WAIT_FOR_FILE")
    if not path or os.path.exists(path):
        return
    log(f"waiting for {path} (the host build, which makes {CLIENT})")
    deadline = time.monotonic() + BUILD_TIMEOUT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise Failure(f"{path} did not appear within {BUILD_TIMEOUT} s")
        time.sleep(2)
    log("the host build is done")


def stopped(signum, frame):
    """SIGTERM (scripts/test.sh after a failed build): fail, so that the
    teardown stops the daemon this test started."""
    raise Failure(f"stopped by signal {signum}")


def main():
    signal.signal(signal.SIGTERM, stopped)
    if os.geteuid() == 0:
        lock = open(LOCK, "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another run holds {LOCK}: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
    work = tempfile.mkdtemp(prefix="docker-compose-test-")
    daemon = Daemon(work)
    compose = None
    try:
        daemon.start()
        daemon.remove_leftovers()
        ensure_base_images(daemon)
        # The image's compile would take the cores from the host build
        # (the daemon's containers are a cgroup of their own, which nice
        # does not hold back), so it waits for that build; the base images
        # (debootstrap: mostly waiting on the mirror) come beside it.
        wait_for_host_build()
        build_image(daemon, work)
        check_image_user(daemon)
        compose = Compose(daemon)
        exercise(compose)
        log("passed")
        return 0
    except Skip as e:
        print(f"SKIP: no Docker daemon can run here: {e}", flush=True)
        return SKIP
    except Failure as e:
        log(f"FAILED: {e}")
        return 1
    finally:
        try:
            if compose is not None:
                compose("down", "-v", "--remove-orphans", timeout=240,
                        check=False)
        except Failure as e:
            log(f"teardown: {e}")
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
