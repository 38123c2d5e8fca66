"""The refresh seam: delayed swaps, external refresh, checkpoints, failures, snapshots."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from asteria_core.optim import (
    SOAP,
    BlockKey,
    FactorSnapshot,
    KLShampoo,
    NonFiniteResult,
    RefreshResult,
    Shampoo,
    checked_refresh,
    is_finite,
    refresh_fn,
)
from asteria_core.optim.base import BASES, FACTORS
from tests.asteria_core.optim.problems import (
    clone_model,
    mlp_batches,
    mlp_step,
    run_grads,
    structured_grads,
    tiny_mlp,
)

OPTIMIZERS = {
    "soap": lambda params, **kw: SOAP(params, lr=3e-3, precondition_frequency=3, **kw),
    "soap_transport_eigh": lambda params, **kw: SOAP(params, lr=3e-3, precondition_frequency=3,
                                                     refresh="eigh", moment_swap="transport",
                                                     block_size=8, **kw),
    "shampoo": lambda params, **kw: Shampoo(params, lr=3e-3, precondition_frequency=3, **kw),
    "kl_shampoo": lambda params, **kw: KLShampoo(params, lr=3e-3, precondition_frequency=3,
                                                 moment_swap="transport", **kw),
}


def _params_equal(model_a, model_b) -> bool:
    return all(torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(),
                                                  strict=True))


@pytest.mark.parametrize("delay", [0, 1, 4])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_native_delay_equals_the_external_recipe(name, delay):
    """Native refresh_delay=d == a runtime that snapshots due blocks after step t, computes
    refresh_fn anywhere, and applies the result after step t + d (a block's first basis at
    once, as the references do): bit for bit."""
    native_model = tiny_mlp()
    external_model = clone_model(native_model)
    native = OPTIMIZERS[name](native_model.parameters(), refresh_delay=delay)
    external = OPTIMIZERS[name](external_model.parameters())
    external.external_refresh = True
    scheduled: dict[int, list[RefreshResult]] = {}
    for batch in mlp_batches(16):
        mlp_step(native_model, native, batch)
        mlp_step(external_model, external, batch)
        now = external.num_steps
        for result in scheduled.pop(now, []):          # swaps whose step has come
            external.apply_refresh(result.key, result)
        for key in external.due_blocks():              # then snapshots of blocks due now
            result = refresh_fn(external.snapshot(key), external.refresh_config(key))
            if delay == 0 or result.base_version == 0:
                external.apply_refresh(key, result)
            else:
                scheduled.setdefault(now + delay, []).append(result)
        assert _params_equal(native_model, external_model)
    keys = [b.key for b in native.refresh_blocks()]
    assert [native.basis_step(k) for k in keys] == [external.basis_step(k) for k in keys]
    assert max(native.basis_step(k) for k in keys) > 0


def test_a_basis_from_step_t_statistics_is_swapped_in_at_t_plus_d():
    grads = structured_grads((6, 5), 14, seed=31)
    p = torch.zeros(6, 5, dtype=torch.float64, requires_grad=True)
    opt = SOAP([p], precondition_frequency=4, refresh_delay=3)
    key = BlockKey(0, 1, 0)
    history, stats_steps, expected = [], [], {}
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
        t = opt.num_steps
        history.append(opt.state[p][BASES][1][0].clone())
        stats_steps.append(opt.basis_step(key))
        if key in opt.due_blocks() and t > 1:  # recompute by hand from this step's statistics
            snap = FactorSnapshot(key=key, stats_step=t, base_version=opt.basis_version(key),
                                  factor=opt.state[p][FACTORS][1][0].clone(),
                                  basis=history[-1].clone())
            expected[t + 3] = (t, refresh_fn(snap, opt.refresh_config(key)).basis)
    # due at step 1 (first call: its first basis swapped in at once, as the references do),
    # then every 4 parameter steps: global steps 5 and 9 (and 13), swapped in 3 steps later
    assert stats_steps[:4] == [1, 1, 1, 1]
    assert not torch.equal(history[0], torch.eye(5, dtype=torch.float64))
    assert sorted(expected) == [8, 12, 16]
    for swap_step, (stats_step, basis) in expected.items():
        if swap_step > len(grads):
            continue
        assert torch.equal(history[swap_step - 1], basis)
        assert not torch.equal(history[swap_step - 2], basis)
        assert stats_steps[swap_step - 1] == stats_step
    assert opt.basis_step(key) == 9
    assert opt.pending_refreshes() == [(16, BlockKey(0, 0, 0)), (16, key)]


@pytest.mark.parametrize("delay", [0, 2])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_dict_round_trip_continues_identically(name, delay):
    model = tiny_mlp()
    opt = OPTIMIZERS[name](model.parameters(), refresh_delay=delay)
    batches = mlp_batches(16)
    for batch in batches[:7]:
        mlp_step(model, opt, batch)
    if delay:
        assert opt.pending_refreshes(), "the checkpoint should hold a pending delayed result"
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)

    resumed_model = clone_model(model)
    resumed = OPTIMIZERS[name](resumed_model.parameters(), refresh_delay=delay)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.num_steps == opt.num_steps
    assert resumed.pending_refreshes() == opt.pending_refreshes()
    for batch in batches[7:]:
        mlp_step(model, opt, batch)
        mlp_step(resumed_model, resumed, batch)
        assert _params_equal(model, resumed_model)
    for p, q in zip(model.parameters(), resumed_model.parameters(), strict=True):
        _assert_state_equal(opt.state[p], resumed.state[q])


def _assert_state_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_state_equal(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_state_equal(x, y)
    else:
        assert a == b


def test_external_mode_never_refreshes_and_reports_due_blocks():
    grads = structured_grads((4, 3), 7, seed=32, dtype=torch.float32)
    p = torch.zeros(4, 3, requires_grad=True)
    opt = SOAP([p], precondition_frequency=3)
    opt.external_refresh = True
    due_at = {}
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
        due_at[opt.num_steps] = opt.due_blocks()
    both = (BlockKey(0, 0, 0), BlockKey(0, 1, 0))
    assert {t: keys for t, keys in due_at.items() if keys} == {1: both, 4: both, 7: both}
    assert all(opt.basis_version(k) == 0 and opt.basis_step(k) == -1 for k in both)
    assert torch.equal(opt.state[p][BASES][0][0], torch.eye(4))


def test_non_finite_results_are_detected():
    basis = torch.eye(3)
    good = RefreshResult(key=BlockKey(0, 0, 0), stats_step=1, base_version=0, basis=basis)
    assert is_finite(good)
    assert not is_finite(RefreshResult(key=good.key, stats_step=1, base_version=0,
                                       basis=torch.full((3, 3), float("nan"))))
    assert not is_finite(RefreshResult(key=good.key, stats_step=1, base_version=0, basis=basis,
                                       transport=torch.tensor([[float("inf")]])))
    bad = RefreshResult(key=good.key, stats_step=1, base_version=0,
                        basis=torch.full((3, 3), float("inf")))
    assert checked_refresh(lambda snapshot, config: good, None, None) is good
    with pytest.raises(NonFiniteResult, match="non-finite"):
        checked_refresh(lambda snapshot, config: bad, None, None)


@pytest.mark.parametrize("name", ["soap", "shampoo", "kl_shampoo"])
def test_a_failed_native_refresh_keeps_the_basis_and_is_counted(name):
    grads = structured_grads((4, 3), 7, seed=33, dtype=torch.float32)
    p = torch.zeros(4, 3, requires_grad=True)
    opt = OPTIMIZERS[name]([p])
    run_grads(opt, p, grads[:3])
    bases_before = [b.clone() for b in opt.state[p][BASES][0]]
    version = opt.basis_version(BlockKey(0, 0, 0))
    opt.state[p][FACTORS][0][0][0, 0] = float("nan")  # a corrupted statistic, e.g. an overflow
    run_grads(opt, p, grads[3:])
    assert opt.refresh_failures >= 1
    assert opt.basis_version(BlockKey(0, 0, 0)) == version
    assert torch.equal(opt.state[p][BASES][0][0], bases_before[0])
    assert opt.basis_version(BlockKey(0, 1, 0)) > version  # the healthy block still refreshed


def test_snapshots_are_copies_by_default_and_everything_pickles():
    grads = structured_grads((5, 4), 4, seed=34)
    p = torch.zeros(5, 4, dtype=torch.float64, requires_grad=True)
    opt = SOAP([p], moment_swap="transport")
    run_grads(opt, p, grads)
    key = BlockKey(0, 0, 0)
    snap, config = opt.snapshot(key), opt.refresh_config(key)
    factor = snap.factor.clone()
    opt.state[p][FACTORS][0][0].mul_(2.0)
    assert torch.equal(snap.factor, factor)
    snap2, config2 = pickle.loads(pickle.dumps((snap, config)))
    result, result2 = refresh_fn(snap, config), refresh_fn(snap2, config2)
    assert torch.equal(result.basis, result2.basis)
    assert torch.equal(result.transport, result2.transport)
    assert pickle.loads(pickle.dumps(result)).key == key


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_lent_snapshot_copies_nothing_stays_intact_and_changes_no_number(name):
    """snapshot(lend=True) hands out the live tensors; later factor updates and swaps write new
    tensors instead, so the snapshot keeps its step's values, and a run that lends equals one
    that clones, bit for bit."""
    models = {how: tiny_mlp() for how in ("lend", "clone")}
    opts = {how: OPTIMIZERS[name](m.parameters()) for how, m in models.items()}
    for opt in opts.values():
        opt.external_refresh = True
    batches = mlp_batches(13)
    kept: dict = {}
    held: list = []
    for batch in batches:
        for how, opt in opts.items():
            mlp_step(models[how], opt, batch)
            for key in opt.due_blocks():
                snap = opt.snapshot(key, lend=how == "lend")
                live = opt.state[opt._locate(key)[0]][FACTORS][key.dim][key.chunk]
                assert (snap.factor.data_ptr() == live.data_ptr()) == (how == "lend")
                if how == "lend":
                    held.append(snap)
                    kept[id(snap)] = (snap.factor.clone(), None if snap.basis is None
                                      else snap.basis.clone())
                opt.apply_refresh(key, refresh_fn(snap, opt.refresh_config(key)))
    assert len(held) >= 10
    for snap in held:  # every lent snapshot still holds its own step's values
        factor, basis = kept[id(snap)]
        assert torch.equal(snap.factor, factor)
        assert basis is None or torch.equal(snap.basis, basis)
    assert _params_equal(models["lend"], models["clone"])


def test_a_result_from_an_older_basis_is_transported_from_the_current_one():
    grads = structured_grads((5, 4), 6, seed=35)
    p = torch.zeros(5, 4, dtype=torch.float64, requires_grad=True)
    opt = SOAP([p], refresh="eigh", moment_swap="transport", precondition_frequency=100)
    opt.external_refresh = True
    run_grads(opt, p, grads[:3])
    key = BlockKey(0, 0, 0)
    first = refresh_fn(opt.snapshot(key), opt.refresh_config(key))
    run_grads(opt, p, grads[3:])
    second = refresh_fn(opt.snapshot(key), opt.refresh_config(key))
    opt.apply_refresh(key, first)
    v_before = opt.state[p]["exp_avg_sq"].clone()
    current = opt.state[p][BASES][0][0].clone()
    opt.apply_refresh(key, second)  # computed against version 0, applied at version 1
    p_bb = (current.T @ second.basis).square()
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], p_bb.T @ v_before)
    assert opt.basis_version(key) == 2


def test_refresh_blocks_are_known_before_the_first_step_and_stable():
    def build():
        model = tiny_mlp()
        return SOAP(model.parameters(), block_size=8, precondition_1d=True)

    blocks = build().refresh_blocks()
    assert blocks == build().refresh_blocks()
    # Linear(6, 12): weight (12, 6) -> rows 8 + 4, cols 6; bias 12 -> 8 + 4; Linear(12, 3) ...
    assert [(b.key, b.size) for b in blocks[:5]] == [
        (BlockKey(0, 0, 0), 8), (BlockKey(0, 0, 1), 4), (BlockKey(0, 1, 0), 6),
        (BlockKey(1, 0, 0), 8), (BlockKey(1, 0, 1), 4)]
    assert all(b.cost == b.size**3 for b in blocks)


def test_seam_errors_are_explicit():
    p = torch.zeros(3, 2, requires_grad=True)
    opt = SOAP([p])
    with pytest.raises(KeyError, match="not taken a step"):
        opt.snapshot(BlockKey(0, 0, 0))
    with pytest.raises(KeyError, match="not a refresh block"):
        opt.refresh_config(BlockKey(0, 5, 0))
    run_grads(opt, p, structured_grads((3, 2), 1, seed=36, dtype=torch.float32))
    result = refresh_fn(opt.snapshot(BlockKey(0, 0, 0)), opt.refresh_config(BlockKey(0, 0, 0)))
    with pytest.raises(ValueError, match="applied to block"):
        opt.apply_refresh(BlockKey(0, 1, 0), result)
    with pytest.raises(ValueError, match="refresh_delay"):
        opt.refresh_delay = -2


def test_a_scheduled_result_is_swapped_in_at_its_step_and_survives_a_checkpoint():
    grads = structured_grads((4, 3), 10, seed=37, dtype=torch.float32)
    p = torch.zeros(4, 3, requires_grad=True)
    opt = SOAP([p], precondition_frequency=100)
    opt.external_refresh = True
    run_grads(opt, p, grads[:2])
    key = BlockKey(0, 0, 0)
    result = refresh_fn(opt.snapshot(key), opt.refresh_config(key))
    with pytest.raises(ValueError, match="num_steps"):
        opt.schedule_refresh(2, result)
    opt.schedule_refresh(5, result)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    q = p.detach().clone().requires_grad_(True)
    resumed = SOAP([q], precondition_frequency=100)
    resumed.external_refresh = True
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for o, param in ((opt, p), (resumed, q)):
        run_grads(o, param, grads[2:4])
        assert o.basis_version(key) == 0 and o.pending_refreshes() == [(5, key)]
        run_grads(o, param, grads[4:5])
        assert o.basis_version(key) == 1 and o.basis_step(key) == 2
        assert o.pending_refreshes() == []
    assert torch.equal(p, q)
