"""The server killed with SIGKILL mid-run loses neither the run's history nor its checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.backend.conftest import TOKEN, free_port, wait_for
from tests.procs import alive, descendants

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


def _serve(data_dir, port, *args):
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN}
    return subprocess.Popen(
        [sys.executable, "-m", "backend.cli", "serve", "--port", str(port), "--data-dir",
         str(data_dir), *TINY_ARGS, *args], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


def _kill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)


def test_a_change_answered_200_survives_kill_9_and_the_resumed_run_applies_it(server_factory,
                                                                              tmp_path):
    """A PATCH answered 200 while the run is paused (so no step boundary applies it), then
    SIGKILL: after a restart the change is in the history, and the resumed run trains under it
    from its first step; steps.jsonl holds each step once although steps after the checkpoint
    were written before the crash and trained again after it."""
    data_dir, port = tmp_path / "data", free_port()
    proc = _serve(data_dir, port)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        base = f"http://127.0.0.1:{port}"
        run_id = wait_for(lambda: (h := _get(f"{base}/healthz")) and h["active_run"], 120)
        wait_for(lambda: ((_get(f"{base}/runs/{run_id}") or {}).get("checkpoint_step") or 0)
                 >= 20, 120)
        assert httpx.post(f"{base}/runs/{run_id}/pause", headers=auth).status_code == 202
        wait_for(lambda: _get(f"{base}/runs/{run_id}")["status"] == "paused")
        crashed_at = _get(f"{base}/runs/{run_id}")["step"]
        r = httpx.patch(f"{base}/runs/{run_id}/policy", json={"staleness_bound": 3},
                        headers=auth)
        assert r.status_code == 200 and r.json()["version"] == 2, r.text
    finally:
        _kill(proc)

    with server_factory(data_dir=data_dir) as live, httpx.Client(
            base_url=live.url, headers=auth) as c:
        [pending] = c.get(f"/runs/{run_id}/policy/history").json()
        assert pending["version"] == 2 and pending["applied_at"] is None
        checkpoint = c.get(f"/runs/{run_id}").json()["checkpoint_step"]
        assert checkpoint < crashed_at  # steps after it were trained, and are trained again
        assert c.post(f"/runs/{run_id}/resume").status_code == 202
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["step"] >= crashed_at + 5)
        policy = c.get(f"/runs/{run_id}/policy").json()
        assert policy["version"] == 2 and policy["policy"]["staleness_bound"] == 3
        [change] = c.get(f"/runs/{run_id}/policy/history").json()
        assert change["applied_at"] is not None and change["effective_step"] == checkpoint + 1
        c.post(f"/runs/{run_id}/stop")
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped")
        steps = c.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
        assert {s["policy_version"] for s in steps if s["step"] > checkpoint} == {2}
        run_dir = Path(c.get(f"/runs/{run_id}").json()["run_dir"])
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    written = [json.loads(line)["step"] for line in lines]
    assert written == list(range(1, len(written) + 1)) and len(written) == steps[-1]["step"]


def test_kill_9_of_the_server_leaves_no_worker_process_behind(tmp_path):
    """The run refreshes on a worker process; SIGKILL of the server (no cleanup runs) must not
    orphan it, nor multiprocessing's resource tracker."""
    port = free_port()
    proc = _serve(tmp_path / "data", port, "--optim.name", "soap", "--policy.workers", "1",
                  "--policy.worker_kind", "process")
    try:
        base = f"http://127.0.0.1:{port}"
        run_id = wait_for(lambda: (h := _get(f"{base}/healthz")) and h["active_run"], 120)
        wait_for(lambda: (_get(f"{base}/runs/{run_id}") or {}).get("step", 0) >= 20, 120)
        # the worker process and the resource tracker, at least
        below = wait_for(lambda: len(d := {p for p in descendants(proc.pid) if alive(p)}) >= 2
                         and d, 60)
    finally:
        _kill(proc)
    wait_for(lambda: not any(alive(pid) for pid in below), 30)
