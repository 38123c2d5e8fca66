"""What a swap costs the training thread (what grows with the factor's width).

A SOAP swap rotates the first moment by Q_old^T Q_new. That (b, b) x (b, b) product is b^3, as
much as a refresh, and used to run on the training thread at every swap: 0.37 s per 3072-wide
block here. It now comes with the refresh, computed where the refresh runs, and a swap of one
chunk of a blocked dimension writes that chunk in place instead of copying the whole moment.
The numbers stay the same bit for bit (the async-equals-native tests in test_engine.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from asteria_core.optim import SOAP
from asteria_core.optim.seam import BlockKey, refresh_fn
from asteria_core.optim.soap import EXP_AVG_E, EXP_AVG_SQ
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS, COLS = 48, 16  # not square: a (48, 48) x (48, 48) product can only be a basis product


class SquareProducts(TorchDispatchMode):
    """Records the matrix products of two square operands made on this thread (dispatch modes
    are thread-local, so a worker thread's products are not seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                    torch.ops.aten.matmul.default):
            a, b = args[0], args[1]
            if a.shape[-1] == a.shape[-2] == b.shape[-2] == b.shape[-1]:
                self.sizes.append(a.shape[-1])
        return func(*args, **(kwargs or {}))


def _batches(n: int):
    g = torch.Generator().manual_seed(1)
    target = torch.randn(COLS, 4, generator=g)
    return [(x, x @ target) for x in (torch.randn(8, COLS, generator=g) for _ in range(n))]


def test_with_a_worker_the_training_thread_makes_no_basis_sized_product():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(COLS, ROWS, bias=False), nn.Tanh(),
                          nn.Linear(ROWS, 4, bias=False))
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=2)
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=2, staleness_bound=2,
                                                  swap_delay=1, workers=1)))
    swaps = 0
    try:
        with SquareProducts() as seen:
            for x, y in _batches(12):
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                engine.on_boundary(opt.num_steps)
        swaps = sum(opt.basis_version(b.key) for b in opt.refresh_blocks())
    finally:
        engine.close()
    assert swaps >= 4 * 4  # every block was swapped several times on this thread
    assert seen.sizes == []


def _one_layer(block_size=None):
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(ROWS, COLS))
    opt = SOAP([p], lr=1e-2, precondition_frequency=1000, block_size=block_size)
    opt.external_refresh = True
    for _ in range(3):  # first statistics, then moments in a basis of their own
        p.grad = torch.randn(ROWS, COLS)
        opt.step()
        for b in opt.refresh_blocks():
            opt.apply_refresh(b.key, refresh_fn(opt.snapshot(b.key), opt.refresh_config(b.key)))
    p.grad = torch.randn(ROWS, COLS)
    opt.step()
    return p, opt


def test_the_swap_rotates_with_the_refreshs_product_and_recomputes_it_when_stale():
    p, opt = _one_layer()
    key = BlockKey(0, 0, 0)
    state = opt.state[p]
    fresh = refresh_fn(opt.snapshot(key), opt.refresh_config(key))
    stale = refresh_fn(opt.snapshot(key), opt.refresh_config(key))
    assert fresh.rotation is not None  # computed with the refresh, off the training thread

    def expected(old_bb, new_bb):
        return (state[EXP_AVG_E].T @ (old_bb.T @ new_bb)).T

    want = expected(state["bases"][0][0], fresh.basis)
    with SquareProducts() as seen:
        opt.apply_refresh(key, fresh)
    assert seen.sizes == []
    assert torch.equal(state[EXP_AVG_E], want)

    # `stale` was computed from the basis `fresh` replaced: its product is of no use now, and
    # the swap computes Q_old^T Q_new from the basis really in use.
    want = expected(state["bases"][0][0], stale.basis)
    with SquareProducts() as seen:
        opt.apply_refresh(key, stale)
    assert seen.sizes == [ROWS]
    assert torch.equal(state[EXP_AVG_E], want)


def test_a_swap_of_one_chunk_writes_that_chunk_and_copies_nothing_else():
    p, opt = _one_layer(block_size=16)  # dim 0: three chunks of 16
    state = opt.state[p]
    key = BlockKey(0, 0, 1)
    result = refresh_fn(opt.snapshot(key), opt.refresh_config(key))
    before = {name: state[name].clone() for name in (EXP_AVG_E, EXP_AVG_SQ)}
    storage = {name: state[name].data_ptr() for name in before}
    opt.apply_refresh(key, result)
    rows = slice(16, 32)
    for name, old in before.items():
        assert state[name].data_ptr() == storage[name]  # written in place
        assert torch.equal(state[name][:16], old[:16]) and torch.equal(state[name][32:], old[32:])
    assert torch.equal(state[EXP_AVG_E][rows], (before[EXP_AVG_E][rows].T @ result.rotation).T)
    assert torch.equal(state[EXP_AVG_SQ][rows], before[EXP_AVG_SQ][rows][result.perm])


def test_snapshots_reach_a_worker_process_in_reused_shared_memory(monkeypatch):
    """A worker process gets each snapshot through shared memory. It used to be cloned (the
    optimizer's own tensors must not be moved into shared memory), then copied again into a
    new shared segment as it was pickled, per tensor and per job. Now it is copied once into a
    shared buffer that comes back when the worker is done with it: new segments stop at the
    few buffers in flight, however many refreshes run."""
    moved = []
    share = torch.UntypedStorage._share_fd_cpu_

    def counting(self, *args, **kwargs):
        if not self.is_shared():  # this call creates a segment and copies the storage in
            moved.append(self.nbytes())
        return share(self, *args, **kwargs)

    monkeypatch.setattr(torch.UntypedStorage, "_share_fd_cpu_", counting)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(COLS, ROWS, bias=False), nn.Tanh(),
                          nn.Linear(ROWS, 4, bias=False))
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=2)
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=2, staleness_bound=1,
                                                  swap_delay=1, workers=1,
                                                  worker_kind="process")))
    try:
        for x, y in _batches(24):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            engine.on_boundary(opt.num_steps)
        refreshed = engine.refreshes
    finally:
        engine.close()
    shapes = {b.size for b in opt.refresh_blocks()}  # 48, 16 and 4
    assert refreshed >= 40  # 4 blocks, 12 rounds: every snapshot went to the process
    assert engine.failures == 0 and engine.inline_fallbacks == 0
    # At most two jobs' buffers (factor and basis) of each shape: the one a process runs and
    # the one the dispatcher prepares meanwhile. Before: two new segments per refresh.
    assert len(moved) <= 2 * 2 * len(shapes) < 2 * refreshed
    assert not any(p.untyped_storage().is_shared() for p in model.parameters())
    for state in opt.state.values():  # nor a factor the optimizer lent
        assert not any(f.untyped_storage().is_shared() for f in state["factors"][0])
