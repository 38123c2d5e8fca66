"""The refresh seam: what a runtime needs to compute a preconditioner refresh anywhere.

An optimizer hands out a `FactorSnapshot` of one block (tensors the optimizer never writes again:
cloned, or lent without a copy, see `BlockPreconditioner.snapshot`) and a `RefreshConfig`;
`refresh_fn` turns them into a `RefreshResult` without touching any optimizer, so it can run
inline, on a host worker thread or process, or on another rank; the optimizer's `apply_refresh`
swaps the result in at a step boundary. All three types are plain picklable dataclasses of
tensors, ints, floats and strings.

Legend: b is the side of the block's factor; F_bb the factor statistics, Q_bb a basis (SOAP,
KL-Shampoo: eigenvector estimates in descending eigenvalue order; Shampoo: the inverse root).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from asteria_core.compat import Choice
from asteria_core.optim.matrix_functions import (
    eigh_descending,
    inverse_root,
    overlap_transport,
    power_qr,
    power_qr_sorted,
    unpack_symmetric,
)


class RefreshMethod(Choice):
    """How a block's new basis is computed."""

    EIGH = "eigh"
    POWER_QR = "power_qr"  # one power iteration and QR from the old basis (SOAP's refresh)
    INVERSE_ROOT = "inverse_root"  # Shampoo's (scale * F + eps I)^(-1/root)


class MomentSwap(Choice):
    """What a basis swap does to the second-moment statistics."""

    REFERENCE = "reference"  # permute, as SOAP does
    TRANSPORT = "transport"  # carry them over through the overlap of the two bases


BASIS_REFRESHES = (RefreshMethod.POWER_QR, RefreshMethod.EIGH)
"""The refreshes that give an eigenbasis (SOAP's, KL-Shampoo's); Shampoo's is an inverse root."""
REFRESH_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class BlockKey(NamedTuple):
    """Stable id of one refresh block: parameter, dimension of its work shape, chunk on that dim.

    `param` counts parameters across param_groups in order, as torch's state_dict does, so a key
    means the same block in every process that builds the optimizer the same way.
    """

    param: int
    dim: int
    chunk: int


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A refresh block as a scheduler sees it."""

    key: BlockKey
    size: int
    """b: the factor block is (b, b)."""
    cost: float
    """Refresh cost estimate, b**3 (eigh, QR and inverse roots are all cubic)."""
    swap_cost: float = 0.0
    """Swap cost estimate on the training thread: the elements of the block's slab of the
    parameter (its chunk along the block's dim) times b, a moment rotated along that dim; 0
    when unknown (the refresh cost stands in)."""


@dataclass(frozen=True, slots=True)
class RefreshConfig:
    """How to refresh one block. Built by the optimizer from the block's param group."""

    method: str
    """A RefreshMethod's value."""
    moment_swap: str = MomentSwap.REFERENCE.value
    """A MomentSwap's value: what the swap does to the second-moment statistics."""
    sort: bool = True
    """power_qr only: sort columns by estimated eigenvalue first (SOAP: yes; KL-Shampoo: no)."""
    dtype: str = "float32"
    """Compute dtype of the decomposition: float32 (the references) or float64."""
    root: float = 4.0
    """inverse_root only: the result is (scale * F + eps I)^(-1/root)."""
    eps: float = 0.0
    """inverse_root only: added to the eigenvalues (after clamping them at 0)."""
    rotate: bool = False
    """The swap rotates a moment by Q_old^T Q_new (SOAP's first moment): the refresh computes
    that b^3 product where it runs (a host worker), so the swap on the training thread does not."""

    def __post_init__(self) -> None:
        if self.method not in tuple(RefreshMethod):
            raise ValueError(f"method: got {self.method!r}; allowed: {' | '.join(RefreshMethod)}")
        if self.moment_swap not in tuple(MomentSwap):
            raise ValueError(f"moment_swap: got {self.moment_swap!r}; allowed: "
                             f"{' | '.join(MomentSwap)}")
        if self.dtype not in REFRESH_DTYPES:
            raise ValueError(f"dtype: got {self.dtype!r}; allowed: {tuple(REFRESH_DTYPES)}")

    @property
    def needs_basis(self) -> bool:
        """Whether refresh_fn reads the previous basis (warm start or transport)."""
        return self.method == RefreshMethod.POWER_QR or \
            self.moment_swap == MomentSwap.TRANSPORT or self.rotate


@dataclass(frozen=True, slots=True)
class FactorSnapshot:
    """One block's statistics at the end of step `stats_step`: read-only for everyone."""

    key: BlockKey
    stats_step: int
    """The optimizer step whose statistics these are."""
    base_version: int
    """Version of the basis in use when the snapshot was taken (0: the initial identity)."""
    factor: torch.Tensor
    """F_bb: the factor block (L or R statistics), or its upper triangle, packed (1-D)."""
    basis: torch.Tensor | None
    """Q_bb in use at snapshot time; None when the refresh does not read it."""
    scale: float = 1.0
    """Multiply the factor by this before refreshing (Shampoo's EMA bias correction)."""


@dataclass(frozen=True, slots=True)
class RefreshResult:
    """A new basis for one block plus what swapping it in needs."""

    key: BlockKey
    stats_step: int
    base_version: int
    basis: torch.Tensor
    """New Q_bb (in the factor's dtype)."""
    perm: torch.Tensor | None = None
    """(b,) reference swap: new coordinate j continues old coordinate perm[j]."""
    transport: torch.Tensor | None = None
    """(b, b) P[i, j] = <q_old_i, q_new_j>^2: second-moment transport (moment_swap=transport)."""
    rotation: torch.Tensor | None = None
    """(b, b) Q_old^T Q_new in the factor's dtype, Q_old the snapshot's basis (config.rotate):
    what the swap multiplies the first moment by while that basis is still the one in use."""

    def to_dict(self) -> dict:
        return {"key": tuple(self.key), "stats_step": self.stats_step,
                "base_version": self.base_version, "basis": self.basis, "perm": self.perm,
                "transport": self.transport, "rotation": self.rotation}

    @classmethod
    def from_dict(cls, data: dict) -> RefreshResult:
        return cls(key=BlockKey(*data["key"]), stats_step=data["stats_step"],
                   base_version=data["base_version"], basis=data["basis"], perm=data["perm"],
                   transport=data["transport"], rotation=data.get("rotation"))


def refresh_fn(snapshot: FactorSnapshot, config: RefreshConfig) -> RefreshResult:
    """Compute a block's new basis from a snapshot: pure, deterministic for the same inputs.

    power_qr starts from an eigh when the snapshot's basis is the initial identity (version 0),
    as the references do at a parameter's first step. A float32 refresh that fails (the solver
    raises, or gives NaN or infinite values: A Q overflows when the factor's entries near
    float32's range) is computed again in float64, the result cast back. Raises
    torch.linalg.LinAlgError when the factor itself holds NaN or infinite values (no dtype
    helps, and an eigh may even return a finite basis for it) or the decomposition fails in
    float64 too; the caller keeps the old basis and counts a failure.
    """
    if not bool(torch.isfinite(snapshot.factor).all()):
        raise torch.linalg.LinAlgError(f"the factor statistics of {tuple(snapshot.key)} hold "
                                       "NaN or infinite values")
    dtype = REFRESH_DTYPES[config.dtype]
    if dtype == torch.float64:
        return _refresh(snapshot, config, dtype)
    try:
        result = _refresh(snapshot, config, dtype)
        if is_finite(result):
            return result
    except torch.linalg.LinAlgError:
        pass
    return _refresh(snapshot, config, torch.float64)


def _refresh(snapshot: FactorSnapshot, config: RefreshConfig,
             dtype: torch.dtype) -> RefreshResult:
    factor_bb = snapshot.factor if snapshot.factor.dim() == 2 else \
        unpack_symmetric(snapshot.factor)  # packed statistics open here, off the training thread
    factor_bb = factor_bb if snapshot.scale == 1.0 else factor_bb * snapshot.scale
    perm_b = None
    match config.method:
        case RefreshMethod.INVERSE_ROOT:
            q_new_bb = inverse_root(factor_bb, config.root, config.eps, dtype)
        case RefreshMethod.EIGH:
            q_new_bb = eigh_descending(factor_bb, dtype)[1]
        case RefreshMethod.POWER_QR if snapshot.base_version == 0:
            q_new_bb = eigh_descending(factor_bb, dtype)[1]
        case RefreshMethod.POWER_QR if config.sort:
            q_new_bb, perm_b = power_qr_sorted(factor_bb, _basis(snapshot), dtype)
        case RefreshMethod.POWER_QR:
            q_new_bb = power_qr(factor_bb, _basis(snapshot), dtype)
        case _:
            raise NotImplementedError(config.method)
    transport_bb = None
    if config.moment_swap == MomentSwap.TRANSPORT:
        transport_bb = overlap_transport(_basis(snapshot).to(dtype), q_new_bb)
        transport_bb = transport_bb.to(snapshot.factor.dtype)
        perm_b = None
    elif snapshot.base_version == 0 and config.method != RefreshMethod.INVERSE_ROOT:
        # The first basis replaces the initial identity, which the references never train with
        # (their first basis comes before any update), so their rule has nothing to say here.
        # Statistics gathered in identity coordinates are carried over exactly (diagonal of the
        # old second moment seen in the new basis), not read index-aligned (docs/optimizers.md).
        transport_bb = q_new_bb.square().to(snapshot.factor.dtype)
    # Contiguous in the factor's dtype: the swap installs it as it is, with no copy.
    basis_bb = q_new_bb.to(snapshot.factor.dtype).contiguous()
    # The product the swap would otherwise compute on the training thread, bit for bit (same
    # operands, same dtype): here it runs where the refresh runs.
    rotation_bb = _basis(snapshot).T @ basis_bb if config.rotate else None
    return RefreshResult(key=snapshot.key, stats_step=snapshot.stats_step,
                         base_version=snapshot.base_version, basis=basis_bb, perm=perm_b,
                         transport=transport_bb, rotation=rotation_bb)


def _basis(snapshot: FactorSnapshot) -> torch.Tensor:
    if snapshot.basis is None:
        raise ValueError(f"snapshot of {snapshot.key} has no basis, but the refresh needs it")
    return snapshot.basis


class NonFiniteResult(ValueError):
    """A refresh returned NaN or infinite values."""


def checked_refresh(fn, snapshot: FactorSnapshot, config: RefreshConfig,
                    pin_memory: bool = False) -> RefreshResult:
    """`fn(snapshot, config)`, raising NonFiniteResult when the result is not finite. A runtime
    runs this where the refresh runs (a worker), so the check is off the training thread. With
    `pin_memory` the result's CPU tensors are moved to pinned memory, from which the swap copies
    them to a CUDA device without blocking the host."""
    result = fn(snapshot, config)
    if not is_finite(result):
        raise NonFiniteResult("non-finite values in the result")
    if pin_memory:
        def pin(t):
            return t if t is None or t.device.type != "cpu" else t.pin_memory()

        result = dataclasses.replace(result, basis=pin(result.basis), perm=pin(result.perm),
                                     transport=pin(result.transport),
                                     rotation=pin(result.rotation))
    return result


def is_finite(result: RefreshResult) -> bool:
    """True when every float tensor of the result is finite. A host sync (reads one bool)."""
    tensors = [t for t in (result.basis, result.transport, result.rotation) if t is not None]
    return all(bool(torch.isfinite(t).all()) for t in tensors)
