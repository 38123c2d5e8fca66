"""SOAP (Vyas et al., arXiv 2409.11321): Adam in the eigenbasis of Shampoo's factors.

Faithful to the reference implementation (nikhilvyas/SOAP, soap.py): same arguments, defaults,
step order and refresh rule. Per parameter with gradient G (work shape; for a matrix G_mn):

    first call:  L_mm, R_nn <- lerp(0, G G^T / G^T G, 1 - shampoo_beta); Q <- eigh; no update
    later calls: G' = Q_mm^T G Q_nn
                 m <- b1 m + (1 - b1) G',  v <- b2 v + (1 - b2) G'^2   (both in the eigenbasis)
                 U  = Q_mm (m / (sqrt(v) + eps)) Q_nn^T
                 p <- p - lr * sqrt(1 - b2^t) / (1 - b1^t) * U;  p <- p - lr * wd * p
                 L, R <- lerp(L/R, G G^T / G^T G, 1 - shampoo_beta)      (after the update)
                 every precondition_frequency steps: refresh Q at the step boundary

The reference stores m in the eigenbasis and round-trips it through the original basis at every
step (Q_new^T (Q_old m Q_old^T) Q_new, Q_new = Q_old between refreshes). We keep m in the
eigenbasis and do that rotation only at a swap, along the swapped block (`_apply_refresh`): the
same numbers up to rounding, and a step needs three pairs of products (G', U, the factors), not
the four of a first moment kept in the original basis (projected every step) or the reference's
five. A swap costs one rotation of m along the block's chunk; the b^3 product Q_old^T Q_new it
needs comes with the refresh (`RefreshConfig.rotate`), computed where the refresh ran.

Ours on top: `block_size` (block-diagonal factors, see layout.py), `refresh` (power_qr: the
reference's sorted power iteration + QR, seeded by eigh at the first refresh; eigh: exact
eigendecomposition every refresh), `moment_swap` (what happens to v at a swap), `refresh_dtype`
and `refresh_delay` (see base.py).

moment_swap default: "reference". It is the reference's own rule (on the power_qr path v is
re-indexed by the same sort as the basis columns), so SOAP() with no extra arguments is the
published algorithm and the synchronous baseline every Asteria speed-up is measured against.
"transport" (HeavyBall) maps v with P = (Q_old^T Q_new)^2, the exact diagonal of the old second
moment seen in the new basis: prefer it with refresh="eigh" (eigh re-orders and re-signs columns
freely, so index-aligned v can land on the wrong eigenvector) and for long swap delays.
"""

from __future__ import annotations

import math

import torch

from asteria_core.optim.base import BlockPreconditioner, check_choice, check_range
from asteria_core.optim.layout import Layout, dim_outer, from_basis, map_dim_by, to_basis
from asteria_core.optim.matrix_functions import pack_symmetric
from asteria_core.optim.residency import owns
from asteria_core.optim.seam import BASIS_REFRESHES, BlockKey, RefreshConfig, RefreshResult
from asteria_core.optim.state_keys import BASES, FACTORS, STEP, VERSIONS

EXP_AVG_SQ = "exp_avg_sq"  # second moment, eigenbasis coordinates, work shape
# First moment, eigenbasis coordinates, work shape. Not state_keys.EXP_AVG (original basis, as
# Shampoo and KL-Shampoo keep it): a checkpoint from before the change fails loudly instead of
# loading original-basis values as eigenbasis ones.
EXP_AVG_E = "exp_avg_eigen"


class SOAP(BlockPreconditioner):
    """SOAP as a torch.optim.Optimizer with the reference's arguments and defaults.

    Args:
        lr, betas, eps, weight_decay, correct_bias: Adam in the eigenbasis (Default: 3e-3,
            (0.95, 0.95), 1e-8, 0.01, True). Weight decay is decoupled and applied after the
            update, as in the reference.
        shampoo_beta: factor EMA decay; < 0 means betas[1] (Default: -1).
        precondition_frequency: steps between basis refreshes (Default: 10).
        max_precond_dim: dims larger than this are not rotated (identity), so vocab-sized dims
            of embeddings and heads get one-sided SOAP (Default: 10000).
        merge_dims: merge adjacent dims while their product fits max_precond_dim (Default: False).
        precondition_1d: give 1-D parameters a factor too; else plain Adam (Default: False).
        normalize_grads: RMS-normalise each parameter's update (Default: False).
        block_size: largest factor side; longer dims get block-diagonal factors. None: no
            blocking, the reference (Default: None).
        refresh: power_qr | eigh (Default: power_qr, the reference).
        moment_swap: reference | transport (Default: reference; see the module docstring).
        refresh_dtype: float32 | float64 compute dtype of refreshes (Default: float32, the
            reference; float64 costs the same on CPU).
        refresh_delay: swap a refresh computed at step t in at t + d (Default: 0, the reference).
        pack_factors: keep each factor block's upper triangle only, b (b + 1) / 2 values (as
            Distributed Shampoo does by default): about half the factor memory, the same
            numbers up to rounding (the refresh opens it into the symmetric matrix, on the
            worker). (Default: False, the reference.)
    """

    def __init__(self, params, lr: float = 3e-3, betas: tuple[float, float] = (0.95, 0.95),
                 shampoo_beta: float = -1, eps: float = 1e-8, weight_decay: float = 0.01,
                 precondition_frequency: int = 10, max_precond_dim: int = 10000,
                 merge_dims: bool = False, precondition_1d: bool = False,
                 normalize_grads: bool = False, correct_bias: bool = True,
                 block_size: int | None = None, refresh: str = "power_qr",
                 moment_swap: str = "reference", refresh_dtype: str = "float32",
                 refresh_delay: int = 0, pack_factors: bool = False) -> None:
        for i, beta in enumerate(betas):
            check_range(f"betas[{i}]", beta, 0.0, 1.0)
        if shampoo_beta >= 0:
            check_range("shampoo_beta", shampoo_beta, 0.0, 1.0)
        check_range("eps", eps, 0.0, float("inf"))
        check_choice("refresh", refresh, BASIS_REFRESHES)
        defaults = {"lr": lr, "betas": tuple(betas), "shampoo_beta": shampoo_beta, "eps": eps,
                    "weight_decay": weight_decay,
                    "precondition_frequency": precondition_frequency,
                    "max_precond_dim": max_precond_dim, "merge_dims": merge_dims,
                    "precondition_1d": precondition_1d, "normalize_grads": normalize_grads,
                    "correct_bias": correct_bias, "block_size": block_size, "refresh": refresh,
                    "moment_swap": moment_swap, "refresh_dtype": refresh_dtype,
                    "pack_factors": pack_factors}
        super().__init__(params, defaults, refresh_delay=refresh_delay)

    def _block_refresh_config(self, group: dict, layout: Layout, dim: int) -> RefreshConfig:
        return RefreshConfig(method=group["refresh"], moment_swap=group["moment_swap"],
                             sort=True, dtype=group["refresh_dtype"], rotate=True)

    def _step_param(self, p, grad, state, layout, group) -> bool:
        beta1, beta2 = group["betas"]
        shampoo_beta = group["shampoo_beta"] if group["shampoo_beta"] >= 0 else beta2
        if STEP not in state:
            state[STEP] = 0
            state[EXP_AVG_E] = torch.zeros_like(grad)
            state[EXP_AVG_SQ] = torch.zeros_like(grad)
            self.factors.init(state, layout, grad, packed=group.get("pack_factors", False))
            self.bases.init(state, layout, grad)
            self._update_factors(grad, state[FACTORS], layout, shampoo_beta)
            # The reference's first call only builds statistics and the first basis, so the
            # current gradient never enters its own projection.
            return True
        state[STEP] += 1
        step = state[STEP]
        exp_avg_e, exp_avg_sq, bases = state[EXP_AVG_E], state[EXP_AVG_SQ], state[BASES]

        grad_e = to_basis(grad, bases)  # G' = Q_mm^T G Q_nn
        exp_avg_e.mul_(beta1).add_(grad_e, alpha=1.0 - beta1)
        exp_avg_sq.mul_(beta2).add_(grad_e.square(), alpha=1.0 - beta2)
        denom = exp_avg_sq.sqrt().add_(group["eps"])

        step_size = group["lr"]
        if group["correct_bias"]:
            step_size = step_size * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
        update = from_basis(exp_avg_e / denom, bases)
        if group["normalize_grads"]:
            update = update / (1e-30 + torch.mean(update**2) ** 0.5)
        p.add_(update.reshape(p.shape), alpha=-step_size)
        if group["weight_decay"] > 0.0:
            p.add_(p, alpha=-group["lr"] * group["weight_decay"])

        self._update_factors(grad, state[FACTORS], layout, shampoo_beta)
        return step % group["precondition_frequency"] == 0

    def _update_factors(self, grad: torch.Tensor, factors, layout: Layout, beta: float) -> None:
        """F <- lerp(F, contraction of G over all other dims, 1 - beta), per block."""
        for dim, sizes in enumerate(layout.chunks):
            if sizes is not None and self.factors.keeps(dim):  # else another rank keeps them
                for c, (factor_bb, outer_bb) in enumerate(
                        zip(factors[dim], dim_outer(grad, dim, sizes), strict=True)):
                    out = self.factors.update_target(factors[dim], c)
                    if out is not None:
                        if factor_bb.dim() == 1:  # packed: its upper triangle
                            outer_bb = pack_symmetric(outer_bb)
                        torch.lerp(factor_bb, outer_bb, 1 - beta, out=out)

    def _swap_moments(self, state: dict, layout: Layout, key: BlockKey, perm_b, p_bb) -> None:
        self.bases.swap_along_dim(state, EXP_AVG_SQ, layout, key, perm_b, p_bb)

    def _apply_refresh(self, key: BlockKey, result: RefreshResult, state: dict,
                       layout: Layout) -> None:
        """The swap, then the first moment's rotation along the block's chunk: new coordinate
        j is <q_new_j, sum_i m_i q_old_i>, i.e. m <- m (Q_old^T Q_new) along that dim (exact
        for any pair of bases, so a late or stale result rotates correctly too). Q_old^T Q_new
        comes with the result (computed where the refresh ran) while the snapshot's basis is
        still the one in use; after another swap it is computed here."""
        old_bb = state[BASES][key.dim][key.chunk]
        rotation_bb = result.rotation
        if result.base_version != state[VERSIONS][key.dim][key.chunk]:
            rotation_bb = None
        if rotation_bb is None and not owns(self.residency, key.param):
            old_bb = old_bb.clone()  # a runtime buffer: the swap overwrites it in place
        super()._apply_refresh(key, result, state, layout)
        new_bb = state[BASES][key.dim][key.chunk]
        if rotation_bb is None:
            rotation_bb = old_bb.T @ new_bb
        else:
            rotation_bb = rotation_bb.to(new_bb.device, new_bb.dtype, non_blocking=True)
        self.bases.swap_chunk(state, EXP_AVG_E, layout, key,
                              lambda x: map_dim_by(x, key.dim, rotation_bb))
