"""Shared fixtures: tiny configs that train in milliseconds per step on CPU."""

from __future__ import annotations

import os
import sys

# In a suite of several xdist workers (pyproject's addopts), idle OpenMP threads sleep instead
# of spinning: set before torch loads libgomp, here and in every process the tests start. The
# workers and their subprocesses keep the few cores busy, and libgomp's default spin-wait then
# burns the CPU a descheduled peer thread needs (a 2-thread training loop beside one busy core:
# 3-4x the CPU time). Thread counts and results are unchanged; alone (-n0) on a quiet machine
# spinning is faster, so it is left as it is.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

from asteria_core.train.config import DataConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig


def tiny_config(tmp_path, **train) -> RunConfig:
    """A ~30K-parameter GPT on the embedded corpus, with dropout so RNG state matters."""
    train_kw = {"steps": 40, "eval_interval": 20, "eval_batches": 2, "out_dir": str(tmp_path),
                "threads": 1}
    train_kw.update(train)
    return RunConfig(
        model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.1),
        optim=OptimConfig(lr=3e-3, warmup_steps=5),
        data=DataConfig(batch_size=4),
        train=TrainConfig(**train_kw),
    )


@pytest.fixture(autouse=True)
def keep_main_module():
    """Streamlit's AppTest runs a page as `__main__` and leaves it there; a process spawned
    later in the same test process (a process refresh worker, a benchmark's child) would then
    run that page again as its main module and die. Every test gets the real one back."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


@pytest.fixture
def tiny(tmp_path):
    return lambda **train: tiny_config(tmp_path, **train)


@pytest.fixture
def one_thread():
    """One torch intra-op thread for the test: bit-exact comparisons need the same thread count
    on both sides (modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need a CUDA device, a hardware boundary that this machine and CI lack:
    without one they are deselected (and the summary says so), with one they run. The files
    collected, and those holding gpu tests, are kept on `config` for the device check's rule
    (benchmarks/device_check.py gpu_test_files, checked in tests/bench/test_device_check.py)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    config._asteria_collected_files = {str(item.path.relative_to(config.rootpath))
                                       for item in items}
    config._asteria_gpu_files = {str(item.path.relative_to(config.rootpath)) for item in gpu}
    if torch.cuda.is_available():
        return
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
        config._asteria_gpu_deselected = len(gpu)


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands its count to the controller, which prints the summary."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["gpu_deselected"] = getattr(session.config, "_asteria_gpu_deselected", 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller, as a worker ends: every worker collected every test."""
    count = getattr(node, "workeroutput", {}).get("gpu_deselected", 0)
    node.config._asteria_gpu_deselected = max(
        count, getattr(node.config, "_asteria_gpu_deselected", 0))


def pytest_terminal_summary(terminalreporter, config):
    count = getattr(config, "_asteria_gpu_deselected", 0)
    if count:
        terminalreporter.write_line(
            f"NOT RUN: {count} GPU test(s) (no CUDA device here); on a GPU machine run "
            "bash benchmarks/gpu_check.sh", yellow=True, bold=True)

