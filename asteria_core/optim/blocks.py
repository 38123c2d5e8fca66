"""A block preconditioner's parameters as refresh blocks: each parameter's index and layout, the
block a `BlockKey` names, and the state that block lives in."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from asteria_core.optim.layout import Layout, make_layout
from asteria_core.optim.residency import Residency
from asteria_core.optim.seam import BlockInfo, BlockKey
from asteria_core.optim.shards import local_shard


class Owner(Protocol):
    """What the optimizer's collaborators read from the optimizer that holds them: its groups
    and state (torch's), and what a runtime plugs into it."""

    param_groups: list[dict[str, Any]]
    state: defaultdict[torch.Tensor, Any]
    residency: Residency | None
    keeps_factor: Callable[[BlockKey], bool] | None


class ParamBlocks:
    """The optimizer's parameters by index, their layouts, and the blocks they split into.

    `index` counts parameters across param_groups in order (BlockKey.param). Layouts and the
    index are cached and rebuilt when a group's options or the groups themselves change.
    """

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        self._layouts: dict[int, tuple[tuple, Layout]] = {}
        self._by_index: tuple[tuple, dict[int, tuple[torch.Tensor, dict]]] | None = None

    def indexed(self) -> Iterator[tuple[int, torch.Tensor, dict]]:
        """(index, parameter, group) of every parameter, in order."""
        index = 0
        for group in self._owner.param_groups:
            for p in group["params"]:
                yield index, p, group
                index += 1

    def layout(self, index: int, p: torch.Tensor, group: dict) -> Layout:
        """The layout of this rank's part of p (all of it, unless FSDP2 shards it)."""
        shape = tuple(local_shard(p).shape)
        spec = (shape, group["max_precond_dim"], group["block_size"],
                group["merge_dims"], group["precondition_1d"])
        cached = self._layouts.get(index)
        if cached is None or cached[0] != spec:
            layout = make_layout(shape, max_precond_dim=spec[1], block_size=spec[2],
                                 merge=spec[3], precondition_1d=spec[4])
            cached = self._layouts[index] = (spec, layout)
        return cached[1]

    def infos(self) -> list[BlockInfo]:
        """Every refresh block of every parameter, in a fixed order (known before step 1)."""
        return [BlockInfo(BlockKey(index, dim, c), size, float(size) ** 3,
                          layout.numel / layout.shape[dim] * size * size)
                for index, p, group in self.indexed() if local_shard(p).numel()
                for layout in [self.layout(index, p, group)]
                for dim, c, size in layout.blocks()]

    def locate(self, key: BlockKey) -> tuple[torch.Tensor, dict, Layout]:
        """(parameter, group, layout) of block `key`; KeyError when no such block exists."""
        found = self._params_by_index().get(key.param)
        if found is None:
            raise KeyError(f"{key}: no parameter with index {key.param}")
        p, group = found
        layout = self.layout(key.param, p, group)
        sizes = layout.chunks[key.dim] if key.dim < len(layout.chunks) else None
        if sizes is None or not 0 <= key.chunk < len(sizes):
            raise KeyError(f"{key} is not a refresh block (layout {layout})")
        return p, group, layout

    def state(self, p: torch.Tensor, key: BlockKey) -> dict:
        """The state of parameter p, which block `key` belongs to; KeyError before its first
        step."""
        state = self._owner.state.get(p)
        if not state:
            raise KeyError(f"{key}: the parameter has not taken a step yet")
        return state

    def _params_by_index(self) -> dict[int, tuple[torch.Tensor, dict]]:
        """index -> (parameter, group), kept until the groups change: a boundary looks up
        every block it snapshots or swaps, and a scan per lookup made that quadratic in the
        parameters (seconds per round with thousands of blocks)."""
        shape = tuple((id(g["params"]), len(g["params"])) for g in self._owner.param_groups)
        cached = self._by_index
        if cached is None or cached[0] != shape:
            cached = self._by_index = (shape, {i: (p, g) for i, p, g in self.indexed()})
        return cached[1]
