"""Refresh results in flight, for blocks whose state lives on disk: kept in files, not memory.

A refresh result (the new basis, the rotation Q_old^T Q_new, and at a block's first swap the
transport) waits from the boundary it is known at until its swap step, up to d steps later; a round
of them is about as large as every basis of the model, twice or three times over. For a block
homed on disk that is memory its state was sent to disk to save, so the result goes to a file
of the disk tier too. What the engine keeps is the same `RefreshResult`, its tensors views of
that file (`DiskTier.map`: mapped copy on write, checked, paged out), so everything downstream
(the swap, a settle into the optimizer, a checkpoint) reads it as before, a page at a time. The
file is unlinked at once: its mapping keeps the bytes until the result is dropped at its swap,
and a crash leaves nothing behind.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from asteria_core.optim.seam import RefreshResult
from asteria_core.tiers.disk import DiskTier, aligned_buffer
from asteria_core.tiers.lifecycle import padded

FIELDS = ("basis", "perm", "transport", "rotation")
"""The tensors of a RefreshResult (any of them may be None but the basis)."""


def result_bytes(result: RefreshResult) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(result).values())


def _tensors(result: RefreshResult) -> dict[str, torch.Tensor]:
    return {name: t for name in FIELDS if (t := getattr(result, name)) is not None}


class ResultFiles:
    """Results staged to files in `folder` (one file each, unlinked once mapped)."""

    def __init__(self, folder: Path) -> None:
        self.disk = DiskTier(folder)
        self._names = itertools.count()
        self.staged = 0
        """Results staged so far."""

    def stage(self, result: RefreshResult) -> RefreshResult:
        """The same result, its tensors views of a file (no memory of their own)."""
        tensors = _tensors(result)
        parts, off = [], 0
        for name, t in tensors.items():
            parts.append((name, off, t.numel() * t.element_size()))
            off += padded(parts[-1][2])
        buf = aligned_buffer(off)
        for (_, start, nbytes), t in zip(parts, tensors.values(), strict=True):
            raw = torch.from_numpy(buf[start:start + nbytes])
            raw.copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        fname = f"r{next(self._names)}"
        self.disk.write(fname, buf, parts)
        del buf
        views = self.disk.map(fname, parts)
        self.disk.remove(fname)  # the mapping keeps the bytes until the result is dropped
        self.staged += 1
        mapped: dict[str, Any] = {name: views[name].view(t.dtype).view(t.shape)
                                  for name, t in tensors.items()}
        return replace(result, **mapped)

    def close(self) -> None:
        self.disk.close()
