"""The operator stack under test: the compose services' own commands, started directly.

This machine has no Docker engine, so the tests read docker-compose.yml, interpolate it the way
Compose does, adapt what only makes sense inside the stack (ports, /data, service host names)
and start each command as a process: the trainer (`asteria serve`), Prometheus (Debian's
`prometheus` package, installed here when missing) with a test copy of deploy/prometheus, and
the dashboard. Under CI=true a missing component fails the tests; elsewhere it skips them loudly.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import apt
from tests.components import missing

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = REPO / "docker-compose.yml"
PROM_DIR = DEPLOY / "prometheus"
DASHBOARD_JSON = DEPLOY / "grafana" / "dashboards" / "asteria.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
VENV_BIN = Path(sys.executable).parent

# The trainer's default run, made small for two shared cores: a tiny model on one thread, an
# evaluation soon (so asteria_eval_loss exists), and enough steps to outlast the tests.
TINY_RUN = ["--model.n_layer", "2", "--model.n_head", "2", "--model.n_embd", "32",
            "--model.block_size", "32", "--data.batch_size", "4", "--train.threads", "1",
            "--train.eval_interval", "50", "--train.eval_batches", "2"]
COMPOSE_ENV = {"ASTERIA_TRAIN_STEPS": "100000"}
"""Environment the tests give Compose's interpolation (as an operator's .env would)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.25) -> Any:
    """Poll until predicate() is truthy and return it; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (httpx.HTTPError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}", pytrace=False)
        time.sleep(interval)


# ----------------------------------------------------------------------------- compose
_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[^}]+)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>.*))?$", re.S)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable interpolation: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?error}, ${VAR?error}."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        parts = _BRACED.match(m.group("braced") or m.group("plain"))
        assert parts, f"unsupported interpolation {m.group(0)!r}"
        name, op, arg = parts.group("name", "op", "arg")
        val = env.get(name)
        unset = val is None or (op is not None and op.startswith(":") and val == "")
        if op and op.endswith("-"):
            return arg if unset else val
        if op and op.endswith("?") and unset:
            raise ValueError(f"compose requires {name}: {arg}")
        return val or ""

    return _VAR.sub(one, value)


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """docker-compose.yml as Compose sees it: YAML merge keys resolved, variables interpolated."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return interpolate(raw, {**COMPOSE_ENV, **(env or {})})


@dataclass
class Service:
    """One compose service's command, environment and healthcheck, adapted to this machine."""

    name: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str]
    replacements: dict[str, str] = field(default_factory=dict)


def adapt(service: str, replacements: dict[str, str], *, env: dict[str, str] | None = None
          ) -> Service:
    """The service's command, environment and healthcheck with `replacements` applied."""
    spec = load_compose(env)["services"][service]
    pattern = re.compile("|".join(re.escape(k) for k in sorted(replacements, key=len,
                                                               reverse=True)))

    def sub(text: str) -> str:  # one pass: replaced text is never replaced again
        return pattern.sub(lambda m: replacements[m.group(0)], text)

    argv = [sub(a) for a in spec["command"]]
    environment = {k: sub(str(v)) for k, v in (spec.get("environment") or {}).items()}
    test = spec["healthcheck"]["test"]
    assert test[0] == "CMD", f"{service}: healthcheck should be exec form, got {test[0]}"
    return Service(service, argv, environment, [sub(a) for a in test[1:]], replacements)


# ----------------------------------------------------------------------------- processes
class Procs:
    """Every process the deploy tests start; all are ended when tests/deploy is done."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: Path = REPO) -> tuple[subprocess.Popen, Path]:
        log = self.logs / f"{name}.log"
        full_env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    **(env or {})}
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.started.append(proc)
        return proc, log

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            self.stop(proc)


def tail(log: Path, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else "(no log)"


@pytest.fixture(scope="package")
def procs(tmp_path_factory) -> Iterator[Procs]:
    p = Procs(tmp_path_factory.mktemp("deploy-logs"))
    yield p
    p.stop_all()


def run_healthcheck(service: Service, timeout: float = 60) -> None:
    """Run the compose healthcheck command until it exits 0 (as Docker would, repeatedly).

    `python` is this interpreter; a wget that this machine lacks (it is in the image) is done
    as the same GET with httpx.
    """
    argv = list(service.healthcheck)
    if argv[0] == "python":
        argv[0] = sys.executable

    def healthy() -> bool:
        if argv[0] == "wget" and shutil.which("wget") is None:
            url = next(a for a in argv if a.startswith("http"))
            return httpx.get(url, timeout=5).status_code == 200
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0

    wait_for(healthy, timeout, f"the healthcheck of {service.name}: {argv}", interval=0.5)


# ----------------------------------------------------------------------------- prometheus
@dataclass
class PromBins:
    prometheus: str
    promtool: str


def _find_prometheus() -> PromBins | None:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    return PromBins(prom, tool) if prom and tool else None


@pytest.fixture(scope="package")
def prom_bins() -> PromBins:
    """prometheus and promtool, installed from Debian's `prometheus` package when missing."""
    found = _find_prometheus()
    if found is None and apt.can_install():
        failed = apt.install("--no-install-recommends", "prometheus")
        if failed:
            print(failed)
        found = _find_prometheus()
    if found is None:
        missing("prometheus/promtool are not installed and `apt-get install prometheus` "
                "could not install them (needs root and Debian's package lists)")
    return found


@dataclass
class Trainer:
    url: str
    data_dir: Path
    service: Service
    log: Path

    @property
    def token(self) -> str:
        return (self.data_dir / "token").read_text().strip()

    def exposition(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text


@pytest.fixture(scope="package")
def trainer(procs, tmp_path_factory) -> Trainer:
    """The compose `trainer` service's command: the control plane with its default run."""
    port = free_port()
    data = tmp_path_factory.mktemp("asteria-store") / "data"
    service = adapt("trainer", {"0.0.0.0": "127.0.0.1", "8000": str(port), "/data": str(data)})
    proc, log = procs.start("trainer", service.argv + TINY_RUN, service.env)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"the trainer exited ({proc.returncode}):\n{tail(log)}", pytrace=False)
        r = httpx.get(f"{url}/healthz", timeout=5)
        return r.status_code == 200 and r.json().get("active_run") is not None

    wait_for(up, 120, "the trainer's /healthz with an active run")
    return Trainer(url, data, service, log)


@dataclass
class Prometheus:
    url: str
    config: Path
    service: Service
    log: Path

    def query(self, expr: str) -> list[dict]:
        r = httpx.post(f"{self.url}/api/v1/query", data={"query": expr}, timeout=10)
        body = r.json()
        assert body.get("status") == "success", f"{expr!r}: {body}"
        return body["data"]["result"]

    def query_range(self, expr: str, seconds: float = 120, step: str = "1s") -> list[dict]:
        end = time.time()
        r = httpx.post(f"{self.url}/api/v1/query_range", timeout=10, data={
            "query": expr, "start": end - seconds, "end": end, "step": step})
        body = r.json()
        assert body.get("status") == "success", f"{expr!r}: {body}"
        return body["data"]["result"]


TEST_SCRAPE_INTERVAL = "1s"


def test_prometheus_config(source: Path, dest: Path, *, trainer_target: str,
                           self_target: str) -> Path:
    """A copy of deploy/prometheus with the trainer's address and a 1 s interval.

    Only the scrape targets and intervals change; the rules and the file_sd folder are the
    project's own. The dcgm job is dropped: no dcgm-exporter runs on this machine.
    """
    shutil.copytree(source, dest)
    config_path = dest / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    config["global"].update(scrape_interval=TEST_SCRAPE_INTERVAL, scrape_timeout="1s",
                            evaluation_interval=TEST_SCRAPE_INTERVAL)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["asteria"]["static_configs"][0]["targets"] = [trainer_target]
    jobs["prometheus"]["static_configs"][0]["targets"] = [self_target]
    config["scrape_configs"] = [job for name, job in jobs.items() if name != "dcgm"]
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path


test_prometheus_config.__test__ = False  # a helper, not a test


@pytest.fixture(scope="package")
def prometheus(procs, prom_bins, trainer, tmp_path_factory) -> Prometheus:
    """Prometheus from the compose service's command, scraping the trainer every second."""
    root = tmp_path_factory.mktemp("prometheus")
    return start_prometheus(procs, prom_bins, root, trainer.url.removeprefix("http://"))


def start_prometheus(procs, prom_bins, root: Path, trainer_target: str, port: int = 0,
                     name: str = "prometheus") -> Prometheus:
    """The compose service's Prometheus on a test copy of deploy/prometheus in root/etc,
    scraping `trainer_target` (and the file_sd targets in root/etc/targets) every second."""
    port = port or free_port()
    config = test_prometheus_config(
        PROM_DIR, root / "etc", trainer_target=trainer_target,
        self_target=f"127.0.0.1:{port}")
    check = subprocess.run([prom_bins.promtool, "check", "config", str(config)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, f"the test copy of the config:\n{check.stdout}{check.stderr}"
    service = adapt("prometheus", {
        "/etc/prometheus/prometheus.yml": str(config), "/prometheus": str(root / "tsdb"),
        "--web.listen-address=:9090": f"--web.listen-address=127.0.0.1:{port}",
        "9090": str(port)})
    proc, log = procs.start(name, [prom_bins.prometheus, *service.argv])
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited ({proc.returncode}):\n{tail(log)}", pytrace=False)
        return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200

    wait_for(ready, 60, "prometheus /-/ready")
    return Prometheus(url, config, service, log)
