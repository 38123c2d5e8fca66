"""A run that dies because the disk is full is not left `running`, for real:
the control plane's run store and its run folders are on two small tmpfs mounted for the test
(root only), both then filled to their last byte. Two, because a run that dies removes its
half-written checkpoint: on one file system that frees room the store's status write could use.

The run dies; the store cannot write that it did, yet no read reports it running: the status it
ended with is kept and written once the disk has room again, and the run resumes from its last
checkpoint without a restart of the server.
"""

from __future__ import annotations

import sqlite3

import httpx

from tests.asteria_core.tiers.test_disk_full import fill, tmpfs
from tests.backend.conftest import TINY, TOKEN, wait_for

HANG = 300
"""Seconds: a hang guard for a loaded machine (the waits end on behaviour)."""


def stored_status(database, run_id: str) -> str:
    with sqlite3.connect(database) as db:
        status = db.execute("SELECT status FROM runs WHERE id=?", (run_id,)).fetchone()[0]
    db.close()
    return status


def test_a_run_that_dies_on_a_full_disk_is_not_left_running(server_factory, tmp_path):
    config = {**TINY, "train": {**TINY["train"], "checkpoint_interval": 5}}
    with tmpfs(tmp_path / "fs", "8m") as fs, tmpfs(tmp_path / "db", "8m") as db, \
            server_factory(data_dir=fs / "data", db_path=db / "asteria.db") as live, \
            httpx.Client(base_url=live.url, timeout=60,
                         headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        database = live.settings.resolved_db_path
        run_id = client.post("/runs", json={"config": config}).json()["id"]
        wait_for(lambda: (client.get(f"/runs/{run_id}").json()["checkpoint_step"] or 0) >= 5,
                 HANG)
        fill(db)
        fill(fs)
        # The run dies (its records and next checkpoint do not fit); nothing trains it now.
        wait_for(lambda: client.get("/healthz").json()["active_run"] is None, HANG)
        run = client.get(f"/runs/{run_id}").json()
        assert run["status"] == "failed", run
        assert "No space left on device" in run["error"], run["error"]
        assert [r["status"] for r in client.get("/runs").json()] == ["failed"]
        assert stored_status(database, run_id) == "running"  # the write did not fit
        checkpoint = run["checkpoint_step"]
        # with the disk still full, a resume is refused whole: nothing is launched
        refused = client.post(f"/runs/{run_id}/resume")
        assert refused.status_code == 503 and "could not write" in refused.text, refused.text
        assert refused.headers["Retry-After"].isdigit()
        assert client.get("/healthz").json()["active_run"] is None

        (db / "filler").unlink()  # room again: the store writes what it could not
        (fs / "filler").unlink()
        wait_for(lambda: client.get(f"/runs/{run_id}").json() and
                 stored_status(database, run_id) == "failed", HANG)
        r = client.post(f"/runs/{run_id}/resume")
        assert r.status_code == 202, r.text
        assert r.json()["run"]["status"] == "running"
        wait_for(lambda: client.get(f"/runs/{run_id}").json()["step"] >= checkpoint + 3, HANG)
        client.post(f"/runs/{run_id}/stop")
        wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)
        steps = client.get(f"/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
        assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
        assert stored_status(database, run_id) == "stopped"
