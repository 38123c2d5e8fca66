"""The image built from the Dockerfile and the stack brought up from docker-compose.yml, on
podman with podman-compose (tests/deploy/podman_stack.py makes what this machine lacks).

Each check is printed as `CHECK <name>: ok (...)` (shown with `pytest -rP`): the trainer's
healthcheck turns healthy; the dashboard reaches the trainer by its service name; Prometheus
scrapes the trainer; a PATCH through the published port takes effect; the trainer's container,
recreated, keeps the token and the run on the named volumes; the run resumes from its checkpoint
with its policy change. Grafana is not started where its image cannot be pulled (its
provisioning is checked by test_grafana.py); Prometheus runs a local stand-in image where prom's
cannot be pulled. Everything the test starts is removed at the end (`down -v`).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

from tests.components import missing
from tests.deploy import podman_stack
from tests.deploy.conftest import free_port, load_compose, wait_for

pytestmark = pytest.mark.slow
STALENESS = 3
"""The policy change the test makes (the default run's bound is larger)."""


class Checks:
    """Prints each check by name with what it found, and the time since the test began."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f} s] {text}", flush=True)

    def ok(self, name: str, found: str) -> None:
        self.log(f"CHECK {name}: ok ({found})")


def api(port: int, token: str = "") -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30)


def until(predicate: Callable[[], Any], seconds: float, what: str) -> Any:
    return wait_for(predicate, seconds, what, interval=1.0)


@pytest.mark.timeout(2400)
def test_the_compose_stack_builds_and_runs_on_podman(tmp_path):
    checks = Checks()
    why = podman_stack.lacking()
    if why:
        missing(why)
    compose = load_compose()["services"]

    for image, how in podman_stack.base_images(checks.log).items():
        checks.log(f"base image {image}: {how}")
    prometheus, how = podman_stack.prometheus_image(compose["prometheus"]["image"],
                                                  checks.log)
    checks.log(f"prometheus image {prometheus}: {how}")
    tag = compose["trainer"]["image"]
    seconds = podman_stack.build_project(tag, compose["trainer"]["build"]["args"], checks.log)
    checks.ok("image built from the Dockerfile", f"{tag} in {seconds:.0f} s")
    version = podman_stack.run(["podman", "run", "--rm", tag, "asteria", "--help"]).stdout
    assert "asteria serve" in version
    checks.ok("the image runs `asteria`", "asteria --help")

    grafana = compose["grafana"]["image"]
    checks.log(f"grafana: not started (image {grafana} "
               f"{'present' if podman_stack.image_exists(grafana) else 'cannot be pulled here'}"
               "); its provisioning is checked by tests/deploy/test_grafana.py")
    override = tmp_path / "compose.override.yml"
    override.write_text(yaml.safe_dump({"services": {"prometheus": {"image": prometheus}}}))
    ports = {"ASTERIA_TRAINER_PORT": free_port(), "ASTERIA_DASHBOARD_PORT": free_port(),
             "PROMETHEUS_PORT": free_port()}
    stack = podman_stack.Stack(f"asteria-test-{secrets.token_hex(3)}", override,
                               {k: str(v) for k, v in ports.items()})
    trainer_port, prom_port = ports["ASTERIA_TRAINER_PORT"], ports["PROMETHEUS_PORT"]
    try:
        stack.compose("up", "-d", "trainer", "dashboard", "prometheus", timeout=600)
        checks.log(f"podman-compose up -d trainer dashboard prometheus (project {stack.project})")
        _checks(stack, checks, trainer_port, prom_port)
    except BaseException:
        for service in ("trainer", "dashboard", "prometheus"):
            print(f"--- {service} logs\n{stack.logs(service)}")
        raise
    finally:
        stack.compose("down", "-v", timeout=600, check=False)
        checks.log("podman-compose down -v: containers, network and volumes removed")


def _checks(stack: podman_stack.Stack, checks: Checks, trainer_port: int, prom_port: int) -> None:
    until(lambda: stack.health("trainer") == "healthy", 300, "the trainer's healthcheck")
    checks.ok("trainer healthcheck healthy", "podman healthcheck run: healthy")
    token = stack.exec("trainer", "cat", "/data/token").strip()
    public = api(trainer_port)
    run_id = until(lambda: public.get("/healthz").json().get("active_run"), 120,
                   "the default run")

    # The dashboard's own client, with the dashboard container's settings (ASTERIA_URL names
    # the service; the token is read from the store volume, mounted read-only).
    until(lambda: stack.health("dashboard") == "healthy", 300, "the dashboard's healthcheck")
    seen = json.loads(stack.exec("dashboard", "python", "-c", (
        "import json\n"
        "from dashboard.client import Client\n"
        "from dashboard.state import env_token, env_url\n"
        "token, _ = env_token()\n"
        "client = Client(env_url(), token)\n"
        "print(json.dumps({'url': client.url, 'token': bool(token),\n"
        "                  'runs': [r['id'] for r in client.runs()]}))")).splitlines()[-1])
    assert seen["url"] == "http://trainer:8000" and seen["token"], seen
    assert run_id in seen["runs"], seen
    checks.ok("dashboard reaches the trainer by its service name",
              f"{seen['url']} lists run {run_id}; dashboard healthcheck healthy")

    def scraped() -> list:
        answer = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/query", timeout=10, params={
            "query": f'asteria_run_info{{job="asteria",instance="trainer:8000",'
                     f'run_id="{run_id}"}}'}).json()
        return answer["data"]["result"]

    until(scraped, 120, "Prometheus's scrape of trainer:8000")
    until(lambda: stack.health("prometheus") == "healthy", 120, "Prometheus's healthcheck")
    checks.ok("Prometheus scrapes the trainer",
              f"asteria_run_info{{instance=\"trainer:8000\",run_id=\"{run_id}\"}} on :{prom_port}")

    operator = api(trainer_port, token)
    accepted = operator.patch(f"/runs/{run_id}/policy", json={"staleness_bound": STALENESS})
    assert accepted.status_code == 200, accepted.text
    version = accepted.json()["version"]

    def applied() -> bool:
        history = public.get(f"/runs/{run_id}/policy/history").json()
        change = next(c for c in history if c["version"] == version)
        return change["applied_at"] is not None and \
            public.get(f"/runs/{run_id}/policy").json()["policy"]["staleness_bound"] == STALENESS

    until(applied, 300, "the PATCH in force")
    checks.ok("PATCH through the published port takes effect",
              f"staleness_bound {STALENESS}, policy version {version}, applied")
    stopped_at = public.get(f"/runs/{run_id}").json()["step"]

    # A new container on the same named volumes (stopped with the service's grace period).
    stack.compose("up", "-d", "--force-recreate", "trainer", timeout=600)
    until(lambda: stack.health("trainer") == "healthy", 300, "the recreated trainer")
    assert stack.exec("trainer", "cat", "/data/token").strip() == token
    row = until(lambda: public.get(f"/runs/{run_id}").json(), 60, "the run after the restart")
    assert row["status"] == "stopped" and row["checkpoint_step"] >= stopped_at, row
    history = public.get(f"/runs/{run_id}/policy/history").json()
    assert [c["diff"] for c in history if c["version"] == version] == \
        [{"staleness_bound": [10, STALENESS]}], history
    checks.ok("the run and its token survive the trainer container's recreation",
              f"token unchanged; run {run_id} stopped with a checkpoint at step "
              f"{row['checkpoint_step']}; its policy history kept")

    # The recreated trainer started a new default run: stop it, resume the first.
    fresh = until(lambda: public.get("/healthz").json().get("active_run"), 120, "a new run")
    assert fresh != run_id
    assert operator.post(f"/runs/{fresh}/stop").is_success  # the old token works
    until(lambda: public.get(f"/runs/{fresh}").json()["status"] == "stopped", 300,
          "the new run stopped")
    resumed = operator.post(f"/runs/{run_id}/resume")
    assert resumed.is_success, resumed.text
    until(lambda: public.get(f"/runs/{run_id}").json()["step"] > row["checkpoint_step"] + 1,
          300, "the resumed run's steps")
    steps = [s["step"] for s in public.get(f"/runs/{run_id}/steps",
                                           params={"since": 0}).json()["steps"]]
    assert steps == list(range(1, len(steps) + 1)), steps
    assert public.get(f"/runs/{run_id}/policy").json()["policy"]["staleness_bound"] == STALENESS
    checks.ok("the run resumes from its checkpoint on the named volume",
              f"run {run_id} at step {steps[-1]} after checkpoint {row['checkpoint_step']}; "
              f"steps 1..{steps[-1]} once each; staleness_bound {STALENESS} in force")
