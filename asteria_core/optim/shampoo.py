"""Shampoo (Gupta et al. 2018; Anil et al. 2020) with inverse roots, epsilon and Adam grafting.

Defaults follow Meta's Distributed Shampoo (facebookresearch/optimizers) with its Adam grafting
config. Per parameter with gradient G (work shape; for a matrix G_mn, order k = 2):

    m <- lerp(m, G, 1 - b1);  v <- b2g v + (1 - b2g) G^2              (original basis)
    A = (m / (1 - b1^t)) / (sqrt(v / (1 - b2g^t)) + graft_eps)           (Adam direction)
    S = L_mm^(-1/2k) m R_nn^(-1/2k)                                      (Shampoo direction)
    p <- p (1 - lr wd) - lr * S * ||A|| / ||S||                          (Adam norm grafting)
    L <- b2 L + (1 - b2) G G^T, R likewise (b2 = 1: a running sum, AdaGrad style)
    every precondition_frequency steps: root <- (L / (1 - b2^t) + eps I)^(-1/2k) at the boundary

Until every block of a parameter has its first root, the parameter takes the plain Adam step
(exactly torch.optim.AdamW's arithmetic), like Meta before start_preconditioning_step.

Deviation from Meta, on purpose: factors are updated after the parameter update and roots are
swapped in at the step boundary, so the roots used at step t never contain G_t (the SOAP and
KL-Shampoo references' order). One seam and one staleness clock for all three optimizers.
Grafting is per parameter (Meta grafts per block); our blocks are block-diagonal factor pieces
of the same parameter, so one norm per parameter is the natural unit.
"""

from __future__ import annotations

import math

import torch

from asteria_core.optim.base import BlockPreconditioner, check_range
from asteria_core.optim.layout import Layout, dim_outer, map_dim
from asteria_core.optim.seam import MomentSwap, RefreshConfig, RefreshMethod
from asteria_core.optim.state_keys import BASES, EXP_AVG, FACTORS, STEP, VERSIONS

GRAFT_EXP_AVG_SQ = "graft_exp_avg_sq"  # Adam grafting second moment, original basis


class Shampoo(BlockPreconditioner):
    """Shampoo with Adam grafting as a torch.optim.Optimizer.

    Args:
        lr: learning rate (Default: 1e-2, Meta's).
        betas: (b1 momentum of the filtered gradient, b2 factor EMA; 1.0 = sum) (Default:
            (0.9, 1.0), Meta's).
        eps: added to the factor's eigenvalues before the inverse root (Default: 1e-12, Meta's).
        weight_decay: decoupled, AdamW order (Default: 0.0).
        precondition_frequency: steps between root refreshes (Default: 1, Meta's; Meta
            recommends hundreds at scale).
        block_size: largest factor side (Default: 1024, Meta's max_preconditioner_dim).
        max_precond_dim: dims larger than this get no factor (Default: 10000, as SOAP).
        merge_dims, precondition_1d: as SOAP (Default: False, False; 1-D parameters are Adam).
        grafting_beta2, grafting_eps: Adam grafting (Default: 0.999, 1e-8, Meta's).
        use_bias_correction: bias-correct momentum, grafting and factor EMAs (Default: True).
        exponent_override: root p in A^(-1/p); 0 means 2 * order (Default: 0).
        refresh_dtype: float32 | float64 (Default: float64: fp64 eigh costs the same on CPU).
        refresh_delay: swap a root computed at step t in at t + d (Default: 0).
    """

    def __init__(self, params, lr: float = 1e-2, betas: tuple[float, float] = (0.9, 1.0),
                 eps: float = 1e-12, weight_decay: float = 0.0, precondition_frequency: int = 1,
                 block_size: int | None = 1024, max_precond_dim: int = 10000,
                 merge_dims: bool = False, precondition_1d: bool = False,
                 grafting_beta2: float = 0.999, grafting_eps: float = 1e-8,
                 use_bias_correction: bool = True, exponent_override: float = 0,
                 refresh_dtype: str = "float64", refresh_delay: int = 0) -> None:
        for i, beta in enumerate(betas):
            check_range(f"betas[{i}]", beta, 0.0, 1.0)
        check_range("grafting_beta2", grafting_beta2, 0.0, 1.0)
        check_range("eps", eps, 0.0, float("inf"))
        check_range("grafting_eps", grafting_eps, 0.0, float("inf"))
        check_range("exponent_override", exponent_override, 0.0, float("inf"))
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "precondition_frequency": precondition_frequency, "block_size": block_size,
                    "max_precond_dim": max_precond_dim, "merge_dims": merge_dims,
                    "precondition_1d": precondition_1d, "grafting_beta2": grafting_beta2,
                    "grafting_eps": grafting_eps, "use_bias_correction": use_bias_correction,
                    "exponent_override": exponent_override,
                    "moment_swap": MomentSwap.REFERENCE.value,
                    "refresh_dtype": refresh_dtype}
        super().__init__(params, defaults, refresh_delay=refresh_delay)

    def _block_refresh_config(self, group: dict, layout: Layout, dim: int) -> RefreshConfig:
        root = group["exponent_override"] or 2.0 * len(layout.shape)
        return RefreshConfig(method=RefreshMethod.INVERSE_ROOT.value,
                             dtype=group["refresh_dtype"], root=root, eps=group["eps"])

    def _snapshot_scale(self, state: dict, group: dict) -> float:
        beta2 = group["betas"][1]
        if beta2 < 1.0 and group["use_bias_correction"]:
            return 1.0 / (1.0 - beta2 ** state[STEP])
        return 1.0

    def _step_param(self, p, grad, state, layout, group) -> bool:
        beta1, beta2 = group["betas"]
        graft_beta2 = group["grafting_beta2"]
        if STEP not in state:
            state[STEP] = 0
            state[EXP_AVG] = torch.zeros_like(grad)
            state[GRAFT_EXP_AVG_SQ] = torch.zeros_like(grad)
            self.factors.init(state, layout, grad)
            self.bases.init(state, layout, grad)
        state[STEP] += 1
        step = state[STEP]
        exp_avg, exp_avg_sq = state[EXP_AVG], state[GRAFT_EXP_AVG_SQ]

        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(graft_beta2).addcmul_(grad, grad, value=1 - graft_beta2)
        bias_correction1, bias_correction2 = 1.0, 1.0
        if group["use_bias_correction"]:
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - graft_beta2**step
        step_size = group["lr"] / bias_correction1
        denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(group["grafting_eps"])

        p.mul_(1 - group["lr"] * group["weight_decay"])
        has_roots = layout.preconditioned and all(
            v > 0 for versions in state[VERSIONS] if versions is not None for v in versions)
        if has_roots:
            adam_dir = exp_avg / denom
            shampoo_dir = exp_avg
            for dim, roots in enumerate(state[BASES]):
                if roots is not None:
                    shampoo_dir = map_dim(shampoo_dir, dim, roots, transpose=False)
            shampoo_norm = torch.linalg.vector_norm(shampoo_dir)
            ratio = torch.where(shampoo_norm > 0, torch.linalg.vector_norm(adam_dir)
                                / shampoo_norm, torch.zeros_like(shampoo_norm))
            p.add_((shampoo_dir * ratio).reshape(p.shape), alpha=-step_size)
        else:
            p.addcdiv_(exp_avg.reshape(p.shape), denom.reshape(p.shape), value=-step_size)

        for dim, sizes in enumerate(layout.chunks):
            if sizes is not None and self.factors.keeps(dim):  # else another rank keeps them
                factors = state[FACTORS][dim]
                for c, (factor_bb, outer_bb) in enumerate(
                        zip(factors, dim_outer(grad, dim, sizes), strict=True)):
                    out = self.factors.update_target(factors, c)
                    if out is None:
                        continue
                    if beta2 == 1.0:
                        torch.add(factor_bb, outer_bb, out=out)
                    else:
                        torch.lerp(factor_bb, outer_bb, 1 - beta2, out=out)
        return step % group["precondition_frequency"] == 0
