"""What a terminal shows of `torchrun -m asteria train --control-port`: rank 0's progress
line, with its log lines written above the bar and never into it; no line per HTTP request
(rank 0 scraping rank 1's /metrics for GET /runs/{id}/ranks); the other ranks' routine lines
(energy sources, the loss target reached with its energy) not at all. And /metrics: rank 0's is
the control plane's, rank r > 0 serves its own on --metrics-port + r, nothing on the base port.
Real processes: torchrun, 2 ranks on gloo, the run stopped through the API."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.backend.conftest import free_port
from tests.dashboard.stack import wait_until

pytestmark = pytest.mark.multiproc
ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.threads", "1",
        "--train.steps", "1000000", "--train.eval_interval", "10", "--train.eval_batches", "2",
        "--optim.name", "soap", "--policy.workers", "1",
        "--telemetry.target_loss", "100"]  # reached at the first evaluation: a logged line


def free_pair() -> int:
    """A free port whose next one is free too (base + 0, base + 1)."""
    for _ in range(100):
        base = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise AssertionError("no two consecutive free ports")


def serves(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run, stopped through rank 0's control plane after rank 1 was scraped for /ranks:
    (everything the terminal got, the data dir, the metrics base port, what was seen live)."""
    data, out = tmp_path_factory.mktemp("data"), tmp_path_factory.mktemp("runs")
    base = free_pair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "asteria",
         "train", *TINY, "--train.out_dir", str(out), "--control-port", "0", "--metrics-port",
         str(base), "--data-dir", str(data)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # bytes: \r kept as is
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read1(),
                                                                  b"")), daemon=True)
    reader.start()
    seen = {}

    def output() -> str:
        return b"".join(chunks).decode(errors="replace")

    try:
        found = wait_until(lambda: re.search(r"control plane on (http://\S+) ", output()),
                           240, 0.2, "the control plane's address")
        api = found.group(1)
        run_id = wait_until(lambda: httpx.get(f"{api}/healthz").json()["active_run"], 60, 0.2,
                            "the active run")
        wait_until(lambda: httpx.get(f"{api}/runs/{run_id}").json()["step"] > 25, 180, 0.2,
                   "steps past two evaluations")
        ranks = wait_until(lambda: (v := httpx.get(f"{api}/runs/{run_id}/ranks").json())
                           ["ranks"] and all(r["reachable"] for r in v["ranks"]) and v,
                           60, 0.5, "both ranks' figures")
        seen["ranks"] = [r["source"] for r in ranks["ranks"]]
        seen["control plane metrics"] = serves(f"{api}/metrics")
        seen["base port"] = serves(f"http://127.0.0.1:{base}/metrics")
        seen["base port + 1"] = serves(f"http://127.0.0.1:{base + 1}/metrics")
        token = (data / "token").read_text().strip()
        stopped = httpx.post(f"{api}/runs/{run_id}/stop",
                             headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert stopped.status_code == 202, stopped.text
        assert proc.wait(180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
    return output(), data, base, seen


def segments(output: str) -> list[str]:
    """What the terminal shows as separate lines: the bar redraws itself after a carriage
    return, a log line ends with a newline."""
    return [s for s in re.split(r"[\r\n]", output) if s.strip()]


def test_log_lines_stand_above_the_progress_bar_never_inside_it(run):
    output = run[0]
    assert re.search(r"\d+/1000000 .*loss=", output), output[-2000:]  # the bar is drawn
    logged = [s for s in segments(output) if re.search(r"\b(INFO|WARNING) asteria", s)]
    assert logged, output[-2000:]
    assert all(re.match(r"(INFO|WARNING) asteria", s) for s in logged), logged


def test_no_line_per_http_request(run):
    output, _, _, seen = run
    assert seen["ranks"] == ["control plane", "scrape"]  # rank 0 did scrape rank 1 over HTTP
    assert "httpx" not in output and "HTTP Request" not in output


def test_other_ranks_print_nothing_routine(run):
    output = run[0]
    assert output.count("reached the target") == 1, output[-3000:]  # rank 0's, not every rank's
    for source in ("nvml", "rapl"):
        assert output.count(f"energy source {source} unavailable") <= 1
    assert "rank 1:" not in output
    assert output.count("asteria: run ") == 1


def test_rank_0s_metrics_are_the_control_planes_and_rank_r_serves_base_plus_r(run):
    output, data, base, seen = run
    assert seen["control plane metrics"] and seen["base port + 1"]
    assert not seen["base port"]  # rank 0 does not serve a second /metrics
    assert f"of rank r > 0 on 127.0.0.1, port {base} + r" in output
    assert f'127.0.0.1:{base + 1}"' in (data / "targets" / "asteria-rank1.yml").read_text()
    assert not (data / "targets" / "asteria-rank0.yml").exists()
