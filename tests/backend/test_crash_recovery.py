"""The server killed with SIGKILL mid-run loses neither the run's history nor its checkpoint."""

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.backend.conftest import TOKEN, free_port, wait_for

TINY_ARGS = ["--model.n_layer", "2", "--model.n_head", "2", "--model.n_embd", "32",
             "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", "100000",
             "--train.eval_interval", "1000", "--train.eval_batches", "2",
             "--train.checkpoint_interval", "20", "--train.threads", "1"]


def _get(url):
    try:
        return httpx.get(url, timeout=5).json()
    except httpx.HTTPError:
        return None


def test_sigkill_mid_run_then_restart_shows_interrupted_and_resumes(server_factory, tmp_path):
    data_dir = tmp_path / "data"
    port = free_port()
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend.cli", "serve", "--port", str(port), "--data-dir",
         str(data_dir), *TINY_ARGS], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        run_id = wait_for(lambda: (h := _get(f"{base}/healthz")) and h["active_run"], 120)
        wait_for(lambda: ((_get(f"{base}/runs/{run_id}") or {}).get("checkpoint_step") or 0)
                 >= 40, 120)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    with server_factory(data_dir=data_dir) as live, httpx.Client(
            base_url=live.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        run = c.get(f"/runs/{run_id}").json()
        assert run["status"] == "interrupted"
        checkpoint_step = run["checkpoint_step"]
        assert checkpoint_step >= 40 and checkpoint_step % 20 == 0
        steps = c.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
        flushed = [s["step"] for s in steps]
        assert flushed == list(range(1, len(flushed) + 1)) and len(flushed) >= checkpoint_step

        resumed_at = time.time()
        assert c.post(f"/runs/{run_id}/resume").status_code == 202
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["step"] >= checkpoint_step + 5)
        c.post(f"/runs/{run_id}/stop")
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped")
        records = c.get(f"/runs/{run_id}/steps", params={"since": checkpoint_step - 1,
                                                         "limit": 3}).json()["steps"]
        # The resumed run continued from the checkpoint: the checkpoint's step is from before
        # the crash, every later one was trained again after the resume, without a gap.
        assert [r["step"] for r in records] == [checkpoint_step, checkpoint_step + 1,
                                                checkpoint_step + 2]
        assert records[0]["time"] < resumed_at < records[1]["time"]
