"""What the refresh engine measures and reports: its counts, the steps' own time, the workers'
load and busy share, refresh latency, and each boundary's `RefreshFigures` for the step record.

Step time (`step_seconds`) is boundary to boundary less the refreshes waited for: what the
workers' capacity is measured against. With the waits in, a step that waits for the workers
would stretch the interval its duty is measured over, and the duty would read about 1 however
far behind they are.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass

from asteria_core.optim.seam import BlockKey
from asteria_core.policy import Policy
from asteria_core.refresh.workers import Job
from asteria_core.telemetry.records import RefreshFigures
from asteria_core.telemetry.reporter import Reporter

LATENCY_SAMPLES = 64
"""Refreshes the latency figure is taken over (`RefreshFigures.refresh_latency_steps`)."""
STEP_SAMPLES = 32
"""Boundary intervals the step time (`step_seconds`, the duty's denominator) is the median of:
robust to the odd long one (an evaluation, a checkpoint, a paused benchmark turn)."""
RATE_SAMPLES = 32
"""Refreshes the expected seconds per b^3 (the hang allowance's) is the median of: one refresh
slowed by a stopped worker never moves it alone, and leaves it after this many."""


@dataclass
class Counts:
    """What the engine has counted so far."""

    refreshes: int = 0
    """Refreshes this rank computed and swapped in (or failed)."""
    work_seconds: float = 0.0
    """Worker seconds of `refreshes`."""
    computed_seconds: float = 0.0
    """Seconds of every refresh computed so far, swapped in yet or not."""
    computed_cost: float = 0.0
    """Cost (b^3) of the refreshes in `computed_seconds`: their ratio is this rank's refresh
    speed (distributed/rebalance.py reads it)."""
    waited_seconds: float = 0.0
    """Seconds the training thread waited for refreshes (this rank's, another rank's)."""
    failures: int = 0
    inline_fallbacks: int = 0
    """Refreshes meant for a worker that ran on the training thread."""
    unchanged: int = 0
    """Refreshes skipped because their basis barely moved (`skip_below`)."""


class Shown:
    """An engine attribute that reads (and writes) one of its `Counts` under the same name."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.meter.counts, self.name)

    def __set__(self, obj, value) -> None:
        setattr(obj.meter.counts, self.name, value)


class RefreshMeter:
    """Times, rates and figures of one engine's refreshes."""

    def __init__(self, blocks: dict) -> None:
        self.blocks = blocks
        self.counts = Counts()
        self.refresh_seconds: dict[BlockKey, float] = {}
        """The last refresh time of each block (its share of a round's work)."""
        self._round_seconds = 0.0
        """Sum of `refresh_seconds`, kept as it changes (not summed at every boundary)."""
        self._rates: deque[float] = deque(maxlen=RATE_SAMPLES)
        self.last_boundary: float | None = None
        self.step_walls: deque[float] = deque(maxlen=STEP_SAMPLES)
        """The last steps' own wall times: boundary to boundary, less their refresh waits."""
        self._waited_before = 0.0
        self._latencies: deque[int] = deque(maxlen=LATENCY_SAMPLES)
        """Steps from release to ready of this rank's last refreshes on workers."""
        self._busy_mark: tuple | None = None
        """(pool, its busy seconds, when) at the last boundary (`busy_ratio`)."""
        self._mode = ""

    def boundary(self) -> None:
        """A boundary begins: the step before it ends."""
        now = time.perf_counter()
        if self.last_boundary is not None:
            waited = self.counts.waited_seconds - self._waited_before
            self.step_walls.append(max(now - self.last_boundary - waited, 0.0))
        self.last_boundary, self._waited_before = now, self.counts.waited_seconds

    @property
    def step_seconds(self) -> float:
        """A step's own time: the median over the last STEP_SAMPLES steps (0 before two)."""
        return statistics.median(self.step_walls) if self.step_walls else 0.0

    def took(self, key: BlockKey, seconds: float) -> None:
        """The last refresh of `key` took `seconds` (its share of a round's work)."""
        self._round_seconds += seconds - self.refresh_seconds.get(key, 0.0)
        self.counts.computed_seconds += seconds
        self.counts.computed_cost += self.blocks[key].cost
        self.refresh_seconds[key] = seconds
        self._rates.append(seconds / self.blocks[key].cost)

    def expected(self, key: BlockKey) -> float:
        """Seconds a refresh of `key` is expected to take (0 before any finished)."""
        return statistics.median(self._rates) * self.blocks[key].cost if self._rates else 0.0

    def ready(self, released: int | None, job: Job) -> None:
        """A worker's result is taken: how many steps of the usual length it took from its
        release to being ready (1: ready for the next boundary). Counted in boundaries instead,
        a result the step waited for would read as ready at its swap, however late it was."""
        step = self.step_seconds
        if released is None or job.finished_at is None or not step:
            return
        took = job.finished_at - job.submitted_at
        self._latencies.append(max(math.ceil(took / step - 1e-9), 1))

    def latency_steps(self) -> int | None:
        """90th percentile of the latencies (nearest rank), None before any."""
        if not self._latencies:
            return None
        ordered = sorted(self._latencies)
        return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]

    def background_load(self, policy: Policy) -> float | None:
        """A round's refresh work / the workers' time in one interval of steps at their own
        time (`step_seconds`); above 1 the workers cannot keep up and steps wait."""
        step = self.step_seconds
        if policy.workers == 0 or not step or not self.refresh_seconds:
            return None
        return self._round_seconds / (policy.workers * policy.refresh_interval * step)

    def busy_ratio(self, pool) -> float | None:
        """The share of the workers' time since the last boundary spent in jobs (None inline).
        Measured over the interval, not looked at the boundary: there the workers are between
        jobs (those released now not yet taken up), and a look reads 0 however busy they were."""
        if pool is None:
            self._busy_mark = None
            return None
        mark = (pool, pool.busy_seconds(), time.perf_counter())
        last, self._busy_mark = self._busy_mark, mark
        if last is None or last[0] is not pool or mark[2] <= last[2]:
            return None  # a new pool: nothing measured yet
        return min((mark[1] - last[1]) / (pool.size * (mark[2] - last[2])), 1.0)

    def report(self, reporter: Reporter, policy: Policy, stale: list[int], depth: int, pool,
               deaths: int, swap_lead: int | None) -> RefreshFigures:
        """This boundary's figures, also handed to `reporter`."""
        reporter.set_staleness(stale)
        mode = "native" if policy.workers == 0 else f"async-{policy.swap_mode}"
        if mode != self._mode:
            self._mode = mode
            reporter.set_mode(mode)
        return RefreshFigures(
            staleness_max=max(stale, default=0), staleness_bound=policy.staleness_bound,
            queue_depth=depth, background_load=self.background_load(policy),
            workers_busy_ratio=self.busy_ratio(pool), failures=self.counts.failures,
            inline_fallbacks=self.counts.inline_fallbacks, worker_deaths=deaths,
            swap_lead=swap_lead, refresh_latency_steps=self.latency_steps())
