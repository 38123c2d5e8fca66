"""The control plane attached to a user's own loop: examples/plain_loop.py, served with
`backend.serve`, over real HTTP; and the built-in trainer is the same loop, bit for bit."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from asteria_core.policy import Policy
from asteria_core.train.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
)
from asteria_core.train.trainer import Trainer
from backend.store import RunStore
from tests.backend.conftest import free_port

pytestmark = pytest.mark.usefixtures("one_thread")
EXAMPLE = Path(__file__).parents[2] / "examples" / "plain_loop.py"


def plain_loop():
    return runpy.run_path(str(EXAMPLE))["main"]


def wait_for(condition, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_plain_loop_serves_metrics_and_applies_a_policy_patch_at_the_reported_step(tmp_path):
    port, data = free_port(), tmp_path / "data"
    losses: list[float] = []
    thread = threading.Thread(target=lambda: losses.extend(
        plain_loop()(steps=100_000, port=port, data_dir=str(data))), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    def active_run():
        try:
            return httpx.get(f"{url}/healthz", timeout=2).json()["active_run"]
        except httpx.HTTPError:
            return None

    run_id = wait_for(active_run, "the attached run")
    token = wait_for(lambda: (data / "token").is_file() and (data / "token").read_text().strip(),
                     "the token file")
    auth = {"Authorization": f"Bearer {token}"}
    wait_for(lambda: httpx.get(f"{url}/runs/{run_id}").json()["step"] >= 3, "three steps")
    metrics = httpx.get(f"{url}/metrics").text
    assert "asteria_steps_total" in metrics and f'run_id="{run_id}"' in metrics
    assert "asteria_preconditioner_staleness_max_steps" in metrics

    # The run's folder is the script's: shown only where the script made one, as it is.
    run_dir = httpx.get(f"{url}/runs/{run_id}", headers=auth).json()["run_dir"]
    assert run_dir is None or (Path(run_dir).is_absolute() and Path(run_dir).is_dir()), run_dir

    # Runs the server did not launch cannot be started next to it, checkpointed or resumed.
    assert httpx.post(f"{url}/runs", json={}, headers=auth).status_code == 409
    conflict = httpx.post(f"{url}/runs/{run_id}/checkpoint", headers=auth)
    assert conflict.status_code == 409 and "attached" in conflict.json()["detail"]

    patch = httpx.patch(f"{url}/runs/{run_id}/policy", json={"staleness_bound": 2,
                                                           "refresh_interval": 3}, headers=auth)
    assert patch.status_code == 200, patch.text
    effective = patch.json()["effective_step"]
    wait_for(lambda: httpx.get(f"{url}/runs/{run_id}").json()["step"] >= effective + 5,
             "steps under the new policy")
    stop = httpx.post(f"{url}/runs/{run_id}/stop", headers=auth)
    assert stop.status_code == 202
    thread.join(60)
    assert not thread.is_alive() and 0 < len(losses) < 100_000  # the loop saw the stop

    store = RunStore(data / "asteria.db")
    try:
        assert store.get_run(run_id)["status"] == "stopped"
        steps = store.steps(run_id, 0, 100_000)
        assert [s["step"] for s in steps] == list(range(1, len(losses) + 1))
        for s in steps:  # trained under version 2 from the reported step on
            assert s["policy_version"] == (2 if s["step"] >= effective else 1), s["step"]
            # The refresh figures describe what the next step sees, the new bound included.
            bound = 2 if s["step"] + 1 >= effective else 5
            assert s["refresh"]["staleness_bound"] == bound, s["step"]
            assert s["refresh"]["staleness_max"] <= bound, s["step"]
            assert set(s["timing"]["idle_seconds"]) >= {"refresh_wait", "other"}
        [change] = store.policy_changes(run_id)
        assert change.version == 2 and change.effective_step == effective
        assert change.diff["staleness_bound"] == (5, 2) and change.applied_at is not None
    finally:
        store.close()


def test_the_trainer_and_the_plain_loop_give_the_same_losses_bit_for_bit(tmp_path):
    """There is one way to drive the runtime: the built-in trainer with the example's model,
    data, seed, optimizer and policy trains exactly what the example trains."""
    losses = plain_loop()(steps=30, port=None)
    config = RunConfig(
        model=ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64),
        optim=OptimConfig(name="soap", lr=3e-3, weight_decay=0.0, grad_clip=0.0,
                          warmup_steps=0, min_lr_ratio=1.0),
        data=DataConfig(batch_size=8),
        train=TrainConfig(steps=30, seed=1337, eval_interval=1000, eval_batches=1,
                          out_dir=str(tmp_path)),
        policy=Policy(staleness_bound=5))
    trainer = Trainer(config)
    try:
        result = trainer.train(progress=False)
    finally:
        trainer.close()
    assert result.train_losses == losses


def test_the_plain_loop_serves_on_asteria_port_and_prints_its_url(tmp_path):
    port = free_port()
    env = dict(os.environ, ASTERIA_PORT=str(port))
    done = subprocess.run([sys.executable, str(EXAMPLE), "3"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"control plane on http://127.0.0.1:{port} (token in asteria-data/token)" in \
        done.stdout
    assert "API token (saved to asteria-data/token" in done.stdout  # the token line beside it
