"""Refreshes slower than a refresh interval (a 3072- or 8192-wide factor on a
host worker can take longer than the steps between its refreshes).

What must hold, through the runtime and its step records: the staleness a step sees never
passes the bound S; the time training waits for a late refresh is counted as `refresh_wait`;
and the work does not pile up: in opportunistic mode a block that falls due again while its
previous refresh still waits for a worker replaces it (the newer statistics are refreshed, by
the older one's deadline), so no block waits for a worker twice. In deterministic mode every
refresh is swapped at s + d, so a block has at most ceil(d / interval) refreshes in flight.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from asteria_core.optim import SOAP
from asteria_core.optim.seam import BlockKey, refresh_fn
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine
from asteria_core.runtime import Runtime, RuntimeConfig
from asteria_core.telemetry.reporter import NullReporter
from tests.asteria_core.refresh.faults import SlowRefresh

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 30
BOUND = 4


def _train(tmp_path, **policy):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 3))
    opt = SOAP(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    target = torch.randn(8, 3, generator=g)
    records = []
    # A refresh sleeps 40 ms, many steps of this model: the worker can never keep up.
    runtime = Runtime(opt, model=model, config=RuntimeConfig(
        run_dir=tmp_path, refresh_fn=SlowRefresh(0.04),
        policy=Policy(refresh_interval=1, staleness_bound=BOUND, workers=1, **policy)))
    runtime.add_listener(records.append)
    blocks = len(opt.refresh_blocks())
    with runtime:
        for _ in range(STEPS):
            x = torch.randn(16, 8, generator=g)
            loss = nn.functional.mse_loss(model(x), x @ target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        in_flight = {key: len(queue) for key, queue in runtime.refresh.outstanding.items()}
    return records, blocks, in_flight


@pytest.mark.parametrize("mode", ["deterministic", "opportunistic"])
def test_a_refresh_slower_than_its_interval_waits_at_the_bound_as_refresh_wait(tmp_path, mode):
    # deterministic: d = S set, so a block may lag up to the bound ("auto" is the interval, 1)
    delay = {"swap_delay": BOUND} if mode == "deterministic" else {}
    records, blocks, in_flight = _train(tmp_path, swap_mode=mode, **delay)
    assert len(records) == STEPS
    assert all(r.refresh.staleness_max <= BOUND for r in records)
    assert max(r.refresh.staleness_max for r in records) == BOUND  # it did fall behind
    waited = sum(r.timing.idle_seconds.get("refresh_wait", 0.0) for r in records)
    assert waited > 0.04  # at least one refresh's worth, counted as the wait it is
    if mode == "opportunistic":
        # Never more than one refresh per block waiting for the worker, plus the one it runs.
        assert max(r.refresh.queue_depth for r in records) <= blocks + 1
        assert max(in_flight.values()) <= 2
    else:
        per_block = math.ceil(BOUND / 1)  # d = S, interval 1
        assert max(r.refresh.queue_depth for r in records) <= blocks * per_block
        assert max(in_flight.values()) <= per_block


def test_the_auto_swap_delay_keeps_one_round_in_flight(tmp_path):
    """"auto" swaps a round in by the next refresh point (d = the interval, 1 here): however
    slow the worker, every basis in use is at most a step behind and a block has one refresh in
    flight; the step waits for the rest, counted as refresh_wait."""
    records, blocks, in_flight = _train(tmp_path, swap_mode="deterministic")
    assert max(r.refresh.staleness_max for r in records) == 1
    assert max(r.refresh.queue_depth for r in records) <= blocks
    assert max(in_flight.values()) <= 1
    waited = sum(r.timing.idle_seconds.get("refresh_wait", 0.0) for r in records)
    assert waited > 0.04


def test_coalesced_refreshes_are_fewer_and_the_run_still_learns(tmp_path):
    """Opportunistic mode drops a waiting refresh when a newer one of its block falls due: the
    worker computes fewer refreshes than fell due, and every block is still refreshed."""
    torch.manual_seed(0)
    model = nn.Linear(8, 6)
    opt = SOAP(model.parameters(), lr=1e-2)
    runtime = Runtime(opt, model=model, config=RuntimeConfig(
        run_dir=tmp_path, reporter=NullReporter(), refresh_fn=SlowRefresh(0.03),
        policy=Policy(refresh_interval=1, staleness_bound=BOUND, workers=1,
                      swap_mode="opportunistic")))
    with runtime:
        for _ in range(STEPS):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        refreshed = runtime.refresh.refreshes
    due = STEPS * len(opt.refresh_blocks())
    assert 0 < refreshed < due // 2
    assert all(opt.basis_version(b.key) > 1 for b in opt.refresh_blocks())


class CostlyRefresh:
    """The real refresh after a sleep that grows as b^3, as a decomposition's time does."""

    def __init__(self, seconds_at: int, seconds: float) -> None:
        self.per_cost = seconds / seconds_at**3

    def __call__(self, snapshot, config):
        time.sleep(self.per_cost * snapshot.factor.shape[0] ** 3)
        return refresh_fn(snapshot, config)


def test_a_refresh_running_longer_than_the_timeout_is_waited_for_not_computed_again():
    """refresh_timeout_ms is for hung workers. A wide block's refresh takes longer than that
    (an 8192-wide one, over a minute on a core here): while a worker runs it, the step waits for
    it at the bound rather than abandoning it and computing it again on the training thread."""
    torch.manual_seed(0)
    model = nn.Linear(8, 16, bias=False)  # blocks of 16 (1.2 s a refresh) and 8 (0.15 s)
    opt = SOAP(model.parameters(), lr=1e-2)
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=2, staleness_bound=2,
                                                  workers=1, refresh_timeout_ms=500)),
                           fn=CostlyRefresh(16, 1.2))
    try:
        for _ in range(7):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            engine.on_boundary(opt.num_steps)
    finally:
        engine.close()
    assert engine.waited_seconds > 1.0  # the bound made the steps wait, past the timeout
    assert engine.inline_fallbacks == 0 and engine.failures == 0
    assert opt.basis_version(BlockKey(0, 0, 0)) >= 3
