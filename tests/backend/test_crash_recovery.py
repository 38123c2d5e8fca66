"""The server killed with SIGKILL mid-run loses neither the run's history nor its checkpoint."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.backend.conftest import TINY, TOKEN, free_port, wait_for
from tests.procs import alive, descendants

HANG = 300
"""Seconds: a hang guard for a loaded machine, never a target (the waits end on behaviour)."""

TINY_ARGS = ["--model.n_layer", "2", "--model.n_head", "2", "--model.n_embd", "32",
             "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", "100000",
             "--train.eval_interval", "1000", "--train.eval_batches", "2",
             "--train.checkpoint_interval", "20", "--train.threads", "1"]


def _get(url):
    try:
        return httpx.get(url, timeout=30).json()
    except httpx.HTTPError:
        return None


def _run(base, run_id) -> dict:
    return _get(f"{base}/runs/{run_id}") or {}


def test_sigkill_mid_run_then_restart_shows_interrupted_and_resumes(server_factory, tmp_path):
    data_dir = tmp_path / "data"
    port = free_port()
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN, "ASTERIA_STORE_FLUSH_SECONDS": "0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asteria", "serve", "--port", str(port), "--data-dir",
         str(data_dir), *TINY_ARGS], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        run_id = wait_for(lambda: (h := _get(f"{base}/healthz")) and h["active_run"], HANG)
        wait_for(lambda: (_run(base, run_id).get("checkpoint_step") or 0) >= 40, HANG)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    with server_factory(data_dir=data_dir) as live, httpx.Client(
            base_url=live.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as c:
        run = c.get(f"/runs/{run_id}").json()
        assert run["status"] == "interrupted"
        checkpoint_step = run["checkpoint_step"]
        assert checkpoint_step >= 40 and checkpoint_step % 20 == 0
        steps = c.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
        flushed = [s["step"] for s in steps]
        assert flushed == list(range(1, len(flushed) + 1)) and len(flushed) >= checkpoint_step

        resumed_at = time.time()
        r = c.post(f"/runs/{run_id}/resume")
        assert r.status_code == 202
        # the steps after the checkpoint are trained again: the run is at its checkpoint
        assert r.json()["run"]["step"] == checkpoint_step
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["step"] >= checkpoint_step + 3, HANG)
        c.post(f"/runs/{run_id}/stop")
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)
        final = c.get(f"/runs/{run_id}").json()
        records = c.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
    # The resumed run continued from the checkpoint: the checkpoint's step and those before
    # are from before the crash, every later one was trained again after the resume; no step
    # is missing or twice, and the run's step is its newest record's.
    assert [r["step"] for r in records] == list(range(1, final["step"] + 1))
    assert final["step"] >= checkpoint_step + 3
    assert all(r["time"] < resumed_at for r in records[:checkpoint_step])
    assert all(r["time"] > resumed_at for r in records[checkpoint_step:])


def _serve(data_dir, port, *args):
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN}
    return subprocess.Popen(
        [sys.executable, "-m", "asteria", "serve", "--port", str(port), "--data-dir",
         str(data_dir), *TINY_ARGS, *args], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


def _kill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)


def test_a_change_answered_200_survives_kill_9_and_the_resumed_run_applies_it(server_factory,
                                                                              tmp_path):
    """A PATCH answered 200 while the run is paused (so no step boundary applies it), then
    SIGKILL: after a restart the change is in the history, and the resumed run trains under it
    from the step its PATCH answered (the steps before it as the first run trained them);
    steps.jsonl holds each step once although steps after the checkpoint were written before
    the crash and trained again after it."""
    data_dir, port = tmp_path / "data", free_port()
    proc = _serve(data_dir, port)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        base = f"http://127.0.0.1:{port}"
        run_id = wait_for(lambda: (h := _get(f"{base}/healthz")) and h["active_run"], HANG)
        wait_for(lambda: (_run(base, run_id).get("checkpoint_step") or 0) >= 20, HANG)
        assert httpx.post(f"{base}/runs/{run_id}/pause", headers=auth,
                          timeout=60).status_code == 202
        wait_for(lambda: _run(base, run_id).get("status") == "paused", HANG)
        crashed_at = _run(base, run_id)["step"]
        r = httpx.patch(f"{base}/runs/{run_id}/policy", json={"staleness_bound": 3},
                        headers=auth, timeout=60)
        assert r.status_code == 200 and r.json()["version"] == 2, r.text
        promised = r.json()["effective_step"]
        assert promised > crashed_at
    finally:
        _kill(proc)

    with server_factory(data_dir=data_dir) as live, httpx.Client(
            base_url=live.url, headers=auth, timeout=60) as c:
        [pending] = c.get(f"/runs/{run_id}/policy/history").json()
        assert pending["version"] == 2 and pending["applied_at"] is None
        assert pending["effective_step"] == promised
        checkpoint = c.get(f"/runs/{run_id}").json()["checkpoint_step"]
        assert checkpoint < crashed_at  # steps after it were trained, and are trained again
        r = c.post(f"/runs/{run_id}/resume")
        assert r.status_code == 202 and r.json()["run"]["step"] == checkpoint
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["step"] >= promised + 5, HANG)
        policy = c.get(f"/runs/{run_id}/policy").json()
        assert policy["version"] == 2 and policy["policy"]["staleness_bound"] == 3
        # the audit rides the record path and the store's batched writer: applied_at lands
        # a flush after the boundary that applied it (steps of this tiny model are faster)
        [change] = wait_for(lambda: (h := c.get(f"/runs/{run_id}/policy/history").json())
                            and h[0]["applied_at"] is not None and h, HANG)
        assert change["effective_step"] == promised
        # applied after the resume, asked for before the crash: the audit keeps when it was asked
        assert change["requested_at"] == pending["requested_at"]
        assert change["applied_at"] > change["requested_at"]
        c.post(f"/runs/{run_id}/stop")
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)
        steps = c.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
        versions = {s["step"]: s["policy_version"] for s in steps}
        assert {versions[s] for s in range(checkpoint + 1, promised)} == {1}
        assert {v for s, v in versions.items() if s >= promised} == {2}
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
        run_id = wait_for(lambda: (h := _get(f"{base}/healthz")) and h["active_run"], HANG)
        wait_for(lambda: _run(base, run_id).get("step", 0) >= 20, HANG)
        # the worker process and the resource tracker, at least
        below = wait_for(lambda: len(d := {p for p in descendants(proc.pid) if alive(p)}) >= 2
                         and d, HANG)
    finally:
        _kill(proc)
    wait_for(lambda: not any(alive(pid) for pid in below), HANG)


def test_records_the_store_had_not_written_at_a_crash_come_back_on_resume(server_factory):
    """A crash between a checkpoint file and the store's next batch leaves the store behind
    the checkpoint: records up to it missing, its checkpoint_step the one before. That store is
    made here from a stopped run, edited as such a crash leaves it. The resume takes the
    missing records from the run's steps.jsonl: no step is missing or twice."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with server_factory() as live, httpx.Client(base_url=live.url, headers=auth,
                                                timeout=60) as c:
        run_id = c.post("/runs", json={"config": TINY}).json()["id"]
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["step"] >= 12, HANG)
        c.post(f"/runs/{run_id}/stop")
        stopped = wait_for(lambda: (r := c.get(f"/runs/{run_id}").json())["status"] ==
                           "stopped" and r, HANG)
        checkpoint = stopped["checkpoint_step"]
        assert checkpoint == stopped["step"] >= 12
        database = live.settings.resolved_db_path
    behind = checkpoint - 5
    with sqlite3.connect(database) as db:
        db.execute("DELETE FROM steps WHERE run_id=? AND step>?", (run_id, behind))
        db.execute("UPDATE runs SET step=?, checkpoint_step=?, status='interrupted' WHERE id=?",
                   (behind, behind - 1, run_id))
    db.close()

    with server_factory() as live, httpx.Client(base_url=live.url, headers=auth,
                                                timeout=60) as c:
        resumed_at = time.time()
        assert c.post(f"/runs/{run_id}/resume").status_code == 202
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["step"] >= checkpoint + 3, HANG)
        c.post(f"/runs/{run_id}/stop")
        final = wait_for(lambda: (r := c.get(f"/runs/{run_id}").json())["status"] ==
                         "stopped" and r, HANG)
        records = c.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
    assert [r["step"] for r in records] == list(range(1, final["step"] + 1))
    assert all(r["time"] < resumed_at for r in records[:checkpoint])  # kept or restored
    assert all(r["time"] > resumed_at for r in records[checkpoint:])  # trained again
