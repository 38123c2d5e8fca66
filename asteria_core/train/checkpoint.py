"""Checkpoints that resume exactly, written atomically.

A checkpoint is one self-describing dict (model, optimizer, scheduler, data position, RNG states,
step, config). It is written to a temporary file in the same folder, fsynced, then renamed over
the old one, so a crash mid-write never leaves a broken latest checkpoint.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """Write `obj` to `path` so that readers see either the old file or the new one, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load(path: str | Path) -> dict[str, Any]:
    ckpt = torch.load(Path(path), map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or ckpt.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"train.resume: {path} is not an Asteria checkpoint "
                         f"(format_version {FORMAT_VERSION} expected)")
    return ckpt
