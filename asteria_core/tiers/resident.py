"""Disk-homed state in use: a parameter's state in a staging buffer, its state dict pointing at it.

Between uses the dict holds meta tensors, so any use that bypassed the store fails loudly. After
a use the state stays resident ("lingers") until another parameter needs a buffer, so the
snapshots and swaps of one parameter's blocks at a boundary cost one read and one write; then
its dirty files are written back (`flush`).
"""

from __future__ import annotations

import torch

from asteria_core.optim.base import Writes
from asteria_core.tiers.buffers import StagingBuffers
from asteria_core.tiers.files import ParamFiles
from asteria_core.tiers.homes import HostHomes
from asteria_core.tiers.lifecycle import READ, WRITTEN, get_leaf, set_leaf
from asteria_core.tiers.traffic import DiskTraffic


class ResidentState:
    """Which parameter holds which staging buffer, and the one that lingers after its use."""

    def __init__(self, files: ParamFiles, buffers: StagingBuffers, homes: HostHomes,
                 traffic: DiskTraffic) -> None:
        self.files = files
        self.buffers = buffers
        self.homes = homes
        self.traffic = traffic
        self._held: dict[int, int] = {}  # index -> slot, while a use holds it
        self._linger: tuple[int, dict, set[str]] | None = None

    def holds(self, index: int) -> bool:
        return index in self._held

    def lingers(self, index: int) -> bool:
        """Whether parameter `index`'s state is still resident from its last use."""
        return self._linger is not None and self._linger[0] == index

    def hold(self, index: int, state: dict, slot: int) -> None:
        """Point parameter `index`'s state at the buffer `slot` it was loaded into."""
        self._held[index] = slot
        copies = self.homes.copies
        for e, off in self.files.offsets[index]:
            view = self.buffers.view(slot, e, off)
            if copies is not None:  # pinned buffer -> device, asynchronous
                view = copies.to_device(("slot", slot), view)
            set_leaf(state, e.path, view)

    def release(self, index: int, state: dict, writes: Writes) -> None:
        """The use is over: the state lingers, with the files `writes` made dirty."""
        if index not in self._held:
            return
        dirty = {WRITTEN, READ} if writes == Writes.ALL else \
            {WRITTEN} if writes == Writes.STEP else set()
        if self._linger is not None and self._linger[0] == index:
            dirty |= self._linger[2]
        self._linger = (index, state, dirty)

    def flush(self) -> None:
        """Write back the lingering parameter's dirty files and free its staging buffer."""
        if self._linger is None:
            return
        index, state, dirty = self._linger
        self._linger = None
        slot = self._held.pop(index)
        copies = self.homes.copies
        for e, off in self.files.offsets[index]:
            if copies is not None:  # device -> pinned buffer, off the training stream
                copies.to_host(("slot", slot), self.buffers.view(slot, e, off),
                               get_leaf(state, e.path))
            set_leaf(state, e.path, torch.empty(e.shape, dtype=e.dtype, device="meta"))
        ready = copies.last_event() if copies is not None else None
        self.traffic.write_back(index, slot, self.files.dirty(index, dirty), ready)

    def forget(self) -> None:
        """Forget the holds of uses that never released (the state is adopted anew)."""
        self._held.clear()
