"""docker-compose.yml and the Dockerfile: the Compose Specification's schema accepts the file,
the stack has the shape operators rely on, and the services' own commands answer their
healthchecks when started directly (this machine has no Docker engine)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import httpx
import pytest

from asteria_core.compat import tomllib
from tests.components import missing
from tests.deploy.conftest import (
    COMPOSE_FILE,
    REPO,
    VENV_BIN,
    adapt,
    free_port,
    load_compose,
    run_healthcheck,
    tail,
    wait_for,
)

COMPOSE = load_compose()
SERVICES = COMPOSE["services"]
GPU_SERVICES = {"trainer-gpu", "dcgm-exporter"}
DOCKERFILE = (REPO / "Dockerfile").read_text()


def test_compose_file_validates_against_the_compose_spec():
    exe = shutil.which("check-jsonschema", path=str(VENV_BIN)) or shutil.which("check-jsonschema")
    if exe is None:
        missing("check-jsonschema is not installed (pip install -e '.[dev]')")
    done = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_stack_has_its_services_and_gpu_parts_only_in_the_gpu_profile():
    assert set(SERVICES) == {"trainer", "dashboard", "prometheus", "grafana"} | GPU_SERVICES
    for name, spec in SERVICES.items():
        gpu = name in GPU_SERVICES
        assert (spec.get("profiles") == ["gpu"]) == gpu, f"{name}: profiles {spec.get('profiles')}"
        reservations = str(spec.get("deploy", {}).get("resources", {}).get("reservations", {}))
        assert ("nvidia" in reservations) == gpu, f"{name}: GPU reservations outside profile gpu"
    # The GPU trainer stands in for the CPU one under the same name on the stack's network.
    assert SERVICES["trainer-gpu"]["networks"]["default"]["aliases"] == ["trainer"]
    assert SERVICES["trainer-gpu"]["command"] == SERVICES["trainer"]["command"]
    assert SERVICES["trainer-gpu"]["volumes"] == SERVICES["trainer"]["volumes"]


def test_every_service_has_a_healthcheck_and_dependents_wait_for_it():
    for name, spec in SERVICES.items():
        check = spec.get("healthcheck", {})
        assert check.get("test", [None])[0] == "CMD", f"{name}: exec-form healthcheck"
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name
    deps = SERVICES["dashboard"]["depends_on"]
    assert deps["trainer"] == {"condition": "service_healthy"}
    assert deps["trainer-gpu"] == {"condition": "service_healthy", "required": False}
    assert SERVICES["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_ports_are_bound_to_loopback_by_default():
    for name, spec in SERVICES.items():
        for port in spec.get("ports", []):
            assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+", port), f"{name}: {port}"
    exposed = load_compose({"ASTERIA_BIND": "0.0.0.0"})["services"]["grafana"]["ports"]
    assert exposed == ["0.0.0.0:3000:3000"]


def test_named_volumes_hold_the_state():
    assert set(COMPOSE["volumes"]) == {"asteria-store", "asteria-checkpoints",
                                       "prometheus-data", "grafana-data"}
    mounts = {name: dict(v.split(":")[:2] for v in spec.get("volumes", []))
              for name, spec in SERVICES.items()}
    assert mounts["trainer"] == {"asteria-store": "/data", "asteria-checkpoints": "/data/runs"}
    assert mounts["prometheus"]["prometheus-data"] == "/prometheus"
    assert mounts["grafana"]["grafana-data"] == "/var/lib/grafana"
    assert "asteria-store:/data:ro" in SERVICES["dashboard"]["volumes"]
    for name, table in mounts.items():  # bind mounts point at files in this repository
        for source in table:
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name}: {source} does not exist"


def test_images_are_built_from_the_projects_dockerfile():
    for name in ("trainer", "trainer-gpu", "dashboard"):
        assert SERVICES[name]["build"]["context"] == ".", name
    assert SERVICES["trainer"]["build"]["args"]["TORCH_VARIANT"] == "cpu"
    assert SERVICES["dashboard"]["image"] == SERVICES["trainer"]["image"]
    assert SERVICES["trainer-gpu"]["build"]["args"]["TORCH_VARIANT"] == "cuda"
    assert re.search(r"^ARG TORCH_VARIANT=cpu$", DOCKERFILE, re.M), "CPU torch by default"
    torch_spec = re.search(r'^ARG TORCH_SPEC="([^"]+)"$', DOCKERFILE, re.M).group(1)
    pyproject = re.search(r'^\s*"(torch[<>=!~].*?)",', (REPO / "pyproject.toml").read_text(),
                          re.M).group(1)
    assert torch_spec == pyproject, f"Dockerfile {torch_spec!r}, pyproject.toml {pyproject!r}"
    copied = re.findall(r"^COPY (\S+)", DOCKERFILE, re.M)
    for path in copied:
        assert (REPO / path).exists(), f"the Dockerfile copies missing {path}"
    # Every package pyproject.toml installs is copied: `asteria` holds the command the image runs.
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    packages = {name.rstrip("*") for name in include}
    assert packages <= set(copied), f"the Dockerfile does not copy {packages - set(copied)}"
    assert re.search(r'^CMD \["asteria", "serve"', DOCKERFILE, re.M)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


def test_trainer_command_answers_its_healthcheck(trainer):
    """The compose trainer command (started by the fixture) passes the compose healthcheck."""
    assert trainer.service.argv[:2] == ["asteria", "serve"]
    run_healthcheck(trainer.service, timeout=30)
    assert (trainer.data_dir / "token").is_file(), "the trainer writes its token to the store"


def test_dashboard_command_answers_its_healthcheck(procs, trainer):
    """The compose dashboard command with its environment, pointed at the trainer."""
    port = free_port()
    service = adapt("dashboard", {"0.0.0.0": "127.0.0.1", "8501": str(port),
                                  "http://trainer:8000": trainer.url,
                                  "/data": str(trainer.data_dir)})
    assert service.argv[:3] == ["python", "-m", "streamlit"]
    assert service.env["ASTERIA_TOKEN_FILE"] == str(trainer.data_dir / "token")
    proc, log = procs.start("dashboard", [sys.executable, *service.argv[1:]], service.env)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"the dashboard exited ({proc.returncode}):\n{tail(log)}",
                            pytrace=False)
            return httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=5).text == "ok"

        wait_for(up, 60, "the dashboard's /_stcore/health")
        run_healthcheck(service, timeout=30)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
    finally:
        procs.stop(proc)
