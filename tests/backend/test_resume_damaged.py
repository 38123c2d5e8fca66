"""POST /runs/{id}/resume checks the run's checkpoints as the trainer will before accepting: no
usable one is a 409 that names the files and says what to do (the run is left as it was); a
damaged newest one beside a good one kept before it is accepted, and the answer says the run
continues from that older step."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from asteria_core.train import checkpoint as ckpt
from tests.backend.conftest import TINY, TOKEN, wait_for

HANG = 300
"""Seconds: a hang guard for a loaded machine, never a target."""
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = {**TINY, "train": {**TINY["train"], "checkpoint_interval": 5}}


def _damage(path: Path) -> None:
    """Real byte damage: 50 bytes in the middle of the file XOR 0xFF, written in place."""
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        chunk = f.read(50)
        f.seek(-len(chunk), 1)
        f.write(bytes(b ^ 0xFF for b in chunk))


def test_resume_refuses_a_run_with_no_usable_checkpoint_and_says_when_it_takes_the_older(
        server_factory, tmp_path):
    with server_factory() as live, httpx.Client(base_url=live.url, headers=AUTH,
                                                 timeout=HANG) as c:
        run_id = c.post("/runs", json={"config": CONFIG}).json()["id"]
        wait_for(lambda: (c.get(f"/runs/{run_id}").json()["checkpoint_step"] or 0) >= 10, HANG)
        c.post(f"/runs/{run_id}/stop")
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)
        newest = Path(c.get(f"/runs/{run_id}").json()["run_dir"]) / ckpt.CHECKPOINT_NAME
        older = ckpt.previous_path(newest)
        newest_step, older_step = (int(ckpt.load(p)["step"]) for p in (newest, older))
        assert older_step < newest_step
        copy = tmp_path / "older-copy.pt"
        shutil.copyfile(older, copy)

        _damage(newest)
        _damage(older)
        refused = c.post(f"/runs/{run_id}/resume")
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert f"{newest} is damaged" in detail and f"{older} is damaged" in detail, detail
        assert "restore" in detail and "afresh" in detail, detail
        assert c.get(f"/runs/{run_id}").json()["status"] == "stopped"
        assert c.get("/healthz").json()["active_run"] is None

        shutil.copyfile(copy, older)  # as the refusal says: the older one from a copy
        accepted = c.post(f"/runs/{run_id}/resume")
        assert accepted.status_code == 202, accepted.text
        detail = accepted.json()["detail"]
        assert f"continues from its checkpoint of step {older_step}" in detail, detail
        assert f"{newest} is damaged" in detail, detail
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["step"] > older_step, HANG)
        c.post(f"/runs/{run_id}/stop")
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)
        assert newest.with_name("checkpoint.pt.damaged").is_file()
        assert ckpt.verify(newest)
