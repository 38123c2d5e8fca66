"""`workers_busy_ratio`: the share of the workers' time spent in refreshes, between boundaries.

Workers that cannot keep up (each refresh sleeps, a round is several intervals of steps) are
busy nearly all the time. Looked at the boundary, they read idle: the jobs released there are
not yet taken up and those before are done, so the figure must be measured over the interval.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

from asteria_core.optim import SOAP
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine
from tests.asteria_core.refresh.faults import SlowRefresh

pytestmark = pytest.mark.usefixtures("one_thread")


def _figures(workers: int, kind: str = "thread", steps: int = 40):
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(8, 8, bias=False) for _ in range(4)))  # 8 blocks
    opt = SOAP(model.parameters(), lr=1e-2)
    engine = RefreshEngine(opt, LivePolicy(Policy(
        refresh_interval=4, staleness_bound=4, workers=workers, worker_kind=kind)),
        fn=SlowRefresh(0.02))
    figures = []
    try:
        for _ in range(steps):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            engine.on_boundary(opt.num_steps)
            figures.append(engine.figures)
    finally:
        engine.close()
    return figures


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_workers_that_cannot_keep_up_read_busy(kind):
    figures = _figures(1, kind)[-24:]  # a process worker is up by then
    assert all(f.background_load > 1 for f in figures)  # a round's work outlasts its interval
    busy = [f.workers_busy_ratio for f in figures]
    assert all(b is not None and 0 <= b <= 1 for b in busy), busy
    assert statistics.median(busy) > 0.5, busy


def test_inline_refreshes_have_no_busy_ratio():
    assert all(f.workers_busy_ratio is None for f in _figures(0, steps=6))
