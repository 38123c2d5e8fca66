"""Run folders: named relative to the data folder (a copy of it trains in its own folders, rows
an older store wrote included), locked while a process trains in one (a second server is
refused, and a killed one leaves no lock behind), and shown as the real folder's path."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.backend.conftest import TINY, TOKEN, free_port, wait_for

HANG = 300
"""Seconds: a hang guard for a loaded machine, never a target."""
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = {**TINY, "train": {**TINY["train"], "checkpoint_interval": 5}}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stored_run_dir(database: Path, run_id: str) -> str:
    with sqlite3.connect(database) as db:
        value = db.execute("SELECT run_dir FROM runs WHERE id=?", (run_id,)).fetchone()[0]
    db.close()
    return value


def _train_and_stop(c: httpx.Client, run_id: str, steps: int) -> None:
    wait_for(lambda: (c.get(f"/runs/{run_id}").json()["checkpoint_step"] or 0) >= steps, HANG)
    c.post(f"/runs/{run_id}/stop")
    wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)


def test_a_copied_data_folder_resumes_into_its_own_run_folder(server_factory, tmp_path):
    original, copy = tmp_path / "data", tmp_path / "copy"
    with server_factory(data_dir=original) as live, httpx.Client(
            base_url=live.url, headers=AUTH, timeout=HANG) as c:
        run_id = c.post("/runs", json={"config": CONFIG}).json()["id"]
        _train_and_stop(c, run_id, 10)
        run = c.get(f"/runs/{run_id}").json()
        folder = original.absolute() / "runs" / run_id
        assert run["run_dir"] == str(folder) and (folder / "checkpoint.pt").is_file()
        anonymous = httpx.get(f"{live.url}/runs/{run_id}", timeout=HANG).json()
        assert anonymous["run_dir"] == f"runs/{run_id}"
    database = original / "asteria.db"
    assert _stored_run_dir(database, run_id) == f"runs/{run_id}"
    with sqlite3.connect(database) as db:  # as an older store named it: by absolute path
        db.execute("UPDATE runs SET run_dir=? WHERE id=?", (str(folder), run_id))
    db.close()
    shutil.copytree(original, copy)
    kept = _digest(folder / "checkpoint.pt")

    with server_factory(data_dir=copy) as live, httpx.Client(
            base_url=live.url, headers=AUTH, timeout=HANG) as c:
        assert c.get(f"/runs/{run_id}").json()["run_dir"] == str(copy.absolute() / "runs" /
                                                                  run_id)
        assert c.post(f"/runs/{run_id}/resume").status_code == 202
        start = c.get(f"/runs/{run_id}").json()["step"]
        _train_and_stop(c, run_id, start + 5)
    assert _stored_run_dir(copy / "asteria.db", run_id) == f"runs/{run_id}"
    assert _digest(folder / "checkpoint.pt") == kept  # the original's folder untouched
    assert _digest(copy / "runs" / run_id / "checkpoint.pt") != kept


def _serve(data_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN}
    return subprocess.Popen(
        [sys.executable, "-m", "asteria", "serve", "--port", str(port), "--data-dir",
         str(data_dir), "--model.n_layer", "2", "--model.n_head", "2", "--model.n_embd", "32",
         "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", "100000",
         "--train.eval_interval", "1000", "--train.checkpoint_interval", "5",
         "--train.threads", "1"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


def test_a_second_server_may_not_train_in_a_run_folder_another_trains_in(server_factory,
                                                                          tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    first = _serve(data_dir, port)
    try:
        base = f"http://127.0.0.1:{port}"

        def active():
            try:
                return httpx.get(f"{base}/healthz", timeout=30).json()["active_run"]
            except httpx.HTTPError:
                return None

        run_id = wait_for(active, HANG)
        wait_for(lambda: (httpx.get(f"{base}/runs/{run_id}", timeout=30).json()
                          ["checkpoint_step"] or 0) >= 5, HANG)
        with server_factory(data_dir=data_dir) as live, httpx.Client(
                base_url=live.url, headers=AUTH, timeout=HANG) as c:
            # the second server takes the first's active run for interrupted (one store)
            refused = c.post(f"/runs/{run_id}/resume")
            assert refused.status_code == 409, refused.text
            assert f"process {first.pid}" in refused.text and "in use" in refused.text
            assert c.get("/healthz").json()["active_run"] is None
            os.kill(first.pid, signal.SIGKILL)  # the kernel drops a dead process's lock
            first.wait(30)
            time.sleep(0.1)
            assert c.post(f"/runs/{run_id}/resume").status_code == 202
            c.post(f"/runs/{run_id}/stop")
            wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(30)
