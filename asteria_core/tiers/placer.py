"""A parameter's state taken to its planned homes, and gathered back from them.

State the optimizer made or loaded is adopted at its first release (or after a
load_state_dict); a migration gathers every parameter's state under the old plan and places it
under the new one. Disk-homed entries go to their files through a scratch buffer, not a staging
buffer, and are replaced in the state dict by meta tensors of their shape.
"""

from __future__ import annotations

import gc

import torch

from asteria_core.telemetry.labels import Tier
from asteria_core.tiers.buffers import StagingBuffers
from asteria_core.tiers.catalogue import StateCatalogue
from asteria_core.tiers.disk import copy_out, release_loaded, trim_heap
from asteria_core.tiers.files import ParamFiles
from asteria_core.tiers.homes import HostHomes
from asteria_core.tiers.lifecycle import get_leaf, leaves, set_leaf
from asteria_core.tiers.traffic import DiskTraffic


class StatePlacer:
    """Puts each parameter's state tensors in their homes, and knows whose state it placed."""

    def __init__(self, catalogue: StateCatalogue, files: ParamFiles, buffers: StagingBuffers,
                 homes: HostHomes, traffic: DiskTraffic) -> None:
        self.catalogue = catalogue
        self.files = files
        self.buffers = buffers
        self.homes = homes
        self.traffic = traffic
        self.adopted: set[int] = set()
        """Parameters whose state is in its homes (until then, a use leaves it alone)."""

    def adopt_all(self, device: torch.device) -> None:
        """Place the state now in the optimizer (after its load_state_dict)."""
        self.adopted.clear()
        for index, p in enumerate(self.catalogue.params):
            state = self.catalogue.opt.state.get(p)
            if state:
                self.adopt(index, state, device)

    def adopt(self, index: int, state: dict, device: torch.device) -> None:
        """Take freshly created or loaded state of `index` to its planned homes."""
        found = dict(leaves(state))
        spec = {e.path: e for e in self.catalogue.of(index)}
        assert set(found) == set(spec), f"state of parameter {index} is not as planned"
        self.place(index, found, device)
        if self.files.on_disk(index):
            # The state now on disk leaves memory: the step's reference cycles still hold it,
            # and glibc its freed pages.
            del found
            gc.collect(1)
            trim_heap()

    def place(self, index: int, tensors: dict, device: torch.device) -> None:
        """Parameter `index`'s tensors (by state path) to their homes; `device` is the device
        tier's."""
        state = self.catalogue.state(index)
        offsets = self.files.offsets_by_path(index)
        scratch = self.buffers.scratch() if offsets else None
        for e in self.catalogue.of(index):
            t = tensors[e.path]
            match e.tier:
                case Tier.DEVICE:
                    set_leaf(state, e.path, copy_out(t, device))
                case Tier.HOST if self.homes.copies is None:
                    set_leaf(state, e.path, copy_out(t))
                case Tier.HOST:
                    home = self.homes.pin(e, t)
                    release_loaded(t)
                    set_leaf(state, e.path, home)
                case Tier.DISK:
                    assert scratch is not None  # made for the disk-tier entries
                    off = offsets[e.path]
                    view = torch.from_numpy(scratch[off:off + e.nbytes]).view(e.dtype)
                    view.view(e.shape).copy_(t)
                    release_loaded(t)
                    set_leaf(state, e.path, torch.empty(e.shape, dtype=e.dtype, device="meta"))
                case _:
                    raise NotImplementedError(e.tier)
        if scratch is not None:  # there are disk-tier entries
            self.files.write(scratch, self.files.groups[index], Tier.DEVICE)
        self.adopted.add(index)

    def gather(self, index: int) -> dict:
        """Every entry of parameter `index` as a plain CPU tensor (disk entries read now)."""
        state = self.catalogue.state(index)
        out = {}
        offsets = self.files.offsets_by_path(index)
        if offsets:
            scratch = self.buffers.scratch()
            self.traffic.wait_written(index)
            self.files.read(index, scratch)
        for e in self.catalogue.of(index):
            if e.tier == Tier.DISK:
                off = offsets[e.path]
                out[e.path] = torch.from_numpy(scratch[off:off + e.nbytes]).view(
                    e.dtype).view(e.shape).clone()
            else:
                out[e.path] = get_leaf(state, e.path).detach().to("cpu", copy=True)
        return out
