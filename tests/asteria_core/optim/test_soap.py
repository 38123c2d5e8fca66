"""SOAP: equivalence with AdamW at an identity basis, with the reference's formulation, blocking,
rotation equivariance, moment handling at a swap."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from asteria_core.optim import SOAP
from asteria_core.optim.base import BASES, FACTORS, VERSIONS
from tests.asteria_core.optim.problems import (
    Regression,
    clone_model,
    mlp_batches,
    mlp_step,
    run_grads,
    structured_grads,
    tiny_mlp,
)
from tests.asteria_core.optim.reference_steps import ReferenceSOAP


@pytest.mark.parametrize("weight_decay,eps,decay_after,atol", [
    (0.0, 1e-8, False, 1e-6),    # torch.optim.AdamW as is (measured max gap: 5.7e-7)
    (0.01, 1e-8, False, 1e-6),   # ... with weight decay (7.7e-7)
    (0.01, 1e-12, True, 2e-7),   # eps out of the way, decay after the update as the reference
])                               # does: only float32 rounding is left (3e-8)
@pytest.mark.parametrize("frozen", ["external_refresh", "no_factors"])
def test_identity_basis_is_adamw_for_50_steps(frozen, weight_decay, eps, decay_after, atol):
    model_soap = tiny_mlp()
    model_adamw = clone_model(model_soap)
    kw = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": eps}
    soap = SOAP(model_soap.parameters(), **kw, weight_decay=weight_decay,
                **({"max_precond_dim": 0} if frozen == "no_factors" else {}))
    soap.external_refresh = frozen == "external_refresh"  # no refresh ever: bases stay I
    adamw = torch.optim.AdamW(model_adamw.parameters(), **kw,
                              weight_decay=0.0 if decay_after else weight_decay)
    batches = mlp_batches(51)

    # SOAP's first call only gathers statistics (the reference skips that update).
    before = [p.detach().clone() for p in model_soap.parameters()]
    mlp_step(model_soap, soap, batches[0])
    assert all(torch.equal(a, b) for a, b in zip(before, model_soap.parameters(), strict=True))
    for batch in batches[:50]:
        mlp_step(model_soap, soap, batch)
        mlp_step(model_adamw, adamw, batch)
        if decay_after:
            with torch.no_grad():
                for p in model_adamw.parameters():
                    p.add_(p, alpha=-kw["lr"] * weight_decay)
    # With torch's AdamW as is, what is left is the reference's eps outside the bias correction
    # and its weight decay: after the update, as p - lr wd p (AdamW multiplies by 1 - lr wd,
    # a factor float32 rounds by up to 6e-8 at every step).
    for a, b in zip(model_soap.parameters(), model_adamw.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    if frozen == "external_refresh":
        weight_state = soap.state[model_soap[0].weight]
        assert weight_state[VERSIONS] == [[0], [0]]
        assert torch.equal(weight_state[BASES][0][0], torch.eye(12))
        assert weight_state[FACTORS][0][0].abs().sum() > 0  # statistics still accumulate


@pytest.mark.parametrize("shape,max_precond_dim", [((5, 3), 10000), ((6, 10), 10000),
                                                   ((4, 12), 8)])
def test_matches_the_reference_formulation(shape, max_precond_dim):
    """Eigenbasis-stored first moment with round trips and permuted second moment (reference)
    == our original-basis first moment, through several power-QR refreshes."""
    grads = structured_grads(shape, 22, seed=3)
    p0 = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ours_p = p0.clone().requires_grad_(True)
    ours = SOAP([ours_p], lr=0.01, weight_decay=0.01, precondition_frequency=3,
                refresh_dtype="float64", max_precond_dim=max_precond_dim)
    trajectory = run_grads(ours, ours_p, grads)
    right = max_precond_dim >= shape[1]
    assert (ours.state[ours_p][BASES][1] is None) == (not right)
    ref = ReferenceSOAP(p0.clone(), lr=0.01, betas=(0.95, 0.95), eps=1e-8, weight_decay=0.01,
                        freq=3, right=right)
    for grad, ours_after in zip(grads, trajectory, strict=True):
        ref.step(grad)
        torch.testing.assert_close(ours_after, ref.p, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("block_size", [None, 4])
def test_packed_factors_train_the_reference_numbers_in_about_half_the_memory(block_size):
    """pack_factors keeps each factor block's upper triangle, b (b + 1) / 2 values; the
    refresh opens it into the symmetric matrix, so the run is the reference's (to rounding),
    and a checkpoint of it resumes."""
    grads = structured_grads((6, 10), 22, seed=3)
    p0 = torch.randn(6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    runs, opts = [], []
    for pack in (False, True):
        p = p0.clone().requires_grad_(True)
        opt = SOAP([p], lr=0.01, precondition_frequency=3, refresh_dtype="float64",
                   block_size=block_size, pack_factors=pack)
        runs.append(run_grads(opt, p, grads))
        opts.append((opt, p))
    for full, packed in zip(*runs, strict=True):
        torch.testing.assert_close(packed, full, rtol=1e-9, atol=1e-12)
    (full_opt, full_p), (packed_opt, packed_p) = opts
    for dim_full, dim_packed in zip(full_opt.state[full_p][FACTORS],
                                    packed_opt.state[packed_p][FACTORS], strict=True):
        for f_bb, f_p in zip(dim_full, dim_packed, strict=True):
            b = f_bb.shape[0]
            assert f_p.shape == (b * (b + 1) // 2,)
            assert torch.equal(f_p, f_bb[tuple(torch.triu_indices(b, b))])
    resumed_p = packed_p.detach().clone().requires_grad_(True)
    resumed = SOAP([resumed_p], lr=0.01, precondition_frequency=3, refresh_dtype="float64",
                   block_size=block_size, pack_factors=True)
    resumed.load_state_dict(copy.deepcopy(packed_opt.state_dict()))  # as if from a file
    more = structured_grads((6, 10), 7, seed=9)
    torch.testing.assert_close(run_grads(resumed, resumed_p, more)[-1],
                               run_grads(packed_opt, packed_p, more)[-1], rtol=0, atol=0)


@pytest.mark.parametrize("block_size", [32, 1000])
def test_whole_dim_block_is_exactly_the_unblocked_result(block_size):
    grads = structured_grads((16, 32), 25, seed=5, dtype=torch.float32)
    runs = []
    for size in (None, block_size):
        p = torch.zeros(16, 32, requires_grad=True)
        runs.append(run_grads(SOAP([p], precondition_frequency=5, block_size=size), p, grads))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_blocked_factors_are_the_diagonal_blocks_of_the_full_factor():
    grads = structured_grads((12, 20), 4, seed=6)
    full_p = torch.zeros(12, 20, dtype=torch.float64, requires_grad=True)
    blocked_p = torch.zeros(12, 20, dtype=torch.float64, requires_grad=True)
    full, blocked = SOAP([full_p]), SOAP([blocked_p], block_size=8)
    run_grads(full, full_p, grads)
    run_grads(blocked, blocked_p, grads)
    r_full = full.state[full_p][FACTORS][1][0]
    r_blocks = blocked.state[blocked_p][FACTORS][1]
    assert [b.shape[0] for b in r_blocks] == [8, 8, 4]
    for block, lo in zip(r_blocks, (0, 8, 16), strict=True):
        hi = lo + block.shape[0]
        torch.testing.assert_close(block, r_full[lo:hi, lo:hi])
    assert [k.chunk for k in blocked.due_blocks()] == []  # step 3 is not a refresh step
    assert len(blocked.refresh_blocks()) == 2 + 3  # rows 12 -> (8, 4), cols 20 -> (8, 8, 4)


def test_smaller_blocks_still_converge():
    problem = Regression()
    steps, _ = problem.train(lambda params: SOAP(params, lr=0.05, weight_decay=0.0,
                                                 block_size=8), 1500, tol=1e-4)
    assert steps is not None and steps < 1500


def test_rotating_the_problem_rotates_the_trajectory():
    """Rotate inputs by R_in and outputs by R_out: SOAP's weights rotate (W' = R_out W R_in^T),
    AdamW's do not. Square weights, so both factors are full rank from the first step (a rank-
    deficient factor's null-space basis is arbitrary and would break equivariance)."""
    g = torch.Generator().manual_seed(7)
    r_in, _ = torch.linalg.qr(torch.randn(24, 24, generator=g, dtype=torch.float64))
    r_out, _ = torch.linalg.qr(torch.randn(24, 24, generator=g, dtype=torch.float64))
    plain = Regression(d_out=24, d_in=24, cond=1e2)
    rotated = Regression(d_out=24, d_in=24, cond=1e2, rotation=r_in, out_rotation=r_out)

    def soap(params):
        return SOAP(params, lr=0.02, weight_decay=0.0, precondition_frequency=5,
                    refresh_dtype="float64")

    def adamw(params):
        return torch.optim.AdamW(params, lr=0.02, weight_decay=0.0)

    for make, equivariant in ((soap, True), (adamw, False)):
        _, w = plain.train(make, 30, dtype=torch.float64)
        _, w_rot = rotated.train(make, 30, dtype=torch.float64)
        gap = (rotated.to_problem_frame(w_rot) - w).abs().max().item()
        if equivariant:
            assert gap < 1e-8, gap
        else:
            assert gap > 1e-3, gap


@pytest.mark.parametrize("refresh", ["power_qr", "eigh"])
def test_transport_swap_to_the_same_basis_changes_nothing(refresh):
    from asteria_core.optim import refresh_fn

    grads = structured_grads((6, 5), 6, seed=8)
    p = torch.zeros(6, 5, dtype=torch.float64, requires_grad=True)
    opt = SOAP([p], refresh=refresh, moment_swap="transport", refresh_dtype="float64",
               precondition_frequency=100)
    run_grads(opt, p, grads)
    key = opt.refresh_blocks()[0].key
    v_before = opt.state[p]["exp_avg_sq"].clone()
    snap = opt.snapshot(key)
    result = refresh_fn(snap, opt.refresh_config(key))
    same = type(result)(key=key, stats_step=result.stats_step, base_version=snap.base_version,
                        basis=snap.basis, transport=(snap.basis.T @ snap.basis).square())
    opt.apply_refresh(key, same)
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], v_before, rtol=1e-12, atol=0)


def test_transport_keeps_mass_and_sign_of_the_second_moment():
    grads = structured_grads((6, 5), 12, seed=9)
    p = torch.zeros(6, 5, dtype=torch.float64, requires_grad=True)
    opt = SOAP([p], moment_swap="transport", refresh="eigh", refresh_dtype="float64",
               precondition_frequency=1000)
    opt.external_refresh = True
    run_grads(opt, p, grads)
    from asteria_core.optim import refresh_fn

    v_before = opt.state[p]["exp_avg_sq"].clone()
    for key in [b.key for b in opt.refresh_blocks()]:
        opt.apply_refresh(key, refresh_fn(opt.snapshot(key), opt.refresh_config(key)))
    v_after = opt.state[p]["exp_avg_sq"]
    assert (v_after >= 0).all()
    torch.testing.assert_close(v_after.sum(), v_before.sum(), rtol=1e-12, atol=0)
    assert not torch.allclose(v_after, v_before)


def test_invalid_arguments_name_the_field():
    p = [torch.zeros(2, 2, requires_grad=True)]
    for kwargs, field in (({"refresh": "svd"}, "refresh"), ({"moment_swap": "x"}, "moment_swap"),
                          ({"block_size": 0}, "block_size"), ({"refresh_delay": -1},
                                                              "refresh_delay"),
                          ({"betas": (0.9, 1.5)}, "betas[1]"),
                          ({"precondition_frequency": 0}, "precondition_frequency")):
        with pytest.raises(ValueError, match=re.escape(field)):
            SOAP(p, **kwargs)
