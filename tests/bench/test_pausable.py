"""The round-robin suites' pausable refresh engine: pausing between turns changes timing only."""

import time

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
        due_now = [i for i in engine.pacer.held if i.release_step <= opt.num_steps]
        if engine.deferred:
            held_over.extend(due_now)
        else:
            assert not due_now, "a job whose release came was not sent"
        engine.defer_releases(False)
        assert not [i for i in engine.pacer.held if i.release_step <= opt.num_steps]

    try:
        params = _train(model, opt, batches, boundary)
        engine.wait_released()
    finally:
        engine.close()
    assert held_over, "no release was ever deferred"
    assert all(torch.equal(a, b) for a, b in zip(params, reference, strict=True))


def test_the_pause_between_turns_is_no_part_of_the_step_time():
    """The refresh duty divides a round's work by the step time: a turn's first step must not
    count the other runs' turns (a pause ten steps long read as one step made the duty of
    every run in turns several times too small)."""
    model, batches = _problem(7)
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=4)
    engine = PausableRefresh(opt, LivePolicy(Policy(refresh_interval=4, staleness_bound=4,
                                                    workers=1)))
    bounds = []

    def boundary(step):
        if step == 5:  # a turn ends after step 5 and the next one starts after a pause
            before_last = time.perf_counter()  # at or before the boundary of step 5 began
            engine.on_boundary(step)
            engine.wait_released()
            paused = time.perf_counter()  # at or after the pause began
            time.sleep(0.5)
            resumed = time.perf_counter()  # at or before the pause ended
            engine.defer_releases(False)
            bounds.append((paused - before_last, resumed))
            return
        engine.on_boundary(step)
        if step == 6:
            before, resumed = bounds[0]
            # the wall recorded for step 6: at most the turn's own time on both sides
            assert engine.meter.step_walls[-1] <= before + (time.perf_counter() - resumed)

    try:
        _train(model, opt, batches[:8], boundary)
    finally:
        engine.close()
    assert bounds, "the pause never happened"
