"""A damaged or vanished run store is refused at start, with what to do, by a real server
process: never served empty beside its run folders, never served to answer 500 on reads."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from backend.store import RunStore
from tests.backend.conftest import TOKEN, free_port

START_GUARD = 120
"""Seconds a refused server may take to exit (a hang guard)."""


def _made_store(data_dir: Path) -> Path:
    """A data folder as a server leaves it: a store with a run and its records, and the
    run's folder with a checkpoint and steps.jsonl beside it."""
    path = data_dir / "asteria.db"
    store = RunStore(path, flush_seconds=0.05)
    folder = data_dir / "runs" / "r1"
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(b"\0" * 64)
    (folder / "steps.jsonl").write_text('{"step": 1}\n')
    store.create_run("r1", {}, str(folder), 500)
    for step in range(1, 400):
        store.add_step("r1", step, json.dumps({"step": step, "loss": 1.0, "pad": "x" * 200}))
    store.close()
    with sqlite3.connect(path) as db:  # everything into the main file, as after a clean end
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path


def _serve_and_fail(data_dir: Path) -> str:
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN}
    proc = subprocess.run(
        [sys.executable, "-m", "asteria", "serve", "--port", str(free_port()), "--data-dir",
         str(data_dir), "--train.steps", "5"], env=env, capture_output=True, text=True,
        timeout=START_GUARD)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def _flip(path: Path, count: int, seed: int = 0) -> None:
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for _ in range(count):
        i = rng.randrange(4096, len(data))  # after page 1: the header still reads
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_store_with_flipped_bytes_is_refused_saying_how_to_recover(tmp_path):
    path = _made_store(tmp_path / "data")
    _flip(path, 300)
    out = _serve_and_fail(tmp_path / "data")
    assert "is damaged" in out and "quick_check" in out and ".recover" in out, out[-2000:]


@pytest.mark.parametrize("loss", ["truncated", "deleted"])
def test_a_store_gone_beside_its_run_folders_is_refused(tmp_path, loss):
    path = _made_store(tmp_path / "data")
    if loss == "truncated":
        path.write_bytes(b"")
    else:
        path.unlink()
    out = _serve_and_fail(tmp_path / "data")
    assert "holds no runs" in out and "1 run folder" in out and "aside" in out, out[-2000:]
    assert (tmp_path / "data" / "runs" / "r1" / "checkpoint.pt").exists()  # left untouched


def test_an_undamaged_store_and_a_new_data_folder_start(tmp_path):
    _made_store(tmp_path / "data")
    RunStore(tmp_path / "data" / "asteria.db").close()
    RunStore(tmp_path / "fresh" / "asteria.db").close()
