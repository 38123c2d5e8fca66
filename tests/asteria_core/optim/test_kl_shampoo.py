"""KL-Shampoo: the reference's explicit left/right formulas, AdamW for unpreconditioned params,
eigenvalue transport at a swap."""

from __future__ import annotations

import pytest
import torch

from asteria_core.optim import KLShampoo, refresh_fn
from asteria_core.optim.kl_shampoo import EIG_INV_SQRT
from tests.asteria_core.optim.problems import (
    clone_model,
    mlp_batches,
    mlp_step,
    run_grads,
    structured_grads,
    tiny_mlp,
)
from tests.asteria_core.optim.reference_steps import ReferenceKLShampoo


@pytest.mark.parametrize("shape", [(5, 3), (4, 7), (4, 6, 8), (3, 5, 2)])
def test_matches_the_reference_formulas(shape):
    # 3-D: the reference's order, where some updates read eigenvalues updated earlier in the
    # step; 40 steps so that a difference has many refreshes to grow through
    grads = structured_grads(shape, 20 if len(shape) == 2 else 40, seed=11)
    p0 = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    p = p0.clone().requires_grad_(True)
    ours = KLShampoo([p], lr=0.01, precondition_frequency=3, refresh_dtype="float64")
    trajectory = run_grads(ours, p, grads)
    ref = ReferenceKLShampoo(p0.clone(), lr=0.01, betas=(0.9, 0.98), eps=1e-8,
                             weight_decay=0.01, freq=3)
    for grad, ours_after in zip(grads, trajectory, strict=True):
        ref.step(grad)
        torch.testing.assert_close(ours_after, ref.p, rtol=1e-9, atol=1e-12)
    for e_ours, e_ref in zip(ours.state[p][EIG_INV_SQRT], ref.e, strict=True):
        torch.testing.assert_close(e_ours[0], e_ref, rtol=1e-9, atol=1e-12)


def test_clamping_caps_the_inverse_root_eigenvalues():
    # tiny gradients make lambda tiny, so lambda^(-1/2) hits the clamp max(10, min(b, 4000)) = 10
    grads = [g * 1e-6 for g in structured_grads((5, 3), 6, seed=13)]
    p = torch.zeros(5, 3, dtype=torch.float64, requires_grad=True)
    opt = KLShampoo([p], shampoo_beta=0.5)
    run_grads(opt, p, grads)
    for e_d in opt.state[p][EIG_INV_SQRT]:
        assert e_d[0].max().item() == 10.0


def test_parameters_without_factors_take_adamw_steps():
    model = tiny_mlp()
    twin = clone_model(model)
    kw = {"lr": 1e-3, "betas": (0.9, 0.98), "eps": 1e-8, "weight_decay": 0.01}
    kl = KLShampoo(model.parameters(), **kw, max_precond_dim=0)
    adamw = torch.optim.AdamW(twin.parameters(), **kw, foreach=False)
    for batch in mlp_batches(10):
        mlp_step(model, kl, batch)
        mlp_step(twin, adamw, batch)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_transport_moves_eigenvalues_with_the_basis():
    grads = structured_grads((6, 4), 8, seed=14)
    p = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = KLShampoo([p], refresh="eigh", moment_swap="transport", refresh_dtype="float64",
                    precondition_frequency=1000)
    run_grads(opt, p, grads)
    key = opt.refresh_blocks()[0].key
    e_before = opt.state[p][EIG_INV_SQRT][0][0].clone()
    result = refresh_fn(opt.snapshot(key), opt.refresh_config(key))
    opt.apply_refresh(key, result)
    lam_before, lam_after = e_before**-2, opt.state[p][EIG_INV_SQRT][0][0] ** -2
    torch.testing.assert_close(lam_after, lam_before @ result.transport)
    torch.testing.assert_close(lam_after.sum(), lam_before.sum())
