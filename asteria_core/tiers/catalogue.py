"""The optimizer's state as the tier store sees it: one entry per state tensor, per parameter.

The entries are fixed at construction by the optimizer's `state_spec` (tiers/lifecycle.py says
what an entry is); a plan sets each entry's home `tier` in place.
"""

from __future__ import annotations

from asteria_core.optim.base import BlockPreconditioner
from asteria_core.optim.state_keys import FACTORS
from asteria_core.tiers.lifecycle import Entry, classify, leaves


class StateCatalogue:
    """The entries of every parameter's state, and the optimizer's state dicts they are in."""

    def __init__(self, optimizer: BlockPreconditioner) -> None:
        self.opt = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.entries: list[Entry] = []
        self.by_param: dict[int, list[int]] = {}
        """Parameter index -> the ids (positions in `entries`) of its entries."""
        for index in range(len(self.params)):
            spec = optimizer.state_spec(index)
            ids = self.by_param[index] = []
            for path, t in leaves(spec):
                ids.append(len(self.entries))
                self.entries.append(Entry(index, path, tuple(t.shape), t.dtype, classify(path)))

    def of(self, index: int) -> list[Entry]:
        """Parameter `index`'s entries, in their fixed order."""
        return [self.entries[i] for i in self.by_param[index]]

    def find(self, index: int, path: tuple) -> Entry:
        return next(e for e in self.of(index) if e.path == path)

    def state(self, index: int) -> dict:
        """Parameter `index`'s state dict in the optimizer."""
        return self.opt.state[self.params[index]]

    def has_state(self, index: int) -> bool:
        return bool(self.opt.state.get(self.params[index]))

    def factor_itemsize(self, index: int) -> int:
        """Bytes per element of parameter `index`'s factor blocks (4 where it has none)."""
        return max((e.dtype.itemsize for e in self.of(index) if e.path[0] == FACTORS),
                   default=4)
