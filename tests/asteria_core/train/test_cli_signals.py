"""Stops that keep the run: SIGTERM, what orchestrators send first, and
SIGINT to a run started in the background (which inherits SIGINT ignored) stop `asteria train`
at a step boundary with a checkpoint of that very step."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asteria_core.train import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", "1000000",
        "--train.eval_interval", "100000", "--train.eval_batches", "2", "--train.threads", "1"]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` in a script starts it


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_train_at_a_step_boundary_with_a_checkpoint(tmp_path, sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "asteria_core.cli", "train", "--no-progress", *TINY,
         "--train.out_dir", str(tmp_path)], cwd=ROOT, preexec_fn=_ignore_sigint,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (records := list(tmp_path.glob("*/steps.jsonl"))) or \
                len(records[0].read_text().splitlines()) < 5:
            assert proc.poll() is None and time.monotonic() < deadline, "no steps"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err, err
    run_dir = records[0].parent
    last = json.loads(records[0].read_text().splitlines()[-1])["step"]
    assert ckpt.load(run_dir / ckpt.CHECKPOINT_NAME)["step"] == last
