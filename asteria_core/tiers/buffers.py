"""The staging buffers disk-homed state passes through: read into one, used there, written back
from it.

The plan sets how many and how large (tiers/placement.py: `slots` of `slot_bytes`, the largest
parameter's state). They are aligned for O_DIRECT and, on a GPU, pinned, so copies in and out of
them are asynchronous. A free list hands them out: the reader thread takes one per load, the
writer frees it when its files are written.
"""

from __future__ import annotations

import queue

import numpy as np
import torch

from asteria_core.tiers.copies import HostCopies
from asteria_core.tiers.disk import aligned_buffer
from asteria_core.tiers.lifecycle import Entry


class StagingBuffers:
    """The plan's staging buffers, and which of them are free."""

    def __init__(self) -> None:
        self.nbytes = 0
        self._buffers: list[np.ndarray] = []
        self._free: queue.Queue[int] = queue.Queue()

    def configure(self, count: int, nbytes: int, copies: HostCopies | None) -> None:
        """`count` new buffers of `nbytes` each, all free (pinned by `copies`, where given)."""
        self.nbytes = nbytes
        self._buffers = [aligned_buffer(nbytes) for _ in range(count)]
        if copies is not None:
            copies.register(self._buffers)  # pinned: asynchronous copies in and out
        self._free = queue.Queue()
        for i in range(count):
            self._free.put(i)

    def count(self) -> int:
        return len(self._buffers)

    def take(self) -> int:
        """A free buffer's number, waiting until one is freed."""
        return self._free.get()

    def free(self, slot: int) -> None:
        self._free.put(slot)

    def buffer(self, slot: int) -> np.ndarray:
        return self._buffers[slot]

    def view(self, slot: int, e: Entry, off: int) -> torch.Tensor:
        """Entry `e`, at `off` in buffer `slot`, as a CPU tensor sharing the buffer's memory."""
        raw = torch.from_numpy(self._buffers[slot][off:off + e.nbytes])
        return raw.view(e.dtype).view(e.shape)

    def scratch(self) -> np.ndarray:
        """A buffer of the same size, outside the free list (a migration's, an adoption's)."""
        return aligned_buffer(self.nbytes)
