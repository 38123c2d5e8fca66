"""dashboard/client.py against a real control plane: answers, and every failure as a sentence."""

from __future__ import annotations

import pytest

from dashboard.client import (
    Client,
    Conflict,
    Invalid,
    NotFound,
    Unauthorized,
    Unreachable,
)
from tests.backend.conftest import TOKEN, free_port
from tests.dashboard.stack import tiny_run


def test_reads_runs_steps_and_policy(api, finished_run):
    client = Client(api.url)
    assert client.health()["status"] == "ok"
    assert finished_run in [r["id"] for r in client.runs()]
    assert client.run(finished_run)["status"] == "finished"
    page = client.steps(finished_run, since=100, limit=5)
    assert [s["step"] for s in page["steps"]] == [101, 102, 103, 104, 105]
    assert client.policy(finished_run)["policy"]["staleness_bound"] == 4
    [change] = client.policy_history(finished_run)
    assert change["diff"] == {"staleness_bound": [10, 4]}


def test_unreachable_is_a_sentence_not_a_traceback():
    with pytest.raises(Unreachable, match="cannot reach the control plane at http://127.0.0.1"):
        Client(f"http://127.0.0.1:{free_port()}").runs()
    with pytest.raises(Unreachable):
        Client("not a url").runs()


def test_wrong_token_is_unauthorized(api, live_run):
    with pytest.raises(Unauthorized, match="refused the token"):
        Client(api.url, "wrong").set_policy(live_run, {"workers": 2})
    with pytest.raises(Unauthorized):
        Client(api.url, "").command(live_run, "checkpoint")


def test_validation_error_keeps_the_servers_words(api, http, live_run):
    body = {"swap_delay": 10_000}
    expected = http.patch(f"/runs/{live_run}/policy", json=body).json()["detail"][0]["msg"]
    with pytest.raises(Invalid) as err:
        Client(api.url, TOKEN).set_policy(live_run, body)
    assert err.value.errors == [("swap_delay", expected)]
    with pytest.raises(Invalid) as err:
        Client(api.url, TOKEN).set_policy(live_run, {"workers": -1})
    [(field, message)] = err.value.errors
    assert field == "workers" and message


def test_conflict_and_not_found(api, live_run, finished_run):
    client = Client(api.url, TOKEN)
    with pytest.raises(Conflict, match="active"):
        client.start_run(tiny_run(10))
    with pytest.raises(Conflict, match="not active"):
        client.set_policy(finished_run, {"workers": 2})
    with pytest.raises(NotFound, match="no run"):
        client.run("no-such-run")
    with pytest.raises(ValueError, match="command"):
        client.command(live_run, "explode")


def test_commands_are_accepted(api, http, live_run):
    client = Client(api.url, TOKEN)
    assert client.command(live_run, "checkpoint")["command"] == "checkpoint"


def test_start_run_on_an_idle_control_plane(fresh_api):
    client = Client(fresh_api.url, TOKEN)
    run = client.start_run(tiny_run(20), {"staleness_bound": 5})
    assert run["status"] == "running" and run["total_steps"] == 20
    assert client.policy(run["id"])["policy"]["staleness_bound"] == 5
