"""Wrong tokens are throttled per client: real HTTP against the real app.

After `auth_failures_burst` wrong tokens within the window, every request of that client that
carries a token gets 429 with Retry-After, the right token too (so a guess made then tells
nothing); a request without a token is not a guess and is answered as before; another client
is not affected. Failures and refusals are counted on /metrics and logged without the value.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.backend.conftest import TINY, TOKEN, wait_for

GUESS = "guess-6b1f0d2c"


def wrong(n: int = 0) -> dict[str, str]:
    return {"Authorization": f"Bearer {GUESS}{n}"}


RIGHT = {"Authorization": f"Bearer {TOKEN}"}


def from_address(url: str, address: str) -> httpx.Client:
    """A client whose connections come from `address` (any 127.x.y.z is this machine)."""
    return httpx.Client(base_url=url, timeout=30,
                        transport=httpx.HTTPTransport(local_address=address))


def metric(url: str, name: str) -> float:
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    return next(s.value for f in families for s in f.samples if s.name == name)


def test_after_a_burst_of_wrong_tokens_the_client_gets_429_even_with_the_right_one(
        server_factory):
    with server_factory(auth_failures_burst=3) as live, \
            from_address(live.url, "127.0.0.1") as one, \
            from_address(live.url, "127.0.0.2") as other:
        for n in range(3):
            r = one.post("/runs/nope/stop", headers=wrong(n))
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        for headers in (wrong(3), RIGHT):  # no difference: the token is not even compared
            r = one.post("/runs/nope/stop", headers=headers)
            assert r.status_code == 429, r.text
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert GUESS not in r.text and TOKEN not in r.text
        assert one.get("/runs", headers=RIGHT).status_code == 429  # a read with a token too
        # Without a token nothing is guessed: reads are answered, changes refused as before.
        assert one.get("/runs").status_code == 200
        assert one.post("/runs/nope/stop").status_code == 401
        # Another client is not throttled: the right token gets through (404: no such run).
        assert other.post("/runs/nope/stop", headers=RIGHT).status_code == 404


def test_the_throttle_lifts_once_the_window_has_passed(server_factory):
    with server_factory(auth_failures_burst=2, auth_failures_window_seconds=1.0) as live, \
            httpx.Client(base_url=live.url, timeout=30) as http:
        for n in range(2):
            assert http.post("/runs/nope/stop", headers=wrong(n)).status_code == 401
        r = http.post("/runs/nope/stop", headers=RIGHT)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        # Polled with the right token: each throttled try is refused uncompared and not
        # counted, so the window runs out (wait_for's bound is a hang guard only).
        wait_for(lambda: http.post("/runs/nope/stop", headers=RIGHT).status_code == 404,
                 timeout=60, interval=0.2)


def test_wrong_tokens_are_counted_on_metrics_and_logged_without_their_value(server_factory,
                                                                              caplog):
    caplog.set_level("WARNING", logger="backend.auth")
    with server_factory(auth_failures_burst=3) as live, \
            httpx.Client(base_url=live.url, timeout=30) as http, \
            from_address(live.url, "127.0.0.3") as operator:
        run_id = operator.post("/runs", json={"config": TINY}, headers=RIGHT).json()["id"]
        assert operator.post(f"/runs/{run_id}/pause", headers=RIGHT).status_code == 202
        wait_for(lambda: operator.get(f"/runs/{run_id}").json()["status"] == "paused")
        # The active run is read from the fast lane; a wrong token there counts as well,
        # and once throttled, the right token is not answered there either.
        for n in range(2):
            run = http.get(f"/runs/{run_id}", headers=wrong(n)).json()
            assert run["run_dir"] == f"runs/{run_id}"  # the anonymous view
        assert http.patch(f"/runs/{run_id}/policy", json={"workers": 1},
                          headers=wrong(2)).status_code == 401
        assert http.get(f"/runs/{run_id}", headers=RIGHT).status_code == 429
        assert http.post(f"/runs/{run_id}/stop", headers=RIGHT).status_code == 429

        assert metric(live.url, "asteria_auth_failures_total") == 3
        assert metric(live.url, "asteria_auth_throttled_total") == 2
        # The run's own metrics are still in the same exposition.
        assert metric(live.url, "asteria_run_info") == 1
        assert operator.post(f"/runs/{run_id}/stop", headers=RIGHT).status_code == 202

    logged = [r.getMessage() for r in caplog.records if r.name == "backend.auth"]
    assert len(logged) == 3 and all("wrong bearer token from 127.0.0.1" in m for m in logged)
    assert not any(GUESS in r.getMessage() for r in caplog.records)
