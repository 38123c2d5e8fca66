"""`asteria train --metrics-port` serves a real /metrics over HTTP while it trains."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.validation import ConfigError

TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.eval_batches", "2",
        "--train.threads", "1", "--no-progress"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, deadline: float) -> dict:
    """Poll until the run has done a step; returns {family: Metric}."""
    while time.monotonic() < deadline:
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            time.sleep(0.1)
            continue
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        if fams["asteria_steps"].samples[0].value > 0:
            return fams
        time.sleep(0.1)
    raise AssertionError(f"no steps seen on {url}")


def test_train_with_metrics_port_serves_metrics_over_http(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "asteria_core.cli", "train", "--metrics-port", str(port),
           "--train.steps", "100000", "--train.out_dir", str(tmp_path), *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        fams = scrape(f"http://127.0.0.1:{port}/metrics", time.monotonic() + 60)
        assert fams["asteria_step_seconds"].type == "histogram"
        assert {s.labels["cause"] for s in fams["asteria_device_idle_seconds"].samples
                if s.name.endswith("_total")} >= {"data_wait", "other"}
        run_info = fams["asteria_run_info"].samples[0].labels
        assert run_info["optimizer"] == "adamw" and run_info["mode"] == "native"
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: stop at a boundary, keep a checkpoint
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"metrics at http://127.0.0.1:{port}/metrics" in out
    assert (tmp_path / run_info["run_id"] / "checkpoint.pt").is_file()
    # The server went away with the run.
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the metrics server outlived the run")
    except OSError:
        pass


def test_metrics_port_needs_telemetry_enabled():
    with pytest.raises(ConfigError, match="telemetry.metrics_port"):
        TelemetryConfig(enabled=False, metrics_port=9400)


def test_the_runs_start_line_says_which_energy_meters_measure(tmp_path):
    """Where a user looks at the start, one line per run (not an INFO log per meter)."""
    done = subprocess.run(
        [sys.executable, "-m", "asteria_core.cli", "train", *TINY, "--train.steps", "2",
         "--train.out_dir", str(tmp_path), "--telemetry.model_cpu_watts", "10"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("asteria: energy: ")]
    assert "nvml off (" in line and "model on" in line
    assert "INFO" not in done.stderr
