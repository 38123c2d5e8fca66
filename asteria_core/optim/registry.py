"""The optimizers by name: one registry the runtime's factory, the trainer's config and the
data-parallel checks all read, so adding an optimizer is one entry here.

Each entry says what the optimizer is (first or second order), which second-order options its
constructor takes, and how to build it from the arguments every optimizer shares (lr, betas,
eps, the refresh interval).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from asteria_core.compat import Choice
from asteria_core.optim.kl_shampoo import KLShampoo
from asteria_core.optim.muon import Muon, hidden_matrices
from asteria_core.optim.shampoo import Shampoo
from asteria_core.optim.soap import SOAP


class OptimizerName(Choice):
    ADAMW = "adamw"  # the first-order baseline (torch's)
    SOAP = "soap"
    SHAMPOO = "shampoo"
    KL_SHAMPOO = "kl_shampoo"
    MUON = "muon"  # Muon on the hidden matrices, AdamW on the rest (torch.optim.Muon's)


SHAPE_OPTIONS = ("max_precond_dim", "block_size")
"""How a second-order optimizer cuts a parameter into preconditioner blocks."""
BASIS_OPTIONS = ("shampoo_beta", "refresh", "moment_swap")
"""How an eigenbasis optimizer (SOAP, KL-Shampoo) keeps and refreshes its basis."""
SOAP_OPTIONS = ("pack_factors",)
"""SOAP's own: each factor block kept as its upper triangle."""
SECOND_ORDER_OPTIONS = (*SHAPE_OPTIONS, *BASIS_OPTIONS, *SOAP_OPTIONS, "refresh_dtype",
                        "normalize_grads")
"""Every option some second-order constructor takes (none of them is AdamW's)."""
MUON_OPTIONS = ("adjust_lr_fn", "adamw_lr")
"""What the trainer's `optim` section sets for Muon: its shape scaling, the AdamW part's lr."""

Build = Callable[..., torch.optim.Optimizer]


@dataclass(frozen=True, slots=True)
class OptimizerSpec:
    name: OptimizerName
    second_order: bool
    """Preconditioner blocks refreshed by the runtime (a BlockPreconditioner)."""
    config_options: tuple[str, ...]
    """The options beyond lr, betas and eps that the trainer's `optim` section sets for it."""
    build: Build
    """(params, lr=, betas=, eps=, refresh_interval=, **options) -> the torch optimizer."""
    model_options: Callable[[torch.nn.Module], dict[str, Any]] = lambda model: {}
    """Options it derives from the model being trained (Muon: which matrices are hidden);
    options given by the caller win."""


def _adamw(params: list, *, lr: float, betas: tuple[float, float], eps: float,
           refresh_interval: int, **options: Any) -> torch.optim.Optimizer:
    unknown = sorted(set(options) & set(SECOND_ORDER_OPTIONS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not an AdamW option; allowed with adamw: "
                         "lr, betas, eps, weight_decay")
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, **options)


def _shampoo(params: list, *, lr: float, betas: tuple[float, float], eps: float,
             refresh_interval: int, **options: Any) -> torch.optim.Optimizer:
    # betas[0] is Shampoo's momentum; betas[1] and eps are its grafting AdamW's.
    return Shampoo(params, lr=lr, betas=(betas[0], 1.0), grafting_beta2=betas[1],
                   grafting_eps=eps, precondition_frequency=refresh_interval, **options)


def _muon(params: list, *, lr: float, betas: tuple[float, float], eps: float,
          refresh_interval: int, **options: Any) -> torch.optim.Optimizer:
    # betas and eps are the AdamW part's; Muon's momentum is its own option (0.95).
    unknown = sorted(set(options) & set(SECOND_ORDER_OPTIONS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a Muon option; allowed with muon: lr, betas, eps, "
                         "weight_decay, momentum, nesterov, ns_coefficients, ns_steps, "
                         "adjust_lr_fn, ns_dtype, hidden, adamw_lr")
    return Muon(params, lr=lr, adamw_betas=betas, adamw_eps=eps, **options)


def _eigenbasis(cls: Callable[..., torch.optim.Optimizer]) -> Build:
    def build(params: list, *, lr: float, betas: tuple[float, float], eps: float,
              refresh_interval: int, **options: Any) -> torch.optim.Optimizer:
        return cls(params, lr=lr, betas=betas, eps=eps,
                   precondition_frequency=refresh_interval, **options)
    return build


REGISTRY: dict[OptimizerName, OptimizerSpec] = {spec.name: spec for spec in (
    OptimizerSpec(OptimizerName.ADAMW, False, (), _adamw),
    OptimizerSpec(OptimizerName.SOAP, True, SHAPE_OPTIONS + BASIS_OPTIONS + SOAP_OPTIONS,
                  _eigenbasis(SOAP)),
    OptimizerSpec(OptimizerName.SHAMPOO, True, SHAPE_OPTIONS, _shampoo),
    OptimizerSpec(OptimizerName.KL_SHAMPOO, True, SHAPE_OPTIONS + BASIS_OPTIONS,
                  _eigenbasis(KLShampoo)),
    OptimizerSpec(OptimizerName.MUON, False, MUON_OPTIONS, _muon,
                  lambda model: {"hidden": hidden_matrices(model)}),
)}
OPTIMIZERS = tuple(name.value for name in OptimizerName)
"""The optimizers the runtime knows by name (plain strings: argparse choices, say)."""


def spec_of(name: str) -> OptimizerSpec:
    """The registry's entry for `name`; a ValueError naming the allowed ones otherwise."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer: got {name!r}; allowed: {' | '.join(OPTIMIZERS)}")
    return REGISTRY[OptimizerName(name)]
