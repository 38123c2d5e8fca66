"""The autopilot over real HTTP: a user's loop (SOAP whose refreshes, slowed at the seam, the one
worker cannot keep up with) served with `backend.serve`, the autopilot proposing. The operator
reads the proposal with its reason, accepts it, and finds it in the audit (client `autopilot`,
the reason, for anonymous readers too) and in /metrics; a bad setting is a 422 naming the field;
changes need the token; off is the kill switch."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from torch import nn

import backend
from asteria_core.autopilot import AutopilotConfig
from asteria_core.machine import MACHINE
from asteria_core.optim import SOAP
from asteria_core.policy import Policy
from asteria_core.runtime import Runtime, RuntimeConfig
from tests.asteria_core.refresh.faults import SlowRefresh
from tests.dashboard.stack import wait_until

pytestmark = pytest.mark.usefixtures("one_thread")


def train_until(runtime: Runtime, model: nn.Module, opt, stop: threading.Event) -> None:
    """A user's own loop: trains `model` until `stop` is set or the control plane stops it."""
    g = torch.Generator().manual_seed(1)
    target = torch.randn(8, 3, generator=g)
    with runtime:
        while not stop.is_set() and not runtime.stop_requested:
            x = torch.randn(16, 8, generator=g)
            loss = nn.functional.mse_loss(model(x), x @ target)
            opt.zero_grad()
            loss.backward()
            opt.step()


@contextmanager
def slow_refresh_run(tmp_path: Path, mode: str) -> Iterator[backend.ControlPlane]:
    """A user's loop served with `backend.serve`: SOAP whose refreshes (slowed at the seam by
    SlowRefresh) one worker cannot keep up with at interval 2, its autopilot in `mode`, allowed
    to move the interval only."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 3))
    opt = SOAP(model.parameters(), lr=1e-2)
    pilot = AutopilotConfig(mode=mode, window=8, settle=2, spacing=12, guard_steps=8,
                            bounds={"refresh_interval": (2, 64), "workers": (1, 1)})
    runtime = Runtime(opt, model=model, config=RuntimeConfig(
        run_dir=tmp_path / "run", refresh_fn=SlowRefresh(0.02), autopilot=pilot,
        policy=Policy(refresh_interval=2, staleness_bound=2, workers=1)))
    plane = backend.serve(runtime, port=0, data_dir=tmp_path / "data")
    stop = threading.Event()
    trainer = threading.Thread(target=train_until, args=(runtime, model, opt, stop),
                               daemon=True)
    trainer.start()
    try:
        yield plane
    finally:
        stop.set()
        trainer.join(60)
        plane.close()


def test_propose_accept_audit_metrics_and_the_kill_switch(tmp_path):
    with slow_refresh_run(tmp_path, "propose") as plane, \
            httpx.Client(base_url=plane.url, timeout=30) as http:
        auth = {"Authorization": f"Bearer {plane.token}"}
        run_id = wait_until(lambda: http.get("/healthz").json()["active_run"],
                            what="the attached run")
        url = f"/runs/{run_id}/autopilot"
        proposal = wait_until(lambda: [p for p in http.get(url).json()["proposals"]
                                       if p["status"] == "proposed"], what="a proposal")[0]
        assert set(proposal["changes"]) == {"refresh_interval"}
        assert "refresh_wait" in proposal["reason"]
        assert http.get(f"/runs/{run_id}/policy").json()["version"] == 1  # only proposed

        # Changes need the token; a bad setting names its field; nothing half-applied.
        accept = f"{url}/proposals/{proposal['id']}/accept"
        assert http.post(accept).status_code == 401
        bad = http.patch(url, json={"mode": "apply", "bounds": {"workers": [1, 10**6]}},
                         headers=auth)
        assert bad.status_code == 422, bad.text
        assert bad.json()["detail"][0]["loc"] == ["body", "bounds", "workers", 1]
        state = http.get(url).json()
        assert state["config"]["mode"] == "propose"
        assert state["cores"] == MACHINE.cores  # what its decisions take as shared
        assert http.post(f"{url}/proposals/999999/accept", headers=auth).status_code == 404

        answer = http.post(accept, headers=auth)
        assert answer.status_code == 200, answer.text
        version = answer.json()["version"]
        assert answer.json()["status"] == "accepted"
        assert http.post(accept, headers=auth).status_code == 409  # not open any more

        # Applied at a boundary like any PATCH; audited with its actor and reason.
        wait_until(lambda: http.get(f"/runs/{run_id}/policy").json()["version"] == version,
                   what="the accepted change in force")
        for headers in (auth, {}):  # the autopilot is no person: public readers see it
            change = wait_until(lambda h=headers: [
                c for c in http.get(f"/runs/{run_id}/policy/history", headers=h).json()
                if c["version"] == version and c["applied_at"] is not None],
                what="the change in the audit, applied")[0]
            assert change["client"] == "autopilot"
            assert change["reason"] == proposal["reason"]
        metrics = wait_until(lambda: (m := http.get("/metrics").text) and
                             'asteria_autopilot_decisions_total{field="refresh_interval",'
                             'outcome="accepted"} 1.0' in m and m,
                             what="the decision in /metrics")
        assert 'asteria_autopilot_mode{mode="propose"} 1.0' in metrics

        # The kill switch: off at once; open proposals withdrawn, nothing more decided.
        off = http.patch(url, json={"mode": "off"}, headers=auth)
        assert off.status_code == 200 and off.json()["config"]["mode"] == "off"
        assert not [p for p in off.json()["proposals"] if p["status"] == "proposed"]
        step = http.get(f"/runs/{run_id}").json()["step"]
        wait_until(lambda: http.get(f"/runs/{run_id}").json()["step"] > step + 30,
                   what="steps with the autopilot off")
        assert http.get(f"/runs/{run_id}/policy").json()["version"] == version
        assert not [p for p in http.get(url).json()["proposals"]
                    if p["status"] == "proposed"]
        assert 'asteria_autopilot_mode{mode="off"} 1.0' in http.get("/metrics").text

        # bounds, when sent, replace the bounds whole: the answer shows the ones in force
        narrowed = http.patch(url, json={"bounds": {"workers": [1, 1]}}, headers=auth)
        assert narrowed.status_code == 200, narrowed.text
        assert narrowed.json()["config"]["bounds"] == {"workers": [1, 1]}
        schema = http.get("/openapi.json").json()
        said = schema["components"]["schemas"]["AutopilotUpdate"]["properties"]["bounds"]
        assert "the defaults included" in said["description"]
        assert "replaces the bounds whole" in \
            schema["paths"]["/runs/{run_id}/autopilot"]["patch"]["description"]
