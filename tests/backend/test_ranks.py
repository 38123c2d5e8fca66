"""GET /runs/{id}/ranks over real HTTP.

A single-process run has no ranks to list. A data-parallel run is examples/ddp_loop.py under
real torchrun on 2 ranks: rank 0's control plane lists rank 0 from its own telemetry and rank 1
from rank 1's /metrics, found through the file_sd target file rank 1 wrote. Then rank 1's target
file is replaced by what a broken or hostile one could hold (a closed port, garbage, a URL, a
huge file, a server that answers too much, too slowly, not Prometheus, or another run): rank 1
is listed without figures and with the reason, rank 0 keeps its figures, the endpoint answers
200 within its bounds.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from asteria_core.telemetry import Telemetry
from asteria_core.telemetry.reporter import IDLE_CAUSES
from asteria_core.telemetry.timing import PhaseTimer
from backend import ranks as ranks_module
from tests.backend.conftest import TINY, free_port, wait_for
from tests.backend.ddp_example import ddp_example

# ---------------------------------------------------------------------- single process


def test_a_single_process_run_has_no_ranks_to_list(client):
    run_id = client.post("/runs", json={"config": TINY}).json()["id"]
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["step"] > 0)
    view = client.get(f"/runs/{run_id}/ranks").json()
    assert view["data_parallel"] is False and view["world"] == 1 and view["ranks"] == []
    assert "single-process" in view["detail"]
    client.post(f"/runs/{run_id}/stop")
    view = wait_for(lambda: (v := client.get(f"/runs/{run_id}/ranks").json()) and
                    "not active" in v["detail"] and v)
    assert view["ranks"] == [] and view["data_parallel"] is False
    assert client.get("/runs/no-such-run/ranks").status_code == 404


# ---------------------------------------------------------------------- data-parallel


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    with ddp_example(tmp_path_factory.mktemp("ddp")) as running:
        yield running


@pytest.fixture
def rank1(job):
    """Rank 1's target file, put back as rank 1 wrote it after the test."""
    written = job.target(1).read_bytes()
    yield job
    job.write_target(1, written)
    time.sleep(ranks_module.CACHE_SECONDS)


def scrape_directly(address: str) -> dict[str, float]:
    text = httpx.get(f"http://{address}/metrics", timeout=10).text
    return {(s.name, s.labels.get("cause", s.labels.get("direction", ""))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.multiproc
def test_every_rank_is_listed_with_its_figures(job):
    def moved(entry: dict) -> int:
        f = entry["figures"] or {}
        return (f.get("bytes_sent") or 0) + (f.get("bytes_received") or 0)

    def swapped(entry: dict) -> int:  # a refresh is counted when its result is swapped in
        return (entry["figures"] or {}).get("refreshes") or 0

    view = wait_for(lambda: (v := job.ranks()) and all(moved(r) > 0 for r in v["ranks"])
                    and sum(swapped(r) for r in v["ranks"]) > 0 and v, 120)
    assert view["data_parallel"] is True and view["world"] == 2 and not view["truncated"]
    zero, one = view["ranks"]
    address = job.target(1).read_text().split('["', 1)[1].split('"]', 1)[0]
    assert (zero["rank"], zero["source"], zero["address"]) == (0, "control plane", None)
    assert (one["rank"], one["source"], one["address"]) == (1, "scrape", address)
    for entry in (zero, one):
        f = entry["figures"]
        assert entry["reachable"] and entry["error"] is None and entry["node"] == 0
        assert f["step"] > 0 and set(f["idle_seconds"]) == set(IDLE_CAUSES)  # sync_wait too
        assert f["staleness_bound"] == 5 and 0 <= f["staleness"] <= 5  # the example's policy
        assert f["refresh_failures"] == 0 and f["owned_blocks"] > 0
    assert zero["figures"]["owned_blocks"] + one["figures"]["owned_blocks"] >= 2
    assert sum(r["figures"]["refreshes"] for r in view["ranks"]) > 0
    assert any(r["figures"]["refresh_seconds"] > 0 for r in view["ranks"])
    # rank 1's figures are its own /metrics' (it has trained on since: never fewer)
    direct = scrape_directly(address)
    assert direct[("asteria_steps_total", "")] >= one["figures"]["step"]
    assert direct[("asteria_distributed_rank", "")] == 1
    assert direct[("asteria_distributed_exchange_bytes_total", "sent")] >= \
        one["figures"]["bytes_sent"]
    assert direct[("asteria_device_idle_seconds_total", "sync_wait")] >= \
        one["figures"]["idle_seconds"]["sync_wait"]
    # rank 0's are the control plane's own /metrics
    plane = {s.name: s.value for f in text_string_to_metric_families(
        httpx.get(f"{job.url}/metrics").text) for s in f.samples if not s.labels}
    assert plane["asteria_distributed_rank"] == 0
    assert plane["asteria_steps_total"] >= zero["figures"]["step"]


@pytest.mark.multiproc
def test_an_anonymous_reader_sees_no_addresses(rank1):
    rank1.write_target(1, f'- targets: ["127.0.0.1:{free_port()}"]\n  labels: {{rank: "1"}}\n')
    time.sleep(ranks_module.CACHE_SECONDS)
    view = rank1.ranks(token=None)
    assert [r["address"] for r in view["ranks"]] == [None, None]
    assert view["ranks"][1]["error"] == "unreachable"  # its kind; the full reason names hosts
    assert view["ranks"][0]["figures"]["step"] > 0


def rank_one(job, target: str | bytes) -> tuple[dict, float]:
    """Rank 1's entry after its target file holds `target`, and how long the answer took."""
    job.write_target(1, target)
    time.sleep(ranks_module.CACHE_SECONDS)
    t0 = time.monotonic()
    view = job.ranks()
    took = time.monotonic() - t0
    zero, one = view["ranks"]
    assert zero["reachable"] and zero["figures"]["step"] > 0  # rank 0 is unaffected
    assert not one["reachable"] and one["figures"] is None and one["node"] is None
    return one, took


def target(address: str, rank: str = "1") -> str:
    return f'- targets: ["{address}"]\n  labels:\n    rank: "{rank}"\n'


@pytest.mark.multiproc
def test_a_rank_that_does_not_answer_is_unreachable_not_an_error(rank1):
    one, took = rank_one(rank1, target(f"127.0.0.1:{free_port()}"))
    assert one["error"].startswith("unreachable: ConnectError")
    assert took < ranks_module.SCRAPE_SECONDS + 3
    rank1.target(1).unlink()
    time.sleep(ranks_module.CACHE_SECONDS)
    [_, missing] = rank1.ranks()["ranks"]
    assert not missing["reachable"] and missing["error"].startswith("no target file")


HOSTILE = {
    "garbage YAML": "- targets: [\"127.0.0.1:1\"\n  labels: {{{: ][",
    "binary": bytes(range(256)) * 8,
    "not a list": "targets: 127.0.0.1:9400\n",
    "a URL, not host:port": target("http://127.0.0.1:9400/metrics?x=1"),
    "a path after the port": target("127.0.0.1:9400/../admin"),
    "user info": target("user:pw@127.0.0.1:9400"),
    "no port": target("127.0.0.1"),
    "port out of range": target("127.0.0.1:70000"),
    "another rank's label": target("127.0.0.1:9400", rank="7"),
    "two targets": '- targets: ["127.0.0.1:9400", "127.0.0.1:9401"]\n  labels: {rank: "1"}\n',
    "huge": "# " + "x" * (2 * ranks_module.MAX_TARGET_BYTES) + "\n" + target("127.0.0.1:9400"),
    "deep nesting": "[" * 10_000,
    "aliases": "a: &a [1, 1, 1, 1]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\n",
}


@pytest.mark.multiproc
@pytest.mark.parametrize("content", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_target_file_is_refused_with_the_reason(rank1, content):
    one, took = rank_one(rank1, content)
    assert one["error"].startswith("target file:"), one["error"]
    assert one["address"] is None and took < ranks_module.SCRAPE_SECONDS + 3


class Answer(BaseHTTPRequestHandler):
    """A /metrics that answers what the test server's `mode` says."""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        mode = self.server.mode
        if mode == "slow":
            time.sleep(ranks_module.SCRAPE_SECONDS * 3)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        try:
            if mode == "endless":  # no length: it never ends by itself
                chunk = b"asteria_steps_total 1\n" * 4096
                while True:
                    self.wfile.write(chunk)
            elif mode == "garbage":
                self.wfile.write(b"this is {not} prometheus 1 2 3 \xff\n")
            elif mode == "nan":
                self.wfile.write(b"asteria_steps_total NaN\nasteria_device_idle_seconds_total"
                                 b'{cause="sync_wait"} +Inf\nasteria_distributed_rank 1\n')
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_rank():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.multiproc
@pytest.mark.parametrize(("mode", "reason"), [
    ("endless", "answer too large"),
    ("slow", "timed out"),
    ("garbage", "not a Prometheus exposition"),
])
def test_a_target_that_answers_badly_is_bounded(rank1, fake_rank, mode, reason):
    fake_rank.mode = mode
    one, took = rank_one(rank1, target(f"127.0.0.1:{fake_rank.server_address[1]}"))
    assert one["error"].startswith(reason), one["error"]
    assert took < ranks_module.SCRAPE_SECONDS + 3


@pytest.mark.multiproc
def test_figures_that_are_not_numbers_are_not_shown(rank1, fake_rank):
    """NaN and infinities (valid in the exposition format) never reach the JSON."""
    fake_rank.mode = "nan"
    rank1.write_target(1, target(f"127.0.0.1:{fake_rank.server_address[1]}"))
    time.sleep(ranks_module.CACHE_SECONDS)
    one = rank1.ranks()["ranks"][1]
    assert one["reachable"] and one["figures"]["step"] is None
    assert one["figures"]["idle_seconds"] == {}


@pytest.mark.multiproc
def test_a_target_of_another_run_is_not_taken_for_this_one(rank1):
    """A target file left by an earlier job names a live /metrics of another run: listed as
    such, its figures not shown as this run's."""
    other = Telemetry()
    other.bind(PhaseTimer(torch.device("cpu")), device=torch.device("cpu"),
               run_id="an-earlier-run", optimizer="soap")
    port = other.serve("127.0.0.1", 0)
    try:
        one, _ = rank_one(rank1, target(f"127.0.0.1:{port}"))
        assert one["error"].startswith("wrong run: it serves run 'an-earlier-run'")
    finally:
        other.close()


@pytest.mark.multiproc
def test_a_target_on_another_host_is_tried_within_the_timeout(rank1):
    """Ranks on other nodes advertise their own host, so any host the operator's target file
    names is scraped (192.0.2.1 is TEST-NET-1: documentation only, never routed)."""
    one, took = rank_one(rank1, target("192.0.2.1:9400"))
    assert one["address"] == "192.0.2.1:9400"
    assert one["error"].startswith(("timed out", "unreachable")), one["error"]
    assert took < ranks_module.SCRAPE_SECONDS + 3

