"""The round-robin suites' pausable refresh engine: pausing between turns changes timing only."""

import torch

from asteria_bench.pausable import PausableRefresh
from asteria_core.optim import SOAP
from asteria_core.policy import LivePolicy, Policy
from tests.asteria_core.refresh.test_engine import _problem, _train


def test_deferred_releases_go_out_when_deferral_ends_and_change_no_number():
    """defer_releases holds paced jobs past their release boundary (the benchmark's pause
    between turns); ending it sends them; the trained parameters are the same bit for bit."""
    interval = 4
    model, batches = _problem(7)
    reference = _train(model, SOAP(model.parameters(), lr=1e-2, precondition_frequency=interval,
                                   refresh_delay=interval), batches)

    model, batches = _problem(7)
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=interval)
    # swap_window 1: every swap at s + d, as in the optimizer's own delayed mode
    engine = PausableRefresh(opt, LivePolicy(Policy(refresh_interval=interval,
                                                    staleness_bound=interval, swap_window=1,
                                                    workers=1)))
    held_over = []

    def boundary(step):
        engine.defer_releases(step % 3 == 0)  # every third boundary holds its releases
        engine.on_boundary(step)
        due_now = [i for i in engine._held if i.release_step <= opt.num_steps]
        if engine.deferred:
            held_over.extend(due_now)
        else:
            assert not due_now, "a job whose release came was not sent"
        engine.defer_releases(False)
        assert not [i for i in engine._held if i.release_step <= opt.num_steps]

    try:
        params = _train(model, opt, batches, boundary)
        engine.wait_released()
    finally:
        engine.close()
    assert held_over, "no release was ever deferred"
    assert all(torch.equal(a, b) for a, b in zip(params, reference, strict=True))
