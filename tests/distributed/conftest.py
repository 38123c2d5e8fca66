"""Runs of ddp_train.py that several data-parallel test modules read: each made once per test
session, whichever xdist worker asks first (--dist loadfile puts the modules in either)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.distributed.test_ddp import run_single, torchrun


def once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `make` filled, made once per session: the workers share the session's
    temporary root (its parent under xdist), and a lock holds the others until it is done."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, done = root / name, root / f"{name}.done"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed making it
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> tuple[dict[str, torch.Tensor], dict]:
    """The single-process run on the same global batch with the same swap schedule
    (`ddp_train.py --single`): deterministic, so one serves test_ddp, test_sharded and
    test_rebalance alike."""
    out = once(tmp_path_factory, "single", run_single)
    return torch.load(out / "rank0.pt"), json.loads((out / "rank0.json").read_text())


@pytest.fixture(scope="session")
def checkpointed(tmp_path_factory) -> Path:
    """An uninterrupted 2-rank job that checkpoints every 10 steps: what the killed and
    restarted jobs of test_ddp and test_restart must end as, bit for bit."""
    return once(tmp_path_factory, "checkpointed",
                lambda out: torchrun(out, "--checkpoint-every", "10"))
