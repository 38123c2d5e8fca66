"""KL-Shampoo (Lin et al., arXiv 2509.03378): Shampoo's factors fitted by KL minimisation.

Faithful to the reference prototype (yorkerlin/KL-Methods, optim/kl_opt.py, KL-Shampoo mode).
Per parameter with gradient G (work shape; for a matrix G_mn), bases Q_mm, Q_nn and per-factor
eigenvalue estimates stored as e = lambda^(-1/2):

    first call:  S_mm = (1 - beta) G G^T / n,  S_nn = (1 - beta) G^T G / m;  Q <- eigh(S);
                 e <- init_factor^(-1/2); no update
    later calls: m <- lerp(m, G, 1 - b1)                                  (original basis)
                 U = Q_mm ((Q_mm^T m Q_nn) / (sqrt(lambda_m lambda_n^T) + eps)) Q_nn^T
                 S_mm <- beta S_mm + (1 - beta) / n * G Q_nn diag(lambda_n^-1) Q_nn^T G^T
                 S_nn <- beta S_nn + (1 - beta) / m * G^T Q_mm diag(lambda_m^-1) Q_mm^T G
                 lambda_m <- lerp(lambda_m, mean_cols((Q_mm^T G Q_nn * e_n^T)^2), 1 - beta),
                 lambda_n likewise; e <- clamp(lambda^(-1/2), max = max(10, min(b, 4000)))
                 p <- p - lr * U;  p <- p - lr * wd * p
                 every precondition_frequency steps: Q <- QR(S Q) (no sort) at the boundary

Factor and eigenvalue updates use the basis and e in use (stale by design), so staleness of the
basis feeds back into the statistics; that is the reference's behaviour and the runtime's concern.
"e in use" is the reference's, update by update: a matrix reads start-of-step e throughout; a
3-D tensor follows the reference's 3-D order, where some updates read an e already updated in
the same step (`_statistics_order`).
Tensors of any order are handled (the reference does 2-D and 3-D); skipped dims act as identity
factors with lambda = 1. Parameters with no preconditioned dim (1-D, unless precondition_1d) take
AdamW steps with the group's lr, betas and eps, as the reference's training scripts give them to
AdamW. Deviations: computation in the parameter dtype (the reference casts to bfloat16), and the
reference's optional trace damping (`using_damping`, off by default) is not implemented.
"""

from __future__ import annotations

import math

import torch

from asteria_core.optim.base import BlockPreconditioner, check_choice, check_range
from asteria_core.optim.layout import Layout, dim_broadcast, dim_outer, from_basis, to_basis
from asteria_core.optim.seam import BASIS_REFRESHES, BlockKey, RefreshConfig
from asteria_core.optim.state_keys import BASES, EXP_AVG, FACTORS, STEP

EIG_INV_SQRT = "eig_inv_sqrt"  # [dim][chunk] (b,) e = lambda^(-1/2)
EXP_AVG_SQ = "exp_avg_sq"      # AdamW second moment of parameters with no preconditioned dim


def _scale_except(x: torch.Tensor, eig: list, skip: int | None) -> torch.Tensor:
    """x * e_j broadcast along every preconditioned dim j != skip."""
    for dim, e_d in enumerate(eig):
        if e_d is not None and dim != skip:
            x = x * dim_broadcast(e_d, dim, len(eig))
    return x


def kl_eig_inv_sqrt(lam_b: torch.Tensor, clamp: float | None) -> torch.Tensor:
    """lambda -> lambda^(-1/2) with the reference's rules: inf/NaN -> 0, optional upper clamp."""
    e_b = (1.0 / torch.sqrt(lam_b)).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return e_b if clamp is None else torch.clamp(e_b, max=clamp)


class KLShampoo(BlockPreconditioner):
    """KL-Shampoo as a torch.optim.Optimizer with the reference's arguments and defaults.

    Args:
        lr, betas, eps, weight_decay: (Default: 1e-4, (0.9, 0.98), 1e-8, 0.01, the reference's);
            eps damps the preconditioner, 1 / (sqrt(lambda_a lambda_b) + eps).
        shampoo_beta: factor and eigenvalue EMA decay; < 0 means betas[1] (Default: -1).
        precondition_frequency: steps between basis refreshes (Default: 10).
        normalize_grads: RMS-normalise each parameter's update (Default: False).
        init_factor: initial eigenvalue estimate (Default: 0.1).
        using_clamping, max_clamp_value: clamp lambda^(-1/2) at max(10, min(b, max_clamp_value))
            (Default: True, 4000).
        max_precond_dim, merge_dims, precondition_1d, block_size: layout, as SOAP (Default:
            10000, False, False, None).
        refresh: power_qr (the reference) | eigh (Default: power_qr).
        moment_swap: reference (keep lambda index-aligned) | transport (lambda <- P^T lambda)
            (Default: reference).
        refresh_dtype: float32 | float64 (Default: float32, the reference's).
        refresh_delay: swap a refresh computed at step t in at t + d (Default: 0).
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.98),
                 shampoo_beta: float = -1, eps: float = 1e-8, weight_decay: float = 0.01,
                 precondition_frequency: int = 10, normalize_grads: bool = False,
                 init_factor: float = 0.1, using_clamping: bool = True,
                 max_clamp_value: int = 4000, max_precond_dim: int = 10000,
                 merge_dims: bool = False, precondition_1d: bool = False,
                 block_size: int | None = None, refresh: str = "power_qr",
                 moment_swap: str = "reference", refresh_dtype: str = "float32",
                 refresh_delay: int = 0) -> None:
        for i, beta in enumerate(betas):
            check_range(f"betas[{i}]", beta, 0.0, 1.0)
        if shampoo_beta >= 0:
            check_range("shampoo_beta", shampoo_beta, 0.0, 1.0)
        check_range("eps", eps, 0.0, float("inf"))
        if not init_factor > 0:
            raise ValueError(f"init_factor: got {init_factor!r}; allowed: a number > 0")
        check_choice("refresh", refresh, BASIS_REFRESHES)
        defaults = {"lr": lr, "betas": tuple(betas), "shampoo_beta": shampoo_beta, "eps": eps,
                    "weight_decay": weight_decay,
                    "precondition_frequency": precondition_frequency,
                    "normalize_grads": normalize_grads, "init_factor": init_factor,
                    "using_clamping": using_clamping, "max_clamp_value": max_clamp_value,
                    "max_precond_dim": max_precond_dim, "merge_dims": merge_dims,
                    "precondition_1d": precondition_1d, "block_size": block_size,
                    "refresh": refresh, "moment_swap": moment_swap,
                    "refresh_dtype": refresh_dtype}
        super().__init__(params, defaults, refresh_delay=refresh_delay)

    def _block_refresh_config(self, group: dict, layout: Layout, dim: int) -> RefreshConfig:
        return RefreshConfig(method=group["refresh"], moment_swap=group["moment_swap"],
                             sort=False, dtype=group["refresh_dtype"])

    def _step_param(self, p, grad, state, layout, group) -> bool:
        if not layout.preconditioned:
            _adamw_step(p, grad, state, group)
            return False
        beta = group["shampoo_beta"] if group["shampoo_beta"] >= 0 else group["betas"][1]
        if STEP not in state:
            state[STEP] = 0
            state[EXP_AVG] = torch.zeros_like(grad)
            self.factors.init(state, layout, grad)
            self.bases.init(state, layout, grad)
            kw = {"dtype": grad.dtype, "device": grad.device}
            state[EIG_INV_SQRT] = [None if sizes is None else
                                   [kl_eig_inv_sqrt(torch.full((b,), group["init_factor"], **kw),
                                                    None) for b in sizes]
                                   for sizes in layout.chunks]
            for dim, sizes in enumerate(layout.chunks):
                if sizes is not None and self.factors.keeps(dim):  # else another rank keeps them
                    self._add_factor(state, layout, dim, dim_outer(grad, dim, sizes), beta)
            return True
        state[STEP] += 1
        bases, eig = state[BASES], self._eig(state)

        exp_avg = state[EXP_AVG]
        exp_avg.lerp_(grad, 1.0 - group["betas"][0])
        scale = _scale_except(torch.ones((), dtype=grad.dtype, device=grad.device), eig, None)
        scale = scale / (1.0 + scale * group["eps"])  # 1 / (sqrt(lambda_a lambda_b) + eps)
        update = from_basis(to_basis(exp_avg, bases) * scale, bases)
        self._update_statistics(grad, state, layout, group, beta)

        if group["normalize_grads"]:
            update = update / (1e-30 + torch.mean(update**2) ** 0.5)
        p.add_(update.reshape(p.shape), alpha=-group["lr"])
        if group["weight_decay"] > 0.0:
            p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return state[STEP] % group["precondition_frequency"] == 0

    def _update_statistics(self, grad, state, layout, group, beta) -> None:
        """KL factor updates and eigenvalue EMAs from the basis in use (stale), in the
        reference's order (`_statistics_order`): most read e at the start of the step, but in a
        3-D tensor some read an e updated earlier in the same step, as the reference does."""
        bases, start = state[BASES], self._eig(state)
        now = list(start)  # e per dim as the step goes; state is written at the end
        new_chunks: dict[int, list[torch.Tensor]] = {}
        grad_e = None
        for kind, dim, reads_now in _statistics_order(grad.dim()):
            sizes = layout.chunks[dim]
            if sizes is None:
                continue
            eig = [now[d] if d in reads_now else start[d] for d in range(grad.dim())]
            if kind == "factor":
                if self.factors.keeps(dim):  # else another rank keeps these factors
                    half = _scale_except(to_basis(grad, bases, skip=dim), eig, dim)  # G Q e_n
                    self._add_factor(state, layout, dim, dim_outer(half, dim, sizes), beta)
                continue
            if grad_e is None:
                grad_e = to_basis(grad, bases)  # Q_mm^T G Q_nn
            other = [d for d in range(grad.dim()) if d != dim]
            diag_d = torch.mean(_scale_except(grad_e, eig, dim) ** 2, dim=other)
            chunks = new_chunks[dim] = []
            for c, diag_b in enumerate(torch.split(diag_d, list(sizes))):
                lam_b = (1.0 / state[EIG_INV_SQRT][dim][c] ** 2).nan_to_num_(
                    nan=0.0, posinf=0.0, neginf=0.0)
                lam_b.lerp_(diag_b, 1.0 - beta)
                chunks.append(kl_eig_inv_sqrt(lam_b, _clamp(group, sizes[c])))
            now[dim] = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        for dim, chunks in new_chunks.items():  # in place: a tier store's buffers stay put
            for c, e_b in enumerate(chunks):
                state[EIG_INV_SQRT][dim][c].copy_(e_b)

    def _add_factor(self, state, layout: Layout, dim: int, outers: list, beta: float) -> None:
        # S <- beta S + (1 - beta) / (numel / d_dim) * outer   (the reference's update_S)
        alpha = (1.0 - beta) / (layout.numel / layout.shape[dim])
        factors = state[FACTORS][dim]
        for c, (factor_bb, outer_bb) in enumerate(zip(factors, outers, strict=True)):
            out = self.factors.update_target(factors, c)
            if out is not None:
                torch.mul(factor_bb, beta, out=out).add_(outer_bb, alpha=alpha)

    @staticmethod
    def _eig(state) -> list:
        return [None if chunks is None else (chunks[0] if len(chunks) == 1 else torch.cat(chunks))
                for chunks in state[EIG_INV_SQRT]]

    def _swap_moments(self, state: dict, layout: Layout, key: BlockKey, perm_b, p_bb) -> None:
        if perm_b is None and p_bb is None:
            return
        e_b = state[EIG_INV_SQRT][key.dim][key.chunk]
        lam_b = (1.0 / e_b**2).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        if p_bb is not None:
            lam_b = lam_b @ p_bb
        else:
            lam_b = lam_b[perm_b.to(lam_b.device, non_blocking=True)]
        group = self.blocks.locate(key)[1]
        e_b.copy_(kl_eig_inv_sqrt(lam_b, _clamp(group, e_b.shape[0])))


def _statistics_order(ndim: int) -> tuple[tuple[str, int, tuple[int, ...]], ...]:
    """(factor | eig, dim, dims whose e is read as already updated in this step), in order.

    The reference's 2-D update reads only start-of-step e. Its 3-D update (dims 0, 1, 2; its
    1, 2, 3) works from G mapped by Q_0 diag(e_0): S_2, S_1, then e_2, then e_1 reading the new
    e_2; then from G mapped by Q_2 diag(e_2) as it was at the start: S_0 and e_0, both reading
    the new e_1. The reference has no other orders; they read start-of-step e throughout.
    """
    if ndim == 3:
        return (("factor", 2, ()), ("factor", 1, ()), ("eig", 2, ()), ("eig", 1, (2,)),
                ("factor", 0, (1,)), ("eig", 0, (1,)))
    return (tuple(("factor", d, ()) for d in range(ndim))
            + tuple(("eig", d, ()) for d in range(ndim)))


def _clamp(group: dict, size: int) -> float | None:
    if not group["using_clamping"]:
        return None
    return float(max(10, min(size, group["max_clamp_value"])))


def _adamw_step(p, grad, state, group) -> None:
    """torch.optim.AdamW's arithmetic, for parameters with no preconditioned dim."""
    beta1, beta2 = group["betas"]
    if STEP not in state:
        state[STEP] = 0
        state[EXP_AVG] = torch.zeros_like(grad)
        state[EXP_AVG_SQ] = torch.zeros_like(grad)
    state[STEP] += 1
    step = state[STEP]
    p.mul_(1 - group["lr"] * group["weight_decay"])
    state[EXP_AVG].lerp_(grad, 1 - beta1)
    state[EXP_AVG_SQ].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (state[EXP_AVG_SQ].sqrt() / math.sqrt(1 - beta2**step)).add_(group["eps"])
    p.addcdiv_(state[EXP_AVG].reshape(p.shape), denom.reshape(p.shape),
               value=-group["lr"] / (1 - beta1**step))
