"""`asteria start`'s progress line against a real control plane: a run it first sees after its
last step (here: paused there) is announced with that step's loss."""

from __future__ import annotations

import re

import httpx

from backend.launch import Progress
from tests.backend.conftest import TINY, TOKEN, wait_for


def test_a_run_first_seen_at_its_newest_step_is_announced_with_its_loss(fresh_api, capsys):
    client = httpx.Client(base_url=fresh_api.url, timeout=60,
                          headers={"Authorization": f"Bearer {TOKEN}"})
    run_id = client.post("/runs", json={"config": TINY}).json()["id"]
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["step"] >= 3)
    assert client.post(f"/runs/{run_id}/pause").status_code == 202
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "paused")
    progress = Progress(fresh_api.url, draw=False)
    progress.poll()  # sees the run at the step it paused after: no record comes after it
    assert progress.run == run_id
    assert client.post(f"/runs/{run_id}/stop").status_code == 202
    wait_for(lambda: client.get("/healthz").json()["active_run"] is None)
    progress.poll()
    out = capsys.readouterr().out
    assert re.search(rf"run {run_id} stopped at step \d+ of \d+, final loss \d+\.\d{{4}}", out), out
    client.close()
