import json
import os
import stat

import httpx

from backend.schemas import RunPublic, StepPage
from tests.backend.conftest import TINY, TOKEN, wait_for


def _start(client, **train):
    config = json.loads(json.dumps(TINY))
    config["train"].update(train)
    r = client.post("/runs", json={"config": config})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _run(client, run_id):
    return client.get(f"/runs/{run_id}").json()


def test_full_run_lifecycle(client):
    run_id = _start(client)
    assert client.post("/runs", json={"config": TINY}).status_code == 409
    wait_for(lambda: _run(client, run_id)["step"] >= 5)

    assert client.post(f"/runs/{run_id}/pause").status_code == 202
    wait_for(lambda: _run(client, run_id)["status"] == "paused")
    paused_at = _run(client, run_id)["step"]
    wait_for(lambda: client.get(f"/runs/{run_id}/steps",
                                params={"since": paused_at - 1}).json()["steps"])
    assert _run(client, run_id)["step"] == paused_at  # no step trains while paused

    assert client.post(f"/runs/{run_id}/checkpoint").status_code == 202
    wait_for(lambda: _run(client, run_id)["checkpoint_step"] == paused_at)
    assert client.post(f"/runs/{run_id}/resume").status_code == 202
    wait_for(lambda: _run(client, run_id)["step"] > paused_at + 3)

    assert client.post(f"/runs/{run_id}/stop").status_code == 202
    stopped = wait_for(lambda: (r := _run(client, run_id))["status"] == "stopped" and r)
    assert stopped["checkpoint_step"] == stopped["step"]
    assert client.get("/healthz").json() == {"status": "ok", "active_run": None}

    # A stopped run resumes from its checkpoint and keeps its id and history.
    assert client.post(f"/runs/{run_id}/resume").status_code == 202
    wait_for(lambda: _run(client, run_id)["step"] > stopped["step"] + 3)
    client.post(f"/runs/{run_id}/stop")
    wait_for(lambda: _run(client, run_id)["status"] == "stopped")
    steps = client.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert [r["id"] for r in client.get("/runs").json()] == [run_id]


def test_finished_run_cannot_be_commanded(client):
    run_id = _start(client, steps=3)
    wait_for(lambda: _run(client, run_id)["status"] == "finished")
    assert client.post(f"/runs/{run_id}/pause").status_code == 409
    assert client.post(f"/runs/{run_id}/resume").status_code == 409
    assert client.patch(f"/runs/{run_id}/policy", json={"workers": 2}).status_code == 409
    assert client.get("/runs/nope").status_code == 404


def test_bad_run_config_is_rejected_naming_the_key(client):
    r = client.post("/runs", json={"config": {"optim": {"lr": -1}}})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "config", "optim", "lr"]
    assert "optim.lr" in r.json()["detail"][0]["msg"]
    r = client.post("/runs", json={"config": {"optim": {"lrr": 1}}})
    assert r.status_code == 422 and "unknown config key 'optim.lrr'" in r.text
    # the [autopilot] section's bounds name the field and the item at fault
    r = client.post("/runs", json={"config": {"optim": {"name": "soap"}, "autopilot": {
        "mode": "apply", "workers": "1..100000"}}})
    assert r.status_code == 422 and "autopilot.workers.1: got 100000" in r.text
    assert client.get("/runs").json() == []


def test_every_mutating_route_needs_the_token(server, client):
    run_id = _start(client)
    paths = client.get("/openapi.json").json()["paths"]
    mutating = [(method, path.replace("{run_id}", run_id).replace("{proposal_id}", "1"))
                for path, ops in paths.items() for method in ops
                if method in ("post", "patch", "put", "delete")]
    assert len(mutating) == 9  # runs: 5, policy: 1, autopilot: settings, accept, dismiss
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        with httpx.Client(base_url=server.url, headers=headers) as anon:
            for method, path in mutating:
                r = anon.request(method, path, json={})
                assert r.status_code == 401, (method, path, r.status_code)
                assert r.headers["www-authenticate"] == "Bearer"
    assert _run(client, run_id)["status"] == "running"  # nothing was applied
    client.post(f"/runs/{run_id}/stop")


def test_token_file_is_created_0600_when_no_token_is_set(server_factory, tmp_path):
    with server_factory(token=None) as live:
        path = live.settings.resolved_token_file
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        token = path.read_text().strip()
        assert len(token) >= 32
        r = httpx.post(f"{live.url}/runs/x/stop", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 404  # authenticated, then: no such run


def test_restart_keeps_history(server_factory):
    with server_factory() as live, httpx.Client(
            base_url=live.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        run_id = _start(c)
        wait_for(lambda: _run(c, run_id)["step"] >= 10)
        c.patch(f"/runs/{run_id}/policy", json={"staleness_bound": 4})
        wait_for(lambda: c.get(f"/runs/{run_id}/policy/history").json())
    # The server stopped the run at shutdown; a new server on the same store sees it all.
    with server_factory() as live, httpx.Client(base_url=live.url) as c:
        run = _run(c, run_id)
        assert run["status"] == "stopped" and run["checkpoint_step"] == run["step"]
        steps = c.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
        assert len(steps) == run["step"]
        history = c.get(f"/runs/{run_id}/policy/history").json()
        assert history[0]["diff"] == {"staleness_bound": [10, 4]}
        assert c.get(f"/runs/{run_id}/policy").json()["policy"]["staleness_bound"] == 4


def test_metrics_keep_the_last_run_after_it_ends(client):
    from prometheus_client.parser import text_string_to_metric_families

    assert client.get("/metrics").status_code == 200
    run_id = _start(client, steps=5)
    wait_for(lambda: _run(client, run_id)["status"] == "finished")
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert families["asteria_steps"].samples[0].value == 5
    info = families["asteria_run_info"].samples[0].labels
    assert info["run_id"] == run_id


def test_steps_page_across_the_live_window_and_the_store(server_factory):
    """Polling with `since` while the run trains crosses from store pages (older than the
    in-memory window) to memory pages without a gap or a repeat, and both agree."""
    with server_factory(live_steps_window=4) as live, \
            httpx.Client(base_url=live.url, timeout=30,
                         headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        run_id = _start(client)
        wait_for(lambda: _run(client, run_id)["step"] >= 20)
        seen, since = [], 0
        while len(seen) < 40:
            page = client.get(f"/runs/{run_id}/steps", params={"since": since, "limit": 3})
            assert page.status_code == 200, page.text
            seen += page.json()["steps"]
            since = page.json()["next_since"]
        assert [s["step"] for s in seen] == list(range(1, len(seen) + 1))
        live_row = _run(client, run_id)
        client.post(f"/runs/{run_id}/stop")
        wait_for(lambda: _run(client, run_id)["status"] == "stopped")
        # pages of 3 may end past 40: compare all that was served
        stored = client.get(f"/runs/{run_id}/steps",
                            params={"limit": len(seen)}).json()["steps"]
        assert stored == seen  # the store holds exactly what was served from memory
        final = _run(client, run_id)
        assert {k: final[k] for k in ("id", "total_steps", "config", "run_dir", "created_at")} \
            == {k: live_row[k] for k in ("id", "total_steps", "config", "run_dir", "created_at")}


def test_live_reads_answer_like_the_routes_and_bad_queries_still_get_422(client):
    """The active run's polled reads come from memory (backend/fastlane.py); their shape is the
    routes' own, and a query the routes would reject is still rejected the same way."""
    run_id = _start(client)
    wait_for(lambda: _run(client, run_id)["step"] >= 3)
    assert RunPublic.model_validate(_run(client, run_id)).id == run_id
    page = StepPage.model_validate(client.get(f"/runs/{run_id}/steps",
                                              params={"since": 1, "limit": 2}).json())
    assert [s.step for s in page.steps] == [2, 3] and page.next_since == 3
    for params in ({"limit": 0}, {"limit": 10_001}, {"since": -1}, {"since": "x"}):
        r = client.get(f"/runs/{run_id}/steps", params=params)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["detail"][0]["loc"][-1] in params
    # Unknown query keys are ignored by the route, as before (answered by it, not from memory).
    assert client.get(f"/runs/{run_id}/steps", params={"since": 1, "x": 1}).status_code == 200
    client.post(f"/runs/{run_id}/stop")


def test_a_launched_run_starts_with_the_autopilot_its_config_names(client):
    config = json.loads(json.dumps(TINY))
    config["train"].update(steps=100_000)
    config["optim"] = {"name": "soap"}
    config["autopilot"] = {"mode": "propose", "refresh_interval": "5..50", "workers": ""}
    r = client.post("/runs", json={"config": config})
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    pilot = wait_for(lambda: (a := client.get(f"/runs/{run_id}/autopilot")).status_code == 200
                     and a.json())
    assert pilot["config"]["mode"] == "propose"
    assert pilot["config"]["bounds"]["refresh_interval"] == [5, 50]
    assert "workers" not in pilot["config"]["bounds"]  # an empty bound: never moved
    assert client.post(f"/runs/{run_id}/stop").status_code == 202
    wait_for(lambda: _run(client, run_id)["status"] == "stopped")
