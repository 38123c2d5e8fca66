"""The device check (benchmarks/gpu_check.sh) runs in CI on the CPU at its smoke size, so it
cannot rot: the install (offline, the project into a fresh venv over this environment's
packages), every part in order, each suite's JSON, check.json and the summary table; and it
stops at the first failure."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PARTS = ["machine", "gpu-tests", "critical-path", "staleness", "tiers"]
_spec = importlib.util.spec_from_file_location("device_check",
                                               ROOT / "benchmarks" / "device_check.py")
device_check = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("device_check", device_check)  # its dataclasses look their module up
_spec.loader.exec_module(device_check)


def check(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--offline",
                           "--python", sys.executable, "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,  # hang guard
                          env=env)


def test_the_cpu_smoke_runs_every_part_and_writes_each_json_and_the_summary(tmp_path):
    out = tmp_path / "check"
    done = check(out, "--device", "cpu", "--size", "smoke")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parts = json.loads((out / "check.json").read_text())["parts"]
    assert [p["part"] for p in parts] == PARTS
    by_part = {p["part"]: p for p in parts}
    no_cuda = not torch.cuda.is_available()
    assert by_part["gpu-tests"]["status"] == ("none here" if no_cuda else "passed")
    assert all(by_part[p]["status"] == "passed" for p in PARTS if p != "gpu-tests")
    assert "energy: " in by_part["machine"]["detail"]
    for suite in ("critical-path", "staleness", "tiers"):
        data = json.loads((out / f"{suite}.json").read_text())
        assert data["suite"] == suite and data["runs"], suite
    summary = (out / "summary.md").read_text()
    assert all(f"| {p} |" in summary for p in PARTS)
    assert summary in done.stdout


def test_the_check_stops_at_the_first_failure_and_says_where(tmp_path):
    """--device cuda with no CUDA device visible (hidden where a machine has one): the first
    part fails, nothing after it runs."""
    out = tmp_path / "check"
    done = check(out, "--device", "cuda", "--size", "smoke",
                 env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode != 0
    parts = json.loads((out / "check.json").read_text())["parts"]
    assert [(p["part"], p["status"]) for p in parts] == [("machine", "failed")]
    assert "stopped at machine" in done.stderr
    assert "| machine | failed |" in (out / "summary.md").read_text()


def test_bad_arguments_are_refused_naming_the_option(tmp_path):
    done = check(tmp_path, "--device", "tpu")
    assert done.returncode == 2 and "--device: got tpu; allowed: cuda | cpu" in done.stderr


def test_the_gpu_tests_part_collects_exactly_the_files_of_the_gpu_tests(request, tmp_path):
    """The gpu-tests part runs pytest on the files its rule finds, not the whole suite. Every
    gpu-marked test this session collected (tests/conftest.py keeps their files) is in one of
    them, and each of them this session collected holds one: equal sets wherever the whole
    suite is collected, as by every xdist worker."""
    rule = device_check.gpu_test_files()
    assert rule and all(f.startswith("tests/") and Path(f).name.startswith("test_")
                        for f in rule)
    collected = request.config._asteria_collected_files
    assert {f for f in rule if f in collected} == request.config._asteria_gpu_files
    command = device_check.part_command("gpu-tests", "cpu", "smoke", tmp_path)
    assert command[-len(rule):] == rule and "tests" not in command
