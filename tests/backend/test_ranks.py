"""GET /runs/{id}/ranks over real HTTP.

A single-process run has no ranks to list. A data-parallel run is examples/ddp_loop.py under
real torchrun on 2 ranks: rank 0's control plane lists rank 0 from its own telemetry and rank 1
from rank 1's /metrics, found through the file_sd target file rank 1 wrote. Then rank 1's target
file is replaced by what a broken or hostile one could hold (a closed port, garbage, a URL, a
huge file, a server that answers too much, too slowly, not Prometheus, or another run): rank 1
is listed without figures and with the reason, rank 0 keeps its figures, the endpoint answers
200 (the wall-clock bounds here are hang guards for a loaded machine, not targets).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

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

HANG_GUARD = 60
"""Seconds: an answer that takes longer hangs (each scrape is bounded at SCRAPE_SECONDS)."""
ROOT = Path(__file__).resolve().parents[2]


def billion_laughs(levels: int = 8) -> str:
    """A file_sd-shaped target of under 500 bytes whose rank label stands for 9**levels
    strings: whoever walks it (str() of the label) builds them all."""
    lines = ['- targets: ["127.0.0.1:9400"]', "  labels:",
             '    l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    lines.append(f"    rank: *l{levels - 1}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- target files

READ_BOMB = """
import json, resource, sys, time
from pathlib import Path
from backend import ranks

def memory(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

# the old reader built the bomb's values: let it fail here rather than take the machine
resource.setrlimit(resource.RLIMIT_AS, (memory("VmSize") + (1 << 30),) * 2)
before = memory("VmRSS")
t0 = time.monotonic()
address, error = ranks.read_target(Path(sys.argv[1]), 1)
print(json.dumps({"address": address, "error": error, "seconds": time.monotonic() - t0,
                  "grown": memory("VmHWM") - before}))
"""


def test_a_billion_laughs_target_file_is_refused_before_it_is_built(tmp_path):
    """The bomb is refused from its YAML events: nothing is built, no memory grows."""
    (tmp_path / "asteria-rank1.yml").write_text(billion_laughs())
    assert len(billion_laughs().encode()) < 500
    run = subprocess.run([sys.executable, "-c", READ_BOMB, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=HANG_GUARD,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    answer = json.loads(run.stdout)
    assert answer["address"] is None
    assert answer["error"] == ("target file: targets/asteria-rank1.yml uses YAML anchors or "
                               "aliases")
    assert answer["grown"] < 32 << 20, answer  # bytes; building the bomb takes gigabytes
    assert answer["seconds"] < HANG_GUARD


@pytest.mark.parametrize(("content", "reason"), [
    ("a: &x 1\nb: 2\n", "uses YAML anchors or aliases"),  # an anchor alone, never used
    ("[" * 10_000, "nests deeper than 8 levels"),
    ("[" + "1, " * 1000 + "]", "holds more than 256 values"),
    ("rank: " + "9" * 5000, "is not YAML (ValueError)"),
])
def test_a_target_file_that_is_not_small_plain_data_is_refused(tmp_path, content, reason):
    (tmp_path / "asteria-rank1.yml").write_text(content)
    address, error = ranks_module.read_target(tmp_path, 1)
    assert address is None and error == f"target file: targets/asteria-rank1.yml {reason}"


def test_a_target_file_is_parsed_again_only_when_it_changes(tmp_path):
    """Keyed by the file's mtime, size and inode: content rewritten in place at the same size
    and mtime is not read again (which shows the cache); a new file or size is."""
    path = tmp_path / "asteria-rank1.yml"
    path.write_text(target("127.0.0.1:9401"))
    files = ranks_module.TargetFiles(tmp_path)
    assert files.address(1) == ("127.0.0.1:9401", None)
    stat = path.stat()
    with path.open("r+") as f:  # same inode, same size
        f.write(target("127.0.0.1:9402"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert files.address(1) == ("127.0.0.1:9401", None)
    path.write_text(target("127.0.0.1:940"))  # another size
    assert files.address(1) == ("127.0.0.1:940", None)
    replacement = tmp_path / "scratch"
    replacement.write_text(target("127.0.0.1:9403"))
    os.replace(replacement, path)  # as serve_rank_metrics writes it: another inode
    assert files.address(1) == ("127.0.0.1:9403", None)
    path.unlink()
    assert files.address(1)[1].startswith("no target file")

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
    """Rank 1's target file, put back as rank 1 wrote it after the test. No wait for the
    control plane's cache here: every test that takes this fixture writes its own target and
    waits CACHE_SECONDS before it reads the view (test_every_rank_is_listed_with_its_figures
    polls until both ranks have figures)."""
    written = job.target(1).read_bytes()
    yield job
    job.write_target(1, written)


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
    assert took < HANG_GUARD
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
    "billion laughs": billion_laughs(),
}
REASONS = {"huge": "is larger than", "deep nesting": "nests deeper than",
           "aliases": "uses YAML anchors or aliases",
           "billion laughs": "uses YAML anchors or aliases"}


@pytest.mark.multiproc
@pytest.mark.parametrize(("name", "content"), HOSTILE.items(), ids=HOSTILE.keys())
def test_a_hostile_target_file_is_refused_with_the_reason(rank1, name, content):
    one, took = rank_one(rank1, content)
    assert one["error"].startswith("target file:"), one["error"]
    assert REASONS.get(name, "") in one["error"], one["error"]
    assert one["address"] is None and took < HANG_GUARD


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
    assert took < HANG_GUARD


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
    assert took < HANG_GUARD

