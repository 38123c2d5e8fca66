"""A served run with Muon: the control plane takes `optim.name=muon` and its own keys, trains it
as a first-order run (no refresh, no autopilot), and the dashboard's optimizer choice lists it."""

import json

from backend.app import create_app
from backend.settings import Settings
from dashboard.components import config_choices
from tests.backend.conftest import TINY, wait_for


def test_a_served_muon_run_trains_with_its_settings(client):
    config = json.loads(json.dumps(TINY))
    config["train"].update(steps=100_000)
    config["optim"] = {"name": "muon", "lr": 0.02, "adamw_lr": 3e-3,
                       "muon_scale": "match_rms_adamw"}
    r = client.post("/runs", json={"config": config})
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["step"] >= 3)
    run = client.get(f"/runs/{run_id}").json()
    assert run["config"]["optim"]["name"] == "muon"
    assert run["config"]["optim"]["muon_scale"] == "match_rms_adamw"
    steps = client.get(f"/runs/{run_id}/steps", params={"limit": 10}).json()["steps"]
    assert steps and all(s["loss"] is not None for s in steps)
    assert client.post(f"/runs/{run_id}/stop").status_code == 202
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "stopped")


def test_muon_keys_are_checked_and_muon_has_no_autopilot(client):
    r = client.post("/runs", json={"config": {"optim": {"name": "muon", "muon_scale": "rms"}}})
    assert r.status_code == 422 and "optim.muon_scale" in r.text
    r = client.post("/runs", json={"config": {"optim": {"name": "muon", "adamw_lr": -2}}})
    assert r.status_code == 422 and "optim.adamw_lr" in r.text
    r = client.post("/runs", json={"config": {"optim": {"name": "muon"},
                                              "autopilot": {"mode": "propose"}}})
    assert r.status_code == 422 and "autopilot.mode" in r.text


def test_the_dashboards_optimizer_choice_lists_muon():
    doc = create_app(Settings(start_default_run=False)).openapi()
    assert "muon" in config_choices(doc, "optim", "name")
    assert config_choices(doc, "optim", "muon_scale") == ("original", "match_rms_adamw")
