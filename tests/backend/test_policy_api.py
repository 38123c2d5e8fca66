import json

import httpx
import pytest

from tests.backend.conftest import TINY, wait_for


@pytest.fixture
def run_id(client):
    r = client.post("/runs", json={"config": TINY})
    assert r.status_code == 201
    run_id = r.json()["id"]
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["step"] >= 3)
    yield run_id
    client.post(f"/runs/{run_id}/stop")
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "stopped")


def test_patch_mid_run_shows_in_step_records_from_the_reported_step(client, run_id):
    r = client.patch(f"/runs/{run_id}/policy", json={"staleness_bound": 3, "swap_delay": 2})
    assert r.status_code == 200, r.text
    accepted = r.json()
    assert accepted["version"] == 2 and accepted["diff"] == {"staleness_bound": [10, 3],
                                                             "swap_delay": ["auto", 2]}
    effective = accepted["effective_step"]
    # Step records reach the store in batches: wait until they have, not just the trainer.
    steps = wait_for(lambda: (page := client.get(f"/runs/{run_id}/steps", params={
        "limit": 10000}).json()["steps"]) and page[-1]["step"] >= effective + 5 and page)
    versions = {s["step"]: s["policy_version"] for s in steps}
    assert all(v == 1 for step, v in versions.items() if step < effective)
    assert all(v == 2 for step, v in versions.items() if step >= effective)
    assert versions[effective - 1] == 1 and versions[effective] == 2
    policy = client.get(f"/runs/{run_id}/policy").json()
    assert policy["version"] == 2 and policy["policy"]["staleness_bound"] == 3
    # The newest steps are served from memory; the audit row reaches the store in its batch.
    [change] = wait_for(lambda: client.get(f"/runs/{run_id}/policy/history").json())
    assert change["version"] == 2 and change["effective_step"] == effective
    assert change["client"].startswith("127.0.0.1")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"staleness_bound": "three"}, "staleness_bound"),
        ({"staleness_bound": -1}, "staleness_bound"),
        ({"refresh_interval": 0}, "refresh_interval"),
        ({"swap_mode": "eager"}, "swap_mode"),
        ({"stalenes_bound": 3}, "stalenes_bound"),
        ({"swap_delay": 50}, "swap_delay"),  # > staleness_bound: a cross-field rule
        ({"swap_mode": "opportunistic", "workers": 0}, "workers"),
        ({"workers": 1.5}, "workers"),
        # strict JSON types: no bool for an integer, no string for a number, no 1 for true
        ({"refresh_interval": True}, "refresh_interval"),
        ({"staleness_bound": "5"}, "staleness_bound"),
        ({"pace": 1}, "pace"),
        ({"swap_delay": True}, "swap_delay"),
        ({"workers": 2.0}, "workers"),
        ({"disk_dir": None}, "disk_dir"),  # null is not "unchanged": omit the field instead
    ],
)
def test_invalid_policy_is_rejected_naming_the_field_and_nothing_changes(client, run_id, body,
                                                                          field):
    before = client.get(f"/runs/{run_id}/policy").json()
    r = client.patch(f"/runs/{run_id}/policy", json={"refresh_interval": 20, **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field in d["loc"] for d in detail), detail
    assert all(d["msg"] for d in detail)
    assert client.get(f"/runs/{run_id}/policy").json() == before
    assert client.get(f"/runs/{run_id}/policy/history").json() == []


def test_malformed_and_oversized_bodies(server, client, run_id):
    url = f"/runs/{run_id}/policy"
    r = client.patch(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "json" in r.text.lower()
    r = client.patch(url, json=[1, 2])
    assert r.status_code == 422
    r = client.patch(url, json={})
    assert r.status_code == 422 and "no fields to change" in r.text
    schema = client.get("/openapi.json").json()["components"]["schemas"]["PolicyUpdate"]
    assert schema["minProperties"] == 1  # the rule above, stated in the document
    big = json.dumps({"disk_dir": "x" * (server.settings.max_body_bytes + 10)})
    r = client.patch(url, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert client.get(f"/runs/{run_id}/policy").json()["version"] == 1


def test_sse_streams_live_steps_and_policy_changes(server, client, run_id):
    seen: dict[str, list] = {"step": [], "policy": []}
    with httpx.Client(base_url=server.url, timeout=30) as sse, \
            sse.stream("GET", f"/runs/{run_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        client.patch(f"/runs/{run_id}/policy", json={"refresh_interval": 7})
        event = None
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in seen:
                seen[event].append(json.loads(line.split(":", 1)[1]))
            if seen["policy"] and len(seen["step"]) >= 5:
                break
    steps = [s["step"] for s in seen["step"]]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert seen["policy"][0]["diff"] == {"refresh_interval": [10, 7]}
    assert client.get("/runs/nope/events").status_code == 404
