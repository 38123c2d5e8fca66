"""How a parameter is seen by a block preconditioner: work shape, preconditioned dims, blocks.

Legend: a parameter is viewed in its work shape (d_0, ..., d_{k-1}) (its own shape, or the SOAP
reference's merged shape when merge_dims is on). Dimension i is either skipped (identity: too
large, or 1-D without precondition_1d) or split into chunks of sizes (b_i0, b_i1, ...), each at
most block_size. Every chunk owns one (b, b) factor block and one (b, b) basis block, so the
factor of dimension i is block diagonal. A dimension with one chunk is the unblocked case, and
the code below takes exactly the same path for it.

Nested per-parameter containers are indexed [dim][chunk]; a skipped dim holds None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

Blocks = list[list[torch.Tensor] | None]  # [dim][chunk] -> tensor, None for a skipped dim


@dataclass(frozen=True, slots=True)
class Layout:
    """The block structure of one parameter."""

    shape: tuple[int, ...]
    """Work shape (after merging dims, if enabled)."""
    chunks: tuple[tuple[int, ...] | None, ...]
    """Per dim: chunk sizes along it, or None when the dim is not preconditioned."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def blocks(self) -> list[tuple[int, int, int]]:
        """(dim, chunk, size) for every factor block, in a fixed order."""
        return [(dim, c, size) for dim, sizes in enumerate(self.chunks) if sizes is not None
                for c, size in enumerate(sizes)]

    @property
    def preconditioned(self) -> bool:
        return any(sizes is not None for sizes in self.chunks)


def merge_dims(shape: Sequence[int], max_precond_dim: int) -> tuple[int, ...]:
    """The SOAP reference's dim merging: walk dims left to right, merging while the product fits."""
    merged: list[int] = []
    current = 1
    for size in shape:
        if current * size > max_precond_dim:
            if current > 1:
                merged.append(current)
                current = size
            else:
                merged.append(size)
                current = 1
        else:
            current *= size
    if current > 1 or not merged:
        merged.append(current)
    return tuple(merged)


def split_sizes(size: int, block_size: int | None) -> tuple[int, ...]:
    """Chunks of block_size along a dim of `size` (the last one smaller); one chunk if it fits."""
    if block_size is None or size <= block_size:
        return (size,)
    full, rest = divmod(size, block_size)
    return (block_size,) * full + ((rest,) if rest else ())


def make_layout(shape: Sequence[int], *, max_precond_dim: int, block_size: int | None,
                merge: bool, precondition_1d: bool) -> Layout:
    """Layout rules of the SOAP reference, plus blocking of the dims it preconditions."""
    shape = tuple(shape)
    if len(shape) == 1:
        keep = precondition_1d and shape[0] <= max_precond_dim
        return Layout(shape, (split_sizes(shape[0], block_size) if keep else None,))
    work = merge_dims(shape, max_precond_dim) if merge and len(shape) > 1 else shape
    chunks = tuple(split_sizes(size, block_size) if size <= max_precond_dim else None
                   for size in work)
    return Layout(work, chunks)


def new_blocks(layout: Layout, make) -> Blocks:
    """A [dim][chunk] container with make(size) per block and None for skipped dims."""
    return [None if sizes is None else [make(size) for size in sizes] for sizes in layout.chunks]


def _mul_last(x: torch.Tensor, dim: int, m_bb: torch.Tensor) -> torch.Tensor:
    # x: (..., b at `dim`, ...) -> same shape with that axis mapped by x_b -> x_b @ m_bb
    return (x.movedim(dim, -1) @ m_bb).movedim(-1, dim)


def map_dim(x: torch.Tensor, dim: int, mats: list[torch.Tensor], transpose: bool) -> torch.Tensor:
    """Map axis `dim` of x through a block-diagonal matrix given as its diagonal blocks.

    Per chunk: y_j = sum_i x_i M[i, j] (transpose=False) or y_i = sum_j x_j M[i, j] (True).
    """
    if len(mats) == 1:
        return _mul_last(x, dim, mats[0].T if transpose else mats[0])
    parts = torch.split(x, [m.shape[0] for m in mats], dim=dim)
    return torch.cat([_mul_last(part, dim, m.T if transpose else m)
                      for part, m in zip(parts, mats, strict=True)], dim=dim)


def to_basis(x: torch.Tensor, bases: Blocks, skip: int | None = None) -> torch.Tensor:
    """Rotate x into the eigenbasis along every preconditioned dim (except `skip`).

    For a matrix G_mn with bases Q_mm, Q_nn this is Q_mm^T @ G_mn @ Q_nn.
    """
    for dim, mats in enumerate(bases):
        if mats is not None and dim != skip:
            x = map_dim(x, dim, mats, transpose=False)
    return x


def from_basis(x: torch.Tensor, bases: Blocks) -> torch.Tensor:
    """Inverse of to_basis: for a matrix, Q_mm @ X_mn @ Q_nn^T."""
    for dim, mats in enumerate(bases):
        if mats is not None:
            x = map_dim(x, dim, mats, transpose=True)
    return x


def dim_outer(x: torch.Tensor, dim: int, sizes: tuple[int, ...]) -> list[torch.Tensor]:
    """Per chunk of `dim`: the contraction of x with itself over all other dims, (b, b) each.

    For a matrix G_mn: dim 0 gives G G^T (m, m), dim 1 gives G^T G (n, n).
    """
    parts = (x,) if len(sizes) == 1 else torch.split(x, list(sizes), dim=dim)
    outs = []
    for part in parts:
        mat = part.movedim(dim, 0).reshape(part.shape[dim], -1)  # (b, numel / b)
        outs.append(mat @ mat.T)
    return outs


def dim_broadcast(vec_d: torch.Tensor, dim: int, ndim: int) -> torch.Tensor:
    """View a length-d_dim vector so it broadcasts along axis `dim` of an ndim-tensor."""
    shape = [1] * ndim
    shape[dim] = -1
    return vec_d.view(shape)


def chunk_slice(x: torch.Tensor, dim: int, sizes: tuple[int, ...], chunk: int) -> torch.Tensor:
    """The part of x that chunk `chunk` of `dim` covers: a view, so writing it writes x."""
    return x.narrow(dim, sum(sizes[:chunk]), sizes[chunk])


def permute_dim(x: torch.Tensor, dim: int, perm_b: torch.Tensor) -> torch.Tensor:
    """x re-indexed along `dim` (of length b): new[j] = old[perm[j]]."""
    return x.index_select(dim, perm_b.to(x.device, non_blocking=True))


def map_dim_by(x: torch.Tensor, dim: int, m_bb: torch.Tensor) -> torch.Tensor:
    """x with axis `dim` (of length b) mapped by y_j = sum_i x_i M[i, j].

    Along the first axis as M^T x: the result comes out contiguous. The general form would
    come out transposed, and the swap that installs it as a moment would copy it once more
    (on the training thread, a whole moment per swap)."""
    if dim == 0:
        return (m_bb.T @ x.reshape(x.shape[0], -1)).reshape(x.shape)
    return _mul_last(x, dim, m_bb)
