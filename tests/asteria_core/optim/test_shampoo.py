"""Shampoo: AdamW before the first roots, the textbook grafted formula after, root exponents."""

from __future__ import annotations

import torch

from asteria_core.optim import Shampoo
from asteria_core.optim.base import BlockKey
from tests.asteria_core.optim.problems import (
    clone_model,
    mlp_batches,
    mlp_step,
    run_grads,
    structured_grads,
    tiny_mlp,
)
from tests.asteria_core.optim.reference_steps import ReferenceShampoo


def test_before_the_first_roots_it_is_adamw_bit_for_bit():
    model = tiny_mlp()
    twin = clone_model(model)
    shampoo = Shampoo(model.parameters(), lr=1e-3, betas=(0.9, 1.0), weight_decay=0.01,
                      grafting_beta2=0.999, grafting_eps=1e-8, precondition_frequency=10**9)
    adamw = torch.optim.AdamW(twin.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                              weight_decay=0.01, foreach=False)
    for batch in mlp_batches(50):
        mlp_step(model, shampoo, batch)
        mlp_step(twin, adamw, batch)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_matches_the_grafted_inverse_root_formula():
    grads = structured_grads((5, 7), 15, seed=21)
    p0 = torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(22))
    p = p0.clone().requires_grad_(True)
    opt = Shampoo([p], lr=0.01, eps=1e-10, precondition_frequency=3)
    trajectory = run_grads(opt, p, grads)
    ref = ReferenceShampoo(p0.clone(), lr=0.01, beta1=0.9, graft_beta2=0.999, graft_eps=1e-8,
                           eps=1e-10, freq=3)
    for grad, ours_after in zip(grads, trajectory, strict=True):
        ref.step(grad)
        torch.testing.assert_close(ours_after, ref.p, rtol=1e-9, atol=1e-12)


def test_root_exponent_is_twice_the_order():
    p2 = torch.zeros(4, 3, requires_grad=True)
    p3 = torch.zeros(2, 3, 4, requires_grad=True)
    opt = Shampoo([p2, p3])
    assert opt.refresh_config(BlockKey(0, 1, 0)).root == 4.0
    assert opt.refresh_config(BlockKey(1, 2, 0)).root == 6.0
    assert Shampoo([p2], exponent_override=2).refresh_config(BlockKey(0, 0, 0)).root == 2.0


def test_ema_factors_are_bias_corrected_in_the_snapshot():
    grads = structured_grads((3, 4), 5, seed=23)
    p = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    opt = Shampoo([p], betas=(0.9, 0.95), precondition_frequency=100)
    run_grads(opt, p, grads)
    snap = opt.snapshot(BlockKey(0, 0, 0))
    assert snap.scale == 1.0 / (1.0 - 0.95**5)
    expected = torch.zeros(3, 3, dtype=torch.float64)
    for g in grads:
        expected = torch.lerp(expected, g @ g.T, 0.05)
    torch.testing.assert_close(snap.factor, expected)
