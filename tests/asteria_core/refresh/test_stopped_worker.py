"""A worker process that stops (SIGSTOP) or gets stuck mid-run must not stall training for long.

One real process worker, many small blocks, a 1.5 s refresh timeout. The worker is stopped
while idle, just before a round falls due: the next boundary must wait for the round's late
blocks about one timeout in all (not a timeout per block, nor the allowance of a refresh that
computes), kill the stopped process, start another, and compute the round inline. A second stop
later in the run is handled the same way: nothing learnt from the first stretches the wait.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from torch import nn

from asteria_core.optim import SOAP
from asteria_core.optim.seam import refresh_fn
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine
from tests.procs import alive

pytestmark = pytest.mark.usefixtures("one_thread")

TIMEOUT_S = 1.5
LAYERS = 8  # two blocks each (SOAP factors a weight's two sides): 16 blocks
STALL_LIMIT_S = 4 * TIMEOUT_S
"""A hang guard, far under the (blocks - 1) timeouts of a wait per block: the stall is one
timeout, the kill and the inline round; a slow machine has 2.5 timeouts to spare."""


def _wait(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


class _Run:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(*(nn.Linear(6, 6, bias=False) for _ in range(LAYERS)))
        self.opt = SOAP(self.model.parameters(), lr=1e-2)
        self.blocks = len(self.opt.refresh_blocks())
        # A round falls due every 2 steps and is swapped at the next boundary.
        self.engine = RefreshEngine(self.opt, LivePolicy(Policy(
            refresh_interval=2, staleness_bound=1, swap_delay=1, workers=1,
            worker_kind="process", refresh_timeout_ms=int(TIMEOUT_S * 1e3))))

    def step(self) -> float:
        """One step; the seconds its boundary took."""
        loss = self.model(torch.randn(4, 6)).square().mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        t0 = time.perf_counter()
        self.engine.on_boundary(self.opt.num_steps)
        return time.perf_counter() - t0

    def idle_worker(self) -> int:
        """Train until a round has just been swapped and the worker is up and idle; its pid."""
        pool = self.engine.workers.pool
        _wait(lambda: pool.up() == 1)
        while True:
            self.step()
            if self.opt.num_steps % 2 == 1 and pool.busy() == 0:  # the next step's round is due
                return pool.pids()[0]

    def stop_worker_for_a_round(self) -> tuple[float, int]:
        """Stop the idle worker; the slowest boundary of the next round, and the pid stopped."""
        victim = self.idle_worker()
        fallbacks = self.engine.inline_fallbacks
        os.kill(victim, signal.SIGSTOP)
        try:
            stall = max(self.step() for _ in range(3))  # the round falls due, is swapped, +1
        finally:
            if alive(victim):
                os.kill(victim, signal.SIGCONT)
        assert self.engine.inline_fallbacks > fallbacks, "the stopped round never fell back"
        return stall, victim


def test_a_stopped_worker_process_stalls_a_step_about_one_timeout_and_is_replaced():
    run = _Run()
    assert run.blocks - 1 > STALL_LIMIT_S / TIMEOUT_S
    try:
        for stop in ("first", "second"):
            stall, victim = run.stop_worker_for_a_round()
            assert stall < STALL_LIMIT_S, (
                f"{stop} stop: a step stalled {stall:.1f} s with a {TIMEOUT_S} s timeout "
                f"({run.blocks} blocks)")
            _wait(lambda victim=victim: not alive(victim), 30)  # killed, not left stopped
            pool = run.engine.workers.pool
            assert victim not in pool.pids()
            _wait(lambda pool=pool: pool.up() == 1)  # and replaced
        for _ in range(4):  # the new worker refreshes again
            run.step()
        assert run.engine.failures == 0
    finally:
        run.engine.close()


class _SlowOnceThenHangs:
    """The real refresh; one block's refresh of step SLOW takes SLOW_S, of step HANG hangs."""

    SLOW, SLOW_S, HANG = 5, 2.5, 11

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, snapshot, config):
        if snapshot.key.dim == 0 and snapshot.stats_step == self.SLOW:
            time.sleep(self.SLOW_S)
        if snapshot.key.dim == 0 and snapshot.stats_step == self.HANG:
            self.release.wait(120)
        return refresh_fn(snapshot, config)


def test_one_slow_refresh_does_not_stretch_the_hang_allowance_for_the_rest_of_the_run():
    """A thread worker cannot be watched for progress: a refresh it computes counts as hung after
    4 x max(timeout, its expected time). One refresh slowed 2.5 s (a worker starved or stopped a
    while) must not become the expected time of every later one: a later hang is then waited for
    4 timeouts (3.2 s), not 4 x 2.5 s."""
    timeout = 0.8
    torch.manual_seed(0)
    model = nn.Linear(6, 6, bias=False)
    opt = SOAP(model.parameters(), lr=1e-2)
    fn = _SlowOnceThenHangs()
    engine = RefreshEngine(opt, LivePolicy(Policy(
        refresh_interval=2, staleness_bound=1, swap_delay=1, workers=1,
        refresh_timeout_ms=int(timeout * 1e3))), fn=fn)
    waits, fallbacks = {}, {}
    try:
        for _ in range(14):
            loss = model(torch.randn(4, 6)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            t0 = time.perf_counter()
            engine.on_boundary(opt.num_steps)
            waits[opt.num_steps] = time.perf_counter() - t0
            fallbacks[opt.num_steps] = engine.inline_fallbacks
    finally:
        fn.release.set()
        engine.close()
    assert waits[fn.SLOW + 1] > fn.SLOW_S / 2  # the slow refresh was waited for,
    assert fallbacks[fn.HANG] == 0  # not abandoned; the hung one was (and the thread,
    assert fallbacks[fn.HANG + 1] >= 1  # stuck for good, falls back from then on)
    hang = waits[fn.HANG + 1]
    assert hang < 3 * fn.SLOW_S, f"a hung refresh held the step {hang:.1f} s"
