"""Who the client is and which names the server answers to, over real HTTP.

X-Forwarded-For is believed only from the proxies the operator names (none by default): a
storm of wrong tokens, each claiming another address, is throttled as one client, and the
policy history records the connection's own address. A Host header naming none of the served
names is refused (a page whose own name resolves to this machine cannot read the API).
"""

from __future__ import annotations

import httpx
import pytest

from backend.settings import Settings
from tests.backend.conftest import TINY, TOKEN, wait_for

RIGHT = {"Authorization": f"Bearer {TOKEN}"}


def test_forwarded_addresses_from_an_unnamed_peer_neither_escape_the_throttle_nor_the_audit(
        server_factory):
    with server_factory(auth_failures_burst=3) as live, \
            httpx.Client(base_url=live.url, timeout=60) as http:
        codes = [http.post("/runs/nope/stop", headers={
            "Authorization": f"Bearer wrong-{n}", "X-Forwarded-For": f"10.9.8.{n}"}).status_code
            for n in range(8)]
        assert codes == [401] * 3 + [429] * 5
        forged = {**RIGHT, "X-Forwarded-For": "10.9.8.7"}
        assert http.post("/runs/nope/stop", headers=forged).status_code == 429


def test_the_policy_history_records_the_peer_not_a_forwarded_address(server_factory):
    with server_factory() as live, \
            httpx.Client(base_url=live.url, timeout=60, headers=RIGHT) as http:
        run_id = http.post("/runs", json={"config": TINY}).json()["id"]
        try:
            wait_for(lambda: http.get(f"/runs/{run_id}").json()["step"] >= 1)
            r = http.patch(f"/runs/{run_id}/policy", json={"staleness_bound": 3},
                           headers={"X-Forwarded-For": "10.9.8.7"})
            assert r.status_code == 200, r.text
            [change] = wait_for(lambda: http.get(f"/runs/{run_id}/policy/history").json())
            assert change["client"].startswith("127.0.0.1") and "10.9.8.7" not in change["client"]
        finally:
            http.post(f"/runs/{run_id}/stop")
            wait_for(lambda: http.get(f"/runs/{run_id}").json()["status"] == "stopped")


def test_a_named_proxy_is_believed(server_factory):
    with server_factory(auth_failures_burst=2, trusted_proxies=["127.0.0.1"]) as live, \
            httpx.Client(base_url=live.url, timeout=60) as http:
        for _ in range(2):
            assert http.post("/runs/nope/stop", headers={
                "Authorization": "Bearer wrong", "X-Forwarded-For": "10.0.0.1"}).status_code == 401
        assert http.post("/runs/nope/stop", headers={
            **RIGHT, "X-Forwarded-For": "10.0.0.1"}).status_code == 429
        # Another client behind the same proxy is not throttled (404: no such run).
        assert http.post("/runs/nope/stop", headers={
            **RIGHT, "X-Forwarded-For": "10.0.0.2"}).status_code == 404


@pytest.mark.parametrize("bad", ["trusted_proxies", "allowed_hosts"])
def test_bad_trust_settings_are_refused_naming_the_field(bad):
    value = ["not an address"] if bad == "trusted_proxies" else ["http://trainer:8000"]
    with pytest.raises(ValueError, match=bad):
        Settings(**{bad: value})


def test_a_host_header_naming_another_site_is_refused(server_factory):
    with server_factory(allowed_hosts=["trainer", "*.example.org"]) as live, \
            httpx.Client(base_url=live.url, timeout=60) as http:
        port = live.settings.port
        for host in ("rebind.attacker.test", f"evil.example:{port}", "127.0.0.1.attacker.test"):
            r = http.get("/runs", headers={"Host": host})
            assert r.status_code == 400, (host, r.status_code)
            assert http.get("/metrics", headers={"Host": host}).status_code == 400
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}",
                     f"trainer:{port}", "TRAINER", f"grafana.example.org:{port}"):
            assert http.get("/runs", headers={"Host": host}).status_code == 200, host
            assert http.get("/metrics", headers={"Host": host}).status_code == 200, host


def test_the_bound_address_is_a_served_name(server_factory):
    with server_factory(host="127.0.0.2") as live:
        port = live.settings.port
        url = f"http://127.0.0.2:{port}"
        assert httpx.get(f"{url}/healthz", timeout=60).status_code == 200
        assert httpx.get(f"{url}/healthz", headers={"Host": "elsewhere"},
                         timeout=60).status_code == 400
