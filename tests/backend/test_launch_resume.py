"""`asteria start` after a Ctrl-C: the stop says how to continue, and `asteria start --resume`
continues the newest stopped run from its checkpoint (the same run, from the checkpoint's step,
not a new run from step 0), on the same ports right away. Real processes: the launcher, its
control plane and dashboard, SIGINT as a terminal sends it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from asteria_core.train import checkpoint as ckpt
from tests.backend.conftest import free_port
from tests.dashboard.stack import Start, wait_until

TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.threads", "1",
        "--train.steps", "1000000", "--train.eval_interval", "100000"]
HINT = "continue it with `asteria start --resume`"


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTERIA_")}
    env.update(ASTERIA_PORT=str(free_port()), ASTERIA_DASHBOARD_PORT=str(free_port()),
               ASTERIA_DATA_DIR=str(tmp_path / "data"))
    return env


@pytest.fixture
def started():
    """Every launcher a test starts; one still running at the end is stopped."""
    launched: list[Start] = []
    yield launched
    for start in launched:
        if start.proc.poll() is None:
            start.proc.send_signal(signal.SIGTERM)
            start.finish()


def test_ctrl_c_says_how_to_continue_and_start_resume_continues_from_the_checkpoint(
        env, started):
    api = f"http://127.0.0.1:{env['ASTERIA_PORT']}"
    first = Start(env, *TINY)
    started.append(first)
    first.ready()
    run_id = httpx.get(f"{api}/healthz").json()["active_run"]
    assert run_id, first.output
    ui = f"http://127.0.0.1:{env['ASTERIA_DASHBOARD_PORT']}"
    assert f'href="{ui}"' in httpx.get(f"{api}/").text  # the first URL printed links the rest
    wait_until(lambda: httpx.get(f"{api}/runs/{run_id}").json()["step"] >= 5, 180, 0.2,
               "the run to train a few steps")
    assert first.interrupt() == 0, first.output
    assert f"asteria: run {run_id} keeps its checkpoint; {HINT}" in first.output
    saved = ckpt.load(Path(env["ASTERIA_DATA_DIR"]) / "runs" / run_id / ckpt.CHECKPOINT_NAME)
    at = saved["step"]
    assert at >= 5

    # Right away, on the same ports (their last connections are still in TIME_WAIT).
    again = Start(env, "--resume")
    started.append(again)
    again.ready()
    assert f"asteria: resuming run {run_id} from its checkpoint at step {at} " in again.output
    assert httpx.get(f"{api}/healthz").json()["active_run"] == run_id
    page = wait_until(lambda: (p := httpx.get(f"{api}/runs/{run_id}/steps",
                                              params={"since": at}).json())["steps"] and p,
                      180, 0.2, "steps after the checkpoint")
    assert page["steps"][0]["step"] == at + 1  # the checkpoint's step, not step 0
    # The resumed run logs as it starts (energy sources) after the launcher's URLs: above the
    # progress line, which is drawn at the run's first new step, never inside it.
    logged = [line for line in again.lines if "INFO " in line]  # text mode: \r ends a line
    assert all(line.startswith("INFO ") for line in logged), logged
    assert [run["id"] for run in httpx.get(f"{api}/runs").json()] == [run_id]  # no new run
    assert again.interrupt() == 0, again.output
    assert f"asteria: run {run_id} keeps its checkpoint; {HINT}" in again.output
    assert ckpt.load(Path(env["ASTERIA_DATA_DIR"]) / "runs" / run_id /
                     ckpt.CHECKPOINT_NAME)["step"] > at


def test_resume_with_nothing_to_resume_says_so(env, started):
    nothing = Start(env, "--resume")
    started.append(nothing)
    assert nothing.finish() == 1
    assert "asteria: no run in" in nothing.output and "to resume" in nothing.output
    assert "`asteria start` starts a new one" in nothing.output
