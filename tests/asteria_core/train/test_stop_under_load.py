"""A stop on a loaded machine: `asteria train` gets SIGINT right after its
first step, while busy processes take every core, and exits with its checkpoint: AdamW serving
/metrics (the run that once did not exit within 60 s), and SOAP on worker processes that are
still starting (the stop used to wait for them to import torch, then again for them to exit).
How long a stop takes (target: 10 s) is measured by `asteria bench serving`; the bound here is a
hang guard only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asteria_bench.suites.serving import first_step_done
from asteria_core.machine import MACHINE
from tests.backend.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", "1000000",
        "--train.eval_interval", "100000", "--train.eval_batches", "2", "--train.threads", "1",
        "--no-progress"]
PROCESS_WORKERS = ["--optim.name", "soap", "--policy.worker_kind", "process",
                   "--policy.workers", str(min(2, MACHINE.max_process_workers))]
HANG_GUARD_SECONDS = 300


@pytest.fixture
def busy_cores():
    """A real busy process on every core, for the whole test."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [[], PROCESS_WORKERS], ids=["adamw", "soap-processes"])
def test_a_stop_beside_busy_cores_ends_the_run_with_its_checkpoint(tmp_path, busy_cores,
                                                                   optimizer):
    port = free_port()
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "asteria_core.cli", "train", "--metrics-port", str(port),
           "--train.out_dir", str(out), *TINY, *optimizer]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        first_step_done(f"http://127.0.0.1:{port}/metrics", proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "stopped by SIGINT" in err
    assert len(list(out.glob("*/checkpoint.pt"))) == 1


def test_a_signal_while_the_run_is_built_stops_it_before_its_first_step(tmp_path):
    """The build is held on a FIFO: the zone name in a RAPL tree of the test's own, which the
    energy meters read while the run is built. Once the run opens it, SIGTERM lands mid-build."""
    zone = tmp_path / "rapl" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    (zone / "energy_uj").write_text("0\n")
    os.mkfifo(zone / "name")
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "asteria_core.cli", "train", "--train.out_dir",
                             str(out), "--telemetry.rapl_root", str(tmp_path / "rapl"), *TINY],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # succeeds once the run has opened the FIFO to read it
            try:
                fifo = os.open(zone / "name", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.poll()
                time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, f"SIGTERM mid-build ended the process: {proc.returncode}"
        os.write(fifo, b"package-0\n")
        os.close(fifo)  # end of file: the build goes on
        out_text, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM at step 0" in err
    assert "asteria: run " in out_text  # it was built, then stopped before training
    assert len(list(out.glob("*/checkpoint.pt"))) == 1
