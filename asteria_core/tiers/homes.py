"""Host-homed state on an accelerator: pinned homes, copied to the device for each use and back
after an update, off the training stream (tiers/copies.py).

The same copies move disk-homed state between the device and its staging buffer. On a CPU
machine there are no copies: the host tier is the device's own memory, used in place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from asteria_core.optim.base import Writes
from asteria_core.telemetry.labels import Tier
from asteria_core.tiers.catalogue import StateCatalogue
from asteria_core.tiers.copies import HostCopies
from asteria_core.tiers.lifecycle import READ, Entry, get_leaf, set_leaf


class HostHomes:
    """The pinned homes of host-tier entries, and the copies between the host and `device`."""

    def __init__(self, make_copies: Callable[[torch.device], HostCopies | None],
                 device: torch.device) -> None:
        self._make_copies = make_copies
        self.copies = make_copies(device)
        """Host-homed state to and from the device; None where the host tier is used in place
        (a CPU machine)."""
        self.pinned: dict[tuple, torch.Tensor] = {}
        """(parameter index, state path) -> its pinned home (with copies only)."""
        self._staged: dict[int, list[Entry]] = {}

    def set_device(self, device: torch.device) -> None:
        self.copies = self._make_copies(device)

    def configure(self, catalogue: StateCatalogue) -> None:
        """Stage the entries the plan homes on the host (their `tier`); homes of entries homed
        elsewhere now are dropped."""
        self._staged = {index: [e for e in catalogue.of(index)
                                if self.copies is not None and e.tier == Tier.HOST]
                        for index in catalogue.by_param}
        self.pinned = {k: v for k, v in self.pinned.items()
                       if catalogue.find(*k).tier == Tier.HOST}

    def staged(self, index: int) -> bool:
        """Whether parameter `index` has host-homed entries copied in for each use."""
        return bool(self._staged.get(index))

    def pin(self, e: Entry, t: torch.Tensor) -> torch.Tensor:
        """Entry `e`'s new pinned home, holding `t`."""
        home = self.pinned[e.param, e.path] = self._copies().pin(t)
        return home

    def to_device(self, index: int, state: dict) -> None:
        """Point parameter `index`'s state at device copies of its homes (asynchronous)."""
        for e in self._staged.get(index, ()):
            key = (e.param, e.path)
            set_leaf(state, e.path, self._copies().to_device(key, self.pinned[key]))

    def to_host(self, index: int, state: dict, writes: Writes) -> None:
        """Copy what the use wrote back to the homes (off the training stream), and point the
        state at the homes again."""
        for e in self._staged.get(index, ()):
            key = (e.param, e.path)
            home, t = self.pinned[key], get_leaf(state, e.path)
            if t is not home and (writes == Writes.ALL or
                                  (writes == Writes.STEP and e.lifecycle != READ)):
                self._copies().to_host(key, home, t)
            set_leaf(state, e.path, home)

    def settle(self) -> None:
        """Wait for every copy out: the host reads the homes and buffers next."""
        if self.copies is not None:
            self.copies.settle()

    def close(self) -> None:
        if self.copies is not None:
            self.copies.unregister()

    def _copies(self) -> HostCopies:
        """The copies of an accelerator (host-tier entries are staged only there)."""
        assert self.copies is not None
        return self.copies
