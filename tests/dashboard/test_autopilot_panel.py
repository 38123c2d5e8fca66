"""The Policy page's autopilot panel under AppTest, against a user's loop served by
`backend.serve` (real HTTP): SOAP whose refreshes, slowed at the seam, the one worker cannot keep
up with, its autopilot proposing. The operator sees the proposal with its reason, accepts it,
and the control plane applies it as the autopilot's change; off is one click away."""

from __future__ import annotations

import re

import httpx
import pytest
import streamlit as st
import torch
from torch import nn

import backend
from asteria_core.autopilot import AutopilotConfig
from asteria_core.optim import SOAP
from asteria_core.policy import Policy
from asteria_core.runtime import Runtime, RuntimeConfig
from tests.asteria_core.refresh.faults import SlowRefresh
from tests.backend.conftest import free_port
from tests.dashboard.test_pages import app, texts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_proposal_is_shown_with_its_reason_and_accepted(monkeypatch, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 3))
    opt = SOAP(model.parameters(), lr=1e-2)
    runtime = Runtime(opt, model=model, config=RuntimeConfig(
        run_dir=tmp_path / "run", refresh_fn=SlowRefresh(0.02),
        autopilot=AutopilotConfig(mode="propose", window=8, settle=2, spacing=12,
                                  guard_steps=8, bounds={"refresh_interval": (2, 64),
                                                         "workers": (1, 1)}),
        policy=Policy(refresh_interval=2, staleness_bound=2, workers=1)))
    plane = backend.serve(runtime, port=free_port(), data_dir=tmp_path / "data")
    g = torch.Generator().manual_seed(1)

    def steps(n: int) -> None:
        for _ in range(n):
            x = torch.randn(16, 8, generator=g)
            nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).expand(-1, 3)).backward()
            opt.step()
            opt.zero_grad()
        runtime.end_step()

    try:
        monkeypatch.setenv("ASTERIA_URL", plane.url)
        monkeypatch.setenv("ASTERIA_TOKEN", plane.token)
        st.cache_data.clear()
        steps(30)
        run_id = runtime.run_id
        [proposal] = [p for p in httpx.get(f"{plane.url}/runs/{run_id}/autopilot").json()
                      ["proposals"] if p["status"] == "proposed"]
        at = app(run_id, "views/policy.py")
        assert not at.exception, at.exception
        shown = texts(at.markdown)
        assert f"**Proposal {proposal['id']}**" in shown and proposal["reason"] in shown
        assert at.radio(key=f"ap_mode_{run_id}").value == "propose"
        # what it read, against the thresholds its rules act on
        reading = httpx.get(f"{plane.url}/runs/{run_id}/autopilot").json()["reading"]
        assert reading["step"] >= 1 and reading["records_read"] <= reading["records_needed"]
        duty = reading["figures"][0]
        assert duty["name"] == "refresh duty" and duty["high"] == 1.05 and duty["target"] == 0.8
        [table] = [d.value for d in at.dataframe if "figure" in d.value.columns]
        assert list(table["figure"]) == [f["name"] for f in reading["figures"]]
        shown = texts(at.caption) + texts(at.markdown)
        assert re.search(r"Latest reading at step \d+: \d+ of the \d+ records", shown), shown

        at.button(key=f"ap_accept_{proposal['id']}").click().run()
        assert not at.exception, at.exception
        steps(3)  # the boundary that applies it
        history = httpx.get(f"{plane.url}/runs/{run_id}/policy/history").json()
        assert [(c["client"], c["reason"]) for c in history] == \
            [("autopilot", proposal["reason"])]

        at.radio(key=f"ap_mode_{run_id}").set_value("off").run()
        at.button(key=f"ap_set_{run_id}").click().run()
        assert not at.exception, at.exception
        assert httpx.get(f"{plane.url}/runs/{run_id}/autopilot").json()["config"]["mode"] == \
            "off"
    finally:
        runtime.close()
        plane.close()
        st.cache_data.clear()
