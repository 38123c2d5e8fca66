"""The bases of a block preconditioner's blocks: identity at first, then swapped for refresh
results at step boundaries, with the moments kept per coordinate re-expressed along the
swapped block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from asteria_core.optim.blocks import Owner, ParamBlocks
from asteria_core.optim.layout import Layout, chunk_slice, map_dim_by, new_blocks, permute_dim
from asteria_core.optim.matrix_functions import overlap_transport
from asteria_core.optim.residency import install
from asteria_core.optim.seam import BlockKey, RefreshResult
from asteria_core.optim.state_keys import BASES, BASIS_STEPS, VERSIONS

SwapMoments = Callable[[torch.Tensor | None, torch.Tensor | None], None]
"""(perm_b, p_bb) -> None: re-express the moments of the block being swapped (perm or
transport; both None: nothing to do)."""


class Bases:
    """Each block's basis in use (Shampoo: its inverse root), how many swaps it has seen and
    which step's statistics made it."""

    def __init__(self, owner: Owner, blocks: ParamBlocks) -> None:
        self._owner = owner
        self._blocks = blocks

    def init(self, state: dict, layout: Layout, like: torch.Tensor) -> None:
        """Identity bases, version 0 and no stats step for every block of a parameter."""
        kw: dict[str, Any] = {"dtype": like.dtype, "device": like.device}
        state[BASES] = new_blocks(layout, lambda b: torch.eye(b, **kw))
        state[VERSIONS] = [None if s is None else [0] * len(s) for s in layout.chunks]
        state[BASIS_STEPS] = [None if s is None else [-1] * len(s) for s in layout.chunks]

    def version(self, key: BlockKey) -> int:
        """Swaps block `key` has seen (0: the initial identity)."""
        p, _, _ = self._blocks.locate(key)
        return self._blocks.state(p, key)[VERSIONS][key.dim][key.chunk]

    def stats_step(self, key: BlockKey) -> int:
        """The step whose statistics made block `key`'s basis in use (-1: initial identity)."""
        p, _, _ = self._blocks.locate(key)
        return self._blocks.state(p, key)[BASIS_STEPS][key.dim][key.chunk]

    def swap(self, key: BlockKey, result: RefreshResult, state: dict,
             swap_moments: SwapMoments) -> None:
        """`result`'s basis into block `key` (state resident), the moments re-expressed first.

        The moments use the result's perm/transport when the result was computed from the basis
        still in use; if another swap happened since its snapshot, the transport is recomputed
        against the current basis (and a reference permutation, which only makes sense relative
        to the basis it was computed from, is skipped).
        """
        basis_bb = state[BASES][key.dim][key.chunk]
        if result.basis.shape != basis_bb.shape:
            raise ValueError(f"result basis {tuple(result.basis.shape)} does not fit block {key} "
                             f"{tuple(basis_bb.shape)}")
        version = state[VERSIONS][key.dim][key.chunk]
        # non_blocking: from a worker's pinned result the copy to a CUDA device is asynchronous
        new_bb = result.basis.to(basis_bb.device, basis_bb.dtype, non_blocking=True)
        perm_b, p_bb = result.perm, result.transport
        if result.base_version != version:
            perm_b = None
            p_bb = None if p_bb is None else overlap_transport(basis_bb, new_bb)
        if p_bb is not None:
            p_bb = p_bb.to(basis_bb.device, basis_bb.dtype, non_blocking=True)
        swap_moments(perm_b, p_bb)
        install(self._owner.residency, key.param, state[BASES][key.dim], key.chunk, new_bb)
        state[VERSIONS][key.dim][key.chunk] = version + 1
        state[BASIS_STEPS][key.dim][key.chunk] = result.stats_step

    def swap_chunk(self, state: dict, name: str, layout: Layout, key: BlockKey,
                   fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """state[name] (work shape) with the chunk of block `key` along its dim replaced by
        fn(chunk). With one chunk on the dim the result takes the old tensor's place; with
        several only the chunk is written, in place, so a swap costs the chunk's size, not the
        whole parameter's per block."""
        sizes = layout.chunks[key.dim]
        assert sizes is not None  # a refresh block's dim
        if len(sizes) == 1:
            install(self._owner.residency, key.param, state, name, fn(state[name]))
            return
        part = chunk_slice(state[name], key.dim, sizes, key.chunk)
        part.copy_(fn(part))

    def swap_along_dim(self, state: dict, name: str, layout: Layout, key: BlockKey, perm_b,
                       p_bb) -> None:
        """state[name] re-expressed for a swap of block `key`: perm or transport on its chunk."""
        if p_bb is not None:
            self.swap_chunk(state, name, layout, key, lambda x: map_dim_by(x, key.dim, p_bb))
        elif perm_b is not None:
            self.swap_chunk(state, name, layout, key, lambda x: permute_dim(x, key.dim, perm_b))
