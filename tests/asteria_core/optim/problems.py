"""Small deterministic problems shared by the optimizer tests (CPU, milliseconds per step)."""

from __future__ import annotations

import copy
import math

import torch


def structured_grads(shape, steps: int, seed: int, dtype=torch.float64) -> list[torch.Tensor]:
    """Random gradients with anisotropic row and column covariances (factors far from I); for a
    tensor of another order, an anisotropic covariance along every dim."""
    g = torch.Generator().manual_seed(seed)
    if len(shape) != 2:
        mix = [torch.randn(d, d, generator=g, dtype=dtype) * torch.logspace(0, -k - 1, d,
                                                                             dtype=dtype)
               for k, d in enumerate(shape)]
        grads = []
        for _ in range(steps):
            x = torch.randn(*shape, generator=g, dtype=dtype)
            for k, m_dd in enumerate(mix):  # mode-k product: x <- x x_k M_k
                x = torch.movedim(torch.tensordot(m_dd, x, dims=([1], [k])), 0, k)
            grads.append(x)
        return grads
    m, n = shape
    left = torch.randn(m, m, generator=g, dtype=dtype) * torch.logspace(0, -2, m, dtype=dtype)
    right = torch.randn(n, n, generator=g, dtype=dtype) * torch.logspace(0, -1, n, dtype=dtype)
    return [left @ torch.randn(m, n, generator=g, dtype=dtype) @ right.T for _ in range(steps)]


def run_grads(opt: torch.optim.Optimizer, param: torch.Tensor, grads) -> list[torch.Tensor]:
    """Feed a fixed gradient sequence; return the parameter after every step."""
    trajectory = []
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
        trajectory.append(param.detach().clone())
    return trajectory


def tiny_mlp(seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(),
                               torch.nn.Linear(12, 3)).to(dtype)


def mlp_batches(count: int, seed: int = 1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 6, generator=g, dtype=dtype), torch.randn(16, 3, generator=g,
                                                                         dtype=dtype))
            for _ in range(count)]


def mlp_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch) -> float:
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def clone_model(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


class Regression:
    """Stochastic least squares y = W* x, x ~ N(0, Sigma), Sigma randomly rotated, cond 1e4.

    The population loss ||(W - W*) Sigma^(1/2)||_F^2 is computed exactly, so "reached 1e-4 of
    the initial loss" does not depend on a noisy estimate. Each step draws a fresh batch.
    """

    def __init__(self, d_out=16, d_in=32, cond=1e4, batch=64, seed=0, rotation=None,
                 out_rotation=None):
        g = torch.Generator().manual_seed(seed)
        u, _ = torch.linalg.qr(torch.randn(d_in, d_in, generator=g, dtype=torch.float64))
        s = torch.logspace(0, -math.log10(cond), d_in, dtype=torch.float64)
        self.sigma_half = (u * s.sqrt()) @ u.T
        self.w_star = torch.randn(d_out, d_in, generator=g, dtype=torch.float64)
        self.batch, self.d_in = batch, d_in
        self.rotation, self.out_rotation = rotation, out_rotation  # x -> R x, y -> R_out y

    def population_loss(self, w: torch.Tensor) -> float:
        d = self.to_problem_frame(w.detach().double()) - self.w_star
        return float(((d @ self.sigma_half) ** 2).sum())

    def to_problem_frame(self, w: torch.Tensor) -> torch.Tensor:
        """Map weights of the rotated problem back to the unrotated one (W = R_out^T W' R)."""
        if self.out_rotation is not None:
            w = self.out_rotation.T @ w
        if self.rotation is not None:
            w = w @ self.rotation
        return w

    def batches(self, seed: int, dtype):
        g = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(self.batch, self.d_in, generator=g, dtype=torch.float64)
            x = x @ self.sigma_half
            y = x @ self.w_star.T
            if self.rotation is not None:
                x = x @ self.rotation.T
            if self.out_rotation is not None:
                y = y @ self.out_rotation.T
            yield x.to(dtype), y.to(dtype)

    def train(self, make_opt, steps: int, *, data_seed=1, dtype=torch.float32, tol=None):
        """Train from W = 0. Returns (steps to tol * initial loss or None, final weights)."""
        w = torch.zeros(self.w_star.shape, dtype=dtype, requires_grad=True)
        opt = make_opt([w])
        initial = self.population_loss(w)
        data = self.batches(data_seed, dtype)
        for t in range(1, steps + 1):
            x, y = next(data)
            loss = 0.5 * ((x @ w.T - y) ** 2).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if tol is not None:
                current = self.population_loss(w)
                if not math.isfinite(current) or current > 100 * initial:
                    return None, w.detach()
                if current <= tol * initial:
                    return t, w.detach()
        return None, w.detach()

    def best_steps(self, make_opt_for_lr, lrs, cap: int, tol=1e-4) -> tuple[int | None, dict]:
        """Fewest steps to tol over the lr grid (None: not reached within the limit).

        Largest lr first, and each run stops at the best count found so far: a run that needs
        more steps cannot be the best, so cutting it short changes nothing but the run time.
        """
        best, per_lr = None, {}
        for lr in sorted(lrs, reverse=True):
            limit = cap if best is None else best
            steps, _ = self.train(make_opt_for_lr(lr), limit, tol=tol)
            per_lr[lr] = steps
            if steps is not None:
                best = steps if best is None else min(best, steps)
        return best, per_lr
