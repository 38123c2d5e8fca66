"""One process trains in a run folder at a time, however it was started: `asteria train` takes
the run folder's lock (the one the control plane takes for a served run), so a second run in
the folder (here a second `--train.resume` of the same checkpoint) is refused naming the
process that holds it, and a holder killed with SIGKILL leaves no lock behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from asteria_core.train import checkpoint as ckpt
from asteria_core.train.run_lock import LOCK_NAME
from asteria_core.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[3]
HANG = 300
"""Seconds: a hang guard for a loaded machine, never a target."""


def _train(checkpoint: Path, out_dir: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "asteria_core.cli", "train", "--no-progress",
         "--train.resume", str(checkpoint), "--train.out_dir", str(out_dir),
         "--train.steps", "1000000", "--train.checkpoint_interval", "0",
         "--train.eval_interval", "100000", "--train.threads", "1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, text=True, **popen)


def _trains_past(proc: subprocess.Popen, records: Path, step: int) -> None:
    """Wait until the run in `records`' folder has recorded a step after `step`."""
    deadline = time.monotonic() + HANG
    while True:
        lines = records.read_text().splitlines() if records.is_file() else []
        if any(json.loads(line)["step"] > step for line in lines if line.endswith("}")):
            return
        assert proc.poll() is None, "the run ended before training"
        assert time.monotonic() < deadline, "no steps"
        time.sleep(0.05)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_a_second_train_in_a_run_folder_is_refused_until_the_first_is_killed(tiny, tmp_path):
    first = Trainer(tiny(steps=4, eval_interval=4), jsonl=False)
    first.train(progress=False)
    first.close()
    run_dir, step = first.run_dir, first.step
    checkpoint, records = run_dir / ckpt.CHECKPOINT_NAME, run_dir / "steps.jsonl"

    holder = _train(checkpoint, tmp_path, stderr=subprocess.DEVNULL)
    later = None
    try:
        _trains_past(holder, records, step)
        second = _train(checkpoint, tmp_path, stderr=subprocess.PIPE)
        try:
            _, err = second.communicate(timeout=HANG)
        finally:
            _kill(second)
        assert second.returncode == 1, err
        assert f"run folder {run_dir} is in use by process {holder.pid}" in err, err
        assert "Traceback" not in err, err
        assert (run_dir / LOCK_NAME).read_text() == f"process {holder.pid}\n"

        _kill(holder)  # SIGKILL: no handler runs; the kernel drops the dead process's lock
        records.write_text("")  # so the steps seen next are the new run's
        later = _train(checkpoint, tmp_path, stderr=subprocess.DEVNULL)
        _trains_past(later, records, step)
        assert (run_dir / LOCK_NAME).read_text() == f"process {later.pid}\n"
    finally:
        _kill(holder)
        if later is not None:
            _kill(later)
