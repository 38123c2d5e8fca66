"""`asteria start`: the control plane (with its default run) and the dashboard together; both
URLs printed once each, then the run's progress line; SIGINT (Ctrl-C) or SIGTERM stops both and
leaves no process behind; a child that dies takes the other down and the exit status says so."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.backend.conftest import free_port
from tests.dashboard.stack import ROOT, Start, answers, wait_until

TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.threads", "1",
        "--train.steps", "1000000", "--train.eval_interval", "100000"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def children(pid: int) -> dict[str, int]:
    """{"serve" | "streamlit": pid} of the launcher's child processes, from /proc."""
    kids = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids["streamlit" if b"streamlit" in cmdline else "serve"] = int(stat.parent.name)
    return kids


class Launcher(Start):
    """`python -m asteria start` (what `asteria start` runs), own ports and data folder."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.api, self.ui = free_port(), free_port()
        self.data = tmp_path / "data"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASTERIA_")}
        env.update(ASTERIA_PORT=str(self.api), ASTERIA_DASHBOARD_PORT=str(self.ui),
                   ASTERIA_DATA_DIR=str(self.data))
        super().__init__(env, *TINY, *extra)


@pytest.fixture
def launcher(tmp_path):
    started = Launcher(tmp_path)
    yield started
    if started.proc.poll() is None:  # a failed test still leaves nothing running
        started.proc.send_signal(signal.SIGTERM)
        started.finish()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_start_serves_both_shows_the_run_training_and_a_signal_stops_both(launcher, sig):
    launcher.ready()
    api, ui = f"http://127.0.0.1:{launcher.api}", f"http://127.0.0.1:{launcher.ui}"
    assert f"control plane  {api}" in launcher.output and f"dashboard      {ui}" in launcher.output
    # the run's progress line moves, and each URL is printed once
    figures = re.compile(r"(\d+)/1000000 .*loss=\d+\.\d{4}, tok/s=[\d,]+, step_ms=\d+\.\d")
    wait_until(lambda: len(figures.findall(launcher.output)) >= 2, 120, 0.2, "progress lines")
    steps = [int(n) for n in figures.findall(launcher.output)]
    assert steps[-1] > steps[0] > 0, steps
    lines = launcher.output.splitlines()
    for url in (api, ui):
        assert sum(url in line for line in lines) == 1, launcher.output
    run_id = httpx.get(f"{api}/healthz").json()["active_run"]
    assert run_id, "the default run trains"
    assert answers(f"{ui}/_stcore/health", "ok")
    kids = children(launcher.proc.pid)
    assert set(kids) == {"serve", "streamlit"}
    env = (Path("/proc") / str(kids["streamlit"]) / "environ").read_bytes().split(b"\0")
    assert f"ASTERIA_URL={api}".encode() in env
    assert f"ASTERIA_TOKEN_FILE={launcher.data / 'token'}".encode() in env

    launcher.proc.send_signal(sig)
    assert launcher.finish() == 0, launcher.output
    assert "asteria: stopped" in launcher.output
    assert not any(alive(pid) for pid in kids.values())
    assert not answers(f"{api}/healthz") and not answers(f"{ui}/_stcore/health")
    # the run stopped at a step boundary and kept its checkpoint
    assert (launcher.data / "runs" / run_id / "checkpoint.pt").is_file()


@pytest.mark.parametrize("bar", [True, False], ids=["progress", "no-progress"])
def test_a_finished_run_is_announced_and_ctrl_c_then_exits(tmp_path, bar):
    launcher = Launcher(tmp_path, "--train.steps", "30", "--train.checkpoint_interval", "10",
                        *([] if bar else ["--no-progress"]))
    try:
        launcher.ready()
        wait_until(lambda: "Ctrl-C exits" in launcher.output, 240, 0.2, "the end announced")
        run_id = httpx.get(f"http://127.0.0.1:{launcher.api}/runs").json()[0]["id"]
        folder = launcher.data / "runs" / run_id
        out = launcher.output
        assert re.search(rf"run {run_id} finished at step 30 of 30, final loss \d+\.\d{{4}}",
                         out), out
        assert f"files in {folder}" in out
        assert f"its checkpoint (step 30) is {folder / 'checkpoint.pt'}" in out
        assert (folder / "checkpoint.pt").is_file()
        assert "stay up to view it; Ctrl-C exits" in out
        assert ("30/30" in out) is bar  # the bar, only where asked for
        assert launcher.interrupt() == 0, launcher.output
        assert "no run is training" in launcher.output
        assert "next step boundary" not in launcher.output
    finally:
        if launcher.proc.poll() is None:
            launcher.proc.send_signal(signal.SIGTERM)
            launcher.finish()


def test_a_dying_child_stops_the_other(launcher):
    launcher.ready()
    kids = children(launcher.proc.pid)
    os.kill(kids["serve"], signal.SIGKILL)
    assert launcher.finish() == 1
    assert "the control plane exited with status -9" in launcher.output
    assert not alive(kids["streamlit"])


def test_a_busy_port_is_named(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASTERIA_")}
        env.update(ASTERIA_PORT=str(port), ASTERIA_DATA_DIR=str(tmp_path))
        proc = subprocess.run([sys.executable, "-m", "asteria", "start"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"port {port} for the control plane is in use; set ASTERIA_PORT" in proc.stderr
