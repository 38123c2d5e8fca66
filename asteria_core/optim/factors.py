"""The factor statistics of a block preconditioner's blocks: which this rank keeps, where an
update writes while a snapshot holds a factor, and a factor's handover between ranks."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from asteria_core.optim.blocks import Owner, ParamBlocks
from asteria_core.optim.layout import Layout
from asteria_core.optim.residency import Writes, resident
from asteria_core.optim.seam import BlockKey
from asteria_core.optim.state_keys import FACTORS


class FactorStatistics:
    """Factor blocks: zero at first, updated by the per-step math, read by snapshots.

    Under data parallelism the owner's `keeps_factor` (set by the runtime) says which blocks
    this rank keeps: the others' factors are empty placeholders whose updates are skipped.
    """

    def __init__(self, owner: Owner, blocks: ParamBlocks) -> None:
        self._owner = owner
        self._blocks = blocks
        self.stepping: tuple[int, Layout] | None = None
        """(index, layout) of the parameter whose per-step math is running (`keeps` answers
        for its blocks)."""
        self._lent: weakref.WeakValueDictionary[int, torch.Tensor] = \
            weakref.WeakValueDictionary()
        """Factor blocks a snapshot holds without a copy, by id: their next update writes a new
        tensor (copy on write). An entry goes when its tensor dies, before its id can be reused."""
        self.handed = 0
        """Blocks handed to or from this rank so far (`hand`): what this rank keeps changed."""

    # ---- the per-step math ----------------------------------------------------------------
    def keeps(self, dim: int, chunk: int | None = None) -> bool:
        """Whether this rank keeps the factor of block (stepping parameter, dim, chunk); with
        chunk None, of any block of that dim (else the dim's factor work can be skipped)."""
        keeps, stepping = self._owner.keeps_factor, self.stepping
        if keeps is None:
            return True
        assert stepping is not None  # called from a parameter's per-step math
        index, layout = stepping  # laid out before its math runs
        chunks: Sequence[int]
        if chunk is None:
            sizes = layout.chunks[dim]
            assert sizes is not None  # a preconditioned dim
            chunks = range(len(sizes))
        else:
            chunks = (chunk,)
        return any(keeps(BlockKey(index, dim, c)) for c in chunks)

    def init(self, state: dict, layout: Layout, like: torch.Tensor,
             packed: bool = False) -> None:
        """Zero factors for every block of the stepping parameter (an empty placeholder where
        another rank keeps the factor; `packed`: the upper triangle only)."""
        kw: dict[str, Any] = {"dtype": like.dtype, "device": like.device}

        def factor(b: int) -> torch.Tensor:
            return torch.zeros(b * (b + 1) // 2, **kw) if packed else torch.zeros(b, b, **kw)

        state[FACTORS] = [None if sizes is None else
                          [factor(b) if self.keeps(dim, c) else
                           torch.empty(0, **kw) for c, b in enumerate(sizes)]
                          for dim, sizes in enumerate(layout.chunks)]

    def update_target(self, blocks: list[torch.Tensor], chunk: int) -> torch.Tensor | None:
        """Where an update of factor `blocks[chunk]` writes its result: in place, or into a new
        tensor that takes the block's place when a snapshot holds it (lent); None when this rank
        does not keep that factor (skip the update). The update reads the old values from the
        tensor it held before calling this."""
        old = blocks[chunk]
        if old.numel() == 0:
            return None  # another rank's factor
        if self._lent.pop(id(old), None) is None:
            return old
        blocks[chunk] = torch.empty_like(old)
        return blocks[chunk]

    # ---- snapshots ------------------------------------------------------------------------
    def lend(self, factor: torch.Tensor) -> None:
        """A snapshot holds `factor` without a copy: its next update writes a new tensor."""
        self._lent[id(factor)] = factor

    def forget_lent(self) -> None:
        """The state was replaced (a checkpoint loaded): no factor in use is lent."""
        self._lent.clear()

    # ---- handover between ranks (distributed/rebalance.py) --------------------------------
    def copy_of(self, key: BlockKey) -> torch.Tensor:
        """A copy of block `key`'s factor statistics (empty where another rank keeps them)."""
        p, _, _ = self._blocks.locate(key)
        state = self._blocks.state(p, key)
        with resident(self._owner.residency, key.param, state, Writes.NONE):
            return state[FACTORS][key.dim][key.chunk].clone()

    def holds(self, key: BlockKey) -> bool:
        """Whether this rank holds block `key`'s factor statistics (False before the block's
        parameter took its first step)."""
        p, _, _ = self._blocks.locate(key)
        state = self._owner.state.get(p)
        if not state:
            return False
        return state[FACTORS][key.dim][key.chunk].numel() > 0

    def empty_like(self, key: BlockKey) -> torch.Tensor:
        """An uninitialised CPU tensor shaped as block `key`'s factor statistics (to receive
        them): (b, b), or b (b + 1) / 2 values when the optimizer packs them."""
        p, group, layout = self._blocks.locate(key)
        sizes = layout.chunks[key.dim]
        assert sizes is not None  # a refresh block's dim (locate)
        b = sizes[key.chunk]
        like = self._blocks.state(p, key)[FACTORS][key.dim][key.chunk]
        shape = (b * (b + 1) // 2,) if group.get("pack_factors") else (b, b)
        return torch.empty(shape, dtype=like.dtype)

    def hand(self, key: BlockKey, factor: torch.Tensor | None) -> None:
        """Block `key` changed owner rank: keep `factor`, its statistics as the old owner had
        them, or None: keep none (an empty placeholder)."""
        p, _, _ = self._blocks.locate(key)
        state = self._blocks.state(p, key)
        with resident(self._owner.residency, key.param, state, Writes.ALL):
            old = state[FACTORS][key.dim][key.chunk]
            kept = torch.empty(0, dtype=old.dtype, device=old.device) if factor is None else \
                factor.to(old.device, old.dtype)
            state[FACTORS][key.dim][key.chunk] = kept
        self.handed += 1
