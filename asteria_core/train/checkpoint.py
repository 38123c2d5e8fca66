"""Checkpoints that resume exactly, written atomically.

A checkpoint is one self-describing dict (model, optimizer, scheduler, data position, RNG states,
step, config) of tensors and plain values, so it loads with torch's weights-only unpickler and a
crafted file cannot run code. It is written to a temporary file in the same folder, fsynced, then
renamed over the old one, so a crash mid-write never leaves a broken latest checkpoint, and a
write that fails (a full disk) leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import os
import pickle
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asteria_core.tiers.disk import LOADED, release_loaded, release_pages

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    """Every generator's state, as tensors and plain Python values only (see `load`)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _Streamed:
    """The checkpoint file as torch.save writes it, one tensor per write: once a tensor that
    views a disk-tier file is written its pages leave memory again (tiers.disk.release_pages),
    so the disk tier goes from file to file about one tensor at a time."""

    def __init__(self, f) -> None:
        self._f = f
        self.error: OSError | None = None  # a write that failed (a full disk, say)

    def write(self, data) -> int:
        try:
            n = self._f.write(data)
        except OSError as err:
            self.error = err
            raise
        release_pages(data)
        return n

    def flush(self) -> None:
        self._f.flush()


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """Write `obj` to `path` so that readers see either the old file or the new one, whole.
    Nothing is copied first: torch.save writes each tensor from its own memory, and the disk
    tier's from its mapped files (see `_Streamed`); the written file leaves the page cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            streamed = _Streamed(f)
            try:
                torch.save(obj, streamed)
            except RuntimeError as err:
                # torch's zip writer answers a failed write with an error of its own ("unexpected
                # pos") as it closes: the write's OSError is the one that says what happened.
                if streamed.error is None:
                    raise
                raise streamed.error from err
            f.flush()
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _numpy_rng_types() -> list:
    """What rebuilds a uint32 numpy array: checkpoints written before the generator state was
    stored as plain values hold numpy's that way. Nothing else outside torch's own tensors and
    containers is allowed."""
    from numpy._core.multiarray import _reconstruct

    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def remove_leftovers(folder: Path) -> None:
    """Temporary files of checkpoint writes a crash cut short (`save_atomic` removes its own
    when a write fails)."""
    for left in folder.glob(f".{CHECKPOINT_NAME}.*.tmp"):
        left.unlink(missing_ok=True)


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint without running any code it may hold: weights_only unpickling, which
    takes tensors and plain containers only, and refuses any other object (a crafted file
    naming os.system, say) before it is built. The file is mapped, not read (mmap=True): its
    tensors are views of it until whoever restores them copies them out one at a time (the
    tier store's placement, `tiers.disk.copy_out`), so the state is never in memory twice."""
    try:
        with torch.serialization.safe_globals(_numpy_rng_types()):
            ckpt = torch.load(Path(path), map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "Weights only load failed" in why:
            why = "it holds objects no checkpoint holds; refused without building them"
        raise ValueError(f"train.resume: {path} is not an Asteria checkpoint ({why})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"train.resume: {path} is not an Asteria checkpoint "
                         f"(format_version {FORMAT_VERSION} expected)")
    LOADED.note(t for t in _tensors(ckpt))
    return ckpt


def restore_module(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """module.load_state_dict(state) from a loaded checkpoint, one tensor at a time: each is
    copied into the module, then its pages of the mapped file leave memory again (loading all
    at once would hold the whole model's share of the file in memory at the peak)."""
    expected = set(module.state_dict(keep_vars=True))
    if set(state) != expected:  # what strict loading would refuse, before copying anything
        module.load_state_dict(state)
    for name, t in state.items():
        module.load_state_dict({name: t}, strict=False)
        release_loaded(t)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
