"""examples/ddp_loop.py under real torchrun with 2 ranks, left training: rank 0 serves the
control plane (`backend.serve`), rank 1 its own /metrics and its file_sd target file under the
control plane's data dir. For the per-rank view's tests (backend and dashboard). Launched
through ddp_paced.py: the example unchanged, its steps paced so the job idles between them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.backend.conftest import TOKEN, free_port
from tests.procs import alive, descendants

PACED = Path(__file__).with_name("ddp_paced.py")
START_SECONDS = 240


@dataclass
class DdpExample:
    url: str
    """Rank 0's control plane."""
    run_id: str
    data: Path
    """The control plane's data dir; the ranks' target files are in its targets/."""
    log: Path

    def target(self, rank: int) -> Path:
        return self.data / "targets" / f"asteria-rank{rank}.yml"

    def write_target(self, rank: int, content: str | bytes) -> None:
        """Replace a rank's target file at once, as serve_rank_metrics writes it."""
        scratch = self.target(rank).with_suffix(".tmp")
        scratch.write_bytes(content.encode() if isinstance(content, str) else content)
        os.replace(scratch, self.target(rank))

    def ranks(self, token: str | None = TOKEN) -> dict:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = httpx.get(f"{self.url}/runs/{self.run_id}/ranks", headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()


def _get(url: str) -> dict | None:
    try:
        return httpx.get(url, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM torchrun (it stops its workers); whatever of ours still runs after 60 s is
    killed by its pid."""
    ours = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in ours) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in ours:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def ddp_example(folder: Path) -> Iterator[DdpExample]:
    """The example on 2 ranks, training until the block ends; yields once both ranks have
    stepped and rank 1's target file names its /metrics."""
    data, log = folder / "data", folder / "ddp.log"
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN, "ASTERIA_STORE_FLUSH_SECONDS": "0.1",
           "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
             "--master-port", str(free_port()), str(PACED), "--steps", "10000000",
             "--port", "0", "--metrics-port", "0", "--data-dir", str(data)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + START_SECONDS
        url = run_id = None
        while run_id is None or not (data / "targets" / "asteria-rank1.yml").exists():
            assert proc.poll() is None, f"the job ended: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not started: {log.read_text()[-3000:]}"
            time.sleep(0.5)
            # Port 0: rank 0 binds a free port itself and prints its URL (no port to race for).
            url = url or next(iter(re.findall(r"control plane on (http://\S+)",
                                              log.read_text())), None)
            run_id = url and (_get(f"{url}/healthz") or {}).get("active_run")
        job = DdpExample(url, run_id, data, log)
        while not all(r["reachable"] and r["figures"]["step"] for r in job.ranks()["ranks"]):
            assert time.monotonic() < deadline, f"ranks not stepping: {job.ranks()}"
            time.sleep(0.5)
        yield job
    finally:
        _stop(proc)
