"""The compose stack on podman, as an operator without a Docker engine runs it.

What this machine lacks is made here: podman, debootstrap and runc from apt (as root), with the
name server of podman's network backend (without it a service cannot reach another by its name,
as compose services do), the podman-compose command from PyPI, and the base images Docker Hub
would serve. Where a registry answers, its images are pulled; where not, local stand-ins are
built from Debian's packages: `python:3.11-slim` from a debootstrap of bookworm (tagged with the
official name, so the project's unchanged `FROM python:3.11-slim` builds on it) and Prometheus
from Debian's `prometheus` package (under a name of its own, given to the compose service by an
override file). The project's image is built from its Dockerfile with pip's settings of this
machine passed as the Dockerfile's (empty by default) build arguments. Podman's own image store
keeps the base images and the build's layers between runs; a fresh machine builds them all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests import apt

REPO = Path(__file__).resolve().parents[2]
IMAGES = Path(__file__).resolve().parent / "images"
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
# The sandbox this project is tested in refuses to raise RLIMIT_NPROC/NOFILE inside a container:
# without fixed default ulimits every `podman run` and every RUN step fails in setrlimit.
ULIMITS_CONF = '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
PODMAN_COMPOSE = "podman-compose==1.6.0"
DEBIAN_BASE = "localhost/debian:bookworm-min"
PYTHON_BASE = "docker.io/library/python:3.11-slim"
PROMETHEUS_STAND_IN = "localhost/asteria-stand-in/prometheus:debian"
PULL_SECONDS = 90
BUILD_SECONDS = 1200


def run(argv: list[str], *, timeout: float = 300, check: bool = True,
        **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {done.returncode}:\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def lacking() -> str | None:
    """Installs what is missing (podman, debootstrap, runc, podman-compose, the ulimits
    setting); returns what could not be had, or None."""
    tools = {"podman": "podman", "debootstrap": "debootstrap", "runc": "runc"}
    absent = [pkg for tool, pkg in tools.items() if shutil.which(tool) is None]
    if absent:
        if not apt.can_install():
            return f"{', '.join(absent)} not installed, and apt-get needs root"
        failed = apt.install("--no-install-recommends", *absent, "ca-certificates")
        if failed:
            return failed
    name_server = network_name_server()
    if name_server is not None:
        if not apt.can_install():
            return f"{name_server} (names on podman's networks) is not installed, and " \
                   "apt-get needs root"
        failed = apt.install("--no-install-recommends", name_server)
        if failed:
            return failed
    if compose_command() is None:
        done = run([sys.executable, "-m", "pip", "install", PODMAN_COMPOSE], check=False,
                   timeout=600)
        if compose_command() is None:
            return f"podman-compose: `pip install {PODMAN_COMPOSE}` failed: {done.stderr[-800:]}"
    if not CONTAINERS_CONF.exists():
        if os.geteuid() != 0:
            return f"{CONTAINERS_CONF} (default_ulimits) is missing and writing it needs root"
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text(ULIMITS_CONF)
    return None


def network_name_server() -> str | None:
    """The Debian package that resolves container names on podman's networks for its backend
    (CNI: the dnsname plugin; netavark: aardvark-dns), if it is missing; None if present."""
    backend = run(["podman", "info", "--format", "{{.Host.NetworkBackend}}"],
                  timeout=60).stdout.strip()
    if backend == "cni":
        present = Path("/usr/lib/cni/dnsname").exists()
        return None if present else "golang-github-containernetworking-plugin-dnsname"
    present = shutil.which("aardvark-dns", path="/usr/lib/podman:/usr/libexec/podman") is not None
    return None if present else "aardvark-dns"


def compose_command() -> list[str] | None:
    exe = shutil.which("podman-compose", path=str(Path(sys.executable).parent))
    return [exe] if exe else None


def image_exists(name: str) -> bool:
    return run(["podman", "image", "exists", name], check=False, timeout=60).returncode == 0


def pulled(name: str) -> bool:
    """`name` in podman's store: there already, or pulled now (False where no registry
    answers within PULL_SECONDS)."""
    if image_exists(name):
        return True
    try:
        return run(["podman", "pull", "-q", name], check=False,
                   timeout=PULL_SECONDS).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 `URIs:` or one-line `deb` entries)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + \
        sorted(Path("/etc/apt/sources.list.d").glob("*.list")) + [Path("/etc/apt/sources.list")]
    for path in sources:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            urls = words[1:] if words[:1] == ["URIs:"] else \
                [w for w in words[1:] if w.startswith("http")] if words[:1] == ["deb"] else []
            for url in urls:
                if url.rstrip("/").endswith("/debian"):
                    return url
    return "http://deb.debian.org/debian"


def base_images(log) -> dict[str, str]:
    """The images the stack needs that the project does not build: {image: how it was had}."""
    how = {}
    if pulled(PYTHON_BASE):
        how[PYTHON_BASE] = "in podman's store or pulled"
    else:
        _debian_base(log)
        build(PYTHON_BASE, IMAGES / "python-slim.Containerfile", IMAGES)
        how[PYTHON_BASE] = f"built locally from {DEBIAN_BASE} (a stand-in tagged as official)"
    return how


def prometheus_image(official: str, log) -> tuple[str, str]:
    """(the image the prometheus service runs, how it was had)."""
    if pulled(official):
        return official, "in podman's store or pulled"
    if not image_exists(PROMETHEUS_STAND_IN):
        _debian_base(log)
        build(PROMETHEUS_STAND_IN, IMAGES / "prometheus.Containerfile", IMAGES)
    return PROMETHEUS_STAND_IN, "a local stand-in built from Debian's prometheus package"


def _debian_base(log) -> None:
    if image_exists(DEBIAN_BASE):
        return
    mirror = apt_mirror()
    log(f"debootstrap bookworm from {mirror}")
    with tempfile.TemporaryDirectory(prefix="asteria-rootfs-") as root:
        run(["debootstrap", "--variant=minbase", "bookworm", root, mirror], timeout=900)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        try:
            run(["podman", "import", "-", DEBIAN_BASE], stdin=tar.stdout, timeout=600)
        finally:
            tar.stdout.close()
            tar.wait(60)


def build(tag: str, containerfile: Path, context: Path, *extra: str) -> None:
    # Docker's image format, as `docker build` writes it: the OCI format has no HEALTHCHECK.
    run(["podman", "build", "--format", "docker", "--isolation", "chroot", "--network", "host",
         "-t", tag,
         "-f", str(containerfile), *extra, str(context)], timeout=BUILD_SECONDS)


@dataclass
class PipSettings:
    """This machine's pip settings, as the Dockerfile's build arguments and the read-only
    mounts that make their local folders visible inside the build."""

    args: dict[str, str]
    mounts: list[str]


def pip_settings() -> PipSettings:
    listed = run([sys.executable, "-m", "pip", "config", "list"], timeout=60).stdout
    values: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        values.setdefault(name, value.strip().strip("'\""))  # the first (env) wins, as in pip
    for name, env in (("find-links", "PIP_FIND_LINKS"), ("extra-index-url",
                                                        "PIP_EXTRA_INDEX_URL"),
                      ("cert", "PIP_CERT")):
        if os.environ.get(env):
            values[name] = os.environ[env]
    args, mounts = {}, set()
    for name, arg in (("find-links", "PIP_FIND_LINKS"), ("extra-index-url",
                                                        "PIP_EXTRA_INDEX_URL"),
                      ("cert", "PIP_CERT")):
        if not values.get(name):
            continue
        args[arg] = values[name]
        for item in values[name].split():
            path = Path(item.removeprefix("file://"))
            if path.is_absolute() and path.exists():
                top = Path(*path.parts[:3]) if name != "cert" else Path("/etc/ssl/certs")
                mounts.add(str(top))
    return PipSettings(args, sorted(mounts))


def torch_index_reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=15) as answer:
            return answer.status == 200
    except OSError:
        return False


def build_project(tag: str, build_args: dict[str, str], log) -> float:
    """The project's image from its Dockerfile, as `docker build` with the compose service's
    build arguments; where the Dockerfile's CPU torch index cannot be reached, PyPI stands in
    for it (pip takes the CPU wheel from the local wheel folder pip's settings name).
    Returns the seconds it took."""
    dockerfile = (REPO / "Dockerfile").read_text()
    default_index = next(line.split("=", 1)[1] for line in dockerfile.splitlines()
                         if line.startswith("ARG TORCH_CPU_INDEX="))
    pip = pip_settings()
    args = {**build_args, **pip.args}
    if not torch_index_reachable(default_index):
        args["TORCH_CPU_INDEX"] = "https://pypi.org/simple"
        log(f"{default_index} unreachable: TORCH_CPU_INDEX=https://pypi.org/simple")
    extra = [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
    extra += [a for m in pip.mounts for a in ("-v", f"{m}:{m}:ro")]
    log(f"podman build -t {tag} {' '.join(extra)} .")
    start = time.monotonic()
    build(tag, REPO / "Dockerfile", REPO, *extra)
    return time.monotonic() - start


@dataclass
class Stack:
    """One compose project (its own name, so its containers, network and volumes are its own)
    from docker-compose.yml plus an override file."""

    project: str
    override: Path
    env: dict[str, str]

    def compose(self, *args: str, timeout: float = 300, check: bool = True
                ) -> subprocess.CompletedProcess:
        argv = [*compose_command(), "-p", self.project, "-f", str(REPO / "docker-compose.yml"),
                "-f", str(self.override), *args]
        return run(argv, timeout=timeout, check=check, cwd=REPO,
                   env={**os.environ, **self.env})

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def health(self, service: str) -> str:
        """Runs the container's healthcheck once (podman schedules it with systemd timers,
        which a machine without systemd lacks) and returns its status."""
        run(["podman", "healthcheck", "run", self.container(service)], check=False, timeout=60)
        done = run(["podman", "inspect", self.container(service)], timeout=60)
        state = json.loads(done.stdout)[0]["State"]
        return (state.get("Health") or state.get("Healthcheck") or {}).get("Status", "")

    def exec(self, service: str, *argv: str, timeout: float = 120) -> str:
        return run(["podman", "exec", self.container(service), *argv], timeout=timeout).stdout

    def logs(self, service: str) -> str:
        done = run(["podman", "logs", self.container(service)], check=False, timeout=60)
        return (done.stdout + done.stderr)[-4000:]
