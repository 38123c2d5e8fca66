"""Second-order optimizers (SOAP, Shampoo, KL-Shampoo), Muon, and the refresh seam the runtime
drives.

The optimizers are drop-in torch.optim.Optimizer classes whose synchronous ("native") mode is the
reference. Their expensive refresh is a pure function (`refresh_fn`) of a block snapshot, so the
runtime can compute it anywhere and swap the result in at a step boundary (`apply_refresh`).
This package imports nothing from the runtime: no threads, no ranks, no tiers.
"""

from asteria_core.optim.base import BlockPreconditioner
from asteria_core.optim.kl_shampoo import KLShampoo
from asteria_core.optim.muon import Muon, hidden_matrices
from asteria_core.optim.seam import (
    BlockInfo,
    BlockKey,
    FactorSnapshot,
    NonFiniteResult,
    RefreshConfig,
    RefreshResult,
    checked_refresh,
    is_finite,
    refresh_fn,
)
from asteria_core.optim.shampoo import Shampoo
from asteria_core.optim.soap import SOAP

__all__ = [
    "SOAP",
    "BlockInfo",
    "BlockKey",
    "BlockPreconditioner",
    "FactorSnapshot",
    "KLShampoo",
    "Muon",
    "NonFiniteResult",
    "RefreshConfig",
    "RefreshResult",
    "Shampoo",
    "checked_refresh",
    "hidden_matrices",
    "is_finite",
    "refresh_fn",
]
