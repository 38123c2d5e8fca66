"""A refresh engine a benchmark can pause between steps exactly (asteria_bench/turns.py).

Several runs take turns on one machine. When a run's turn ends, the jobs that pacing would
release at its last boundary must neither run on into the next run's turn nor run early, so
they are held (`defer_releases(True)`) and sent when the run's next turn starts
(`defer_releases(False)`); `wait_released` waits for jobs already sent. The time between turns
is not the run's: the step time the refresh duty is measured against leaves it out. Timing
only: results and swap steps are those of the plain engine (tests/bench/test_pausable.py).
"""

from __future__ import annotations

import time

from asteria_core.refresh import RefreshEngine
from asteria_core.runtime import Runtime


class PausableRefresh(RefreshEngine):
    paused_at: float | None = None
    """When the last turn ended (after `wait_released`); None while a turn runs."""

    @property
    def deferred(self) -> bool:
        return self.pacer.holding

    def defer_releases(self, defer: bool) -> None:
        """While on, jobs whose pacing release comes at a boundary stay held (a swap that needs
        one still sends it); turning it off sends every job whose release has come."""
        if not defer and self.paused_at is not None:
            if self.meter.last_boundary is not None:  # the pause is no part of the next step
                self.meter.last_boundary += time.perf_counter() - self.paused_at
            self.paused_at = None
        self.hold_releases(defer)

    def wait_released(self, timeout: float = 60.0) -> float:
        """Wait (at most `timeout` s in all) until every job already handed to the workers has
        finished; jobs held back by pacing stay held. Returns the seconds waited."""
        t0 = time.perf_counter()
        for item in list(self.pending):
            if item.job is not None and item.release_step is None:
                item.job.done.wait(max(0.0, timeout - (time.perf_counter() - t0)))
        self.paused_at = time.perf_counter()
        return time.perf_counter() - t0


def make_pausable(runtime: Runtime) -> PausableRefresh | None:
    """Before the first step: replace the runtime's refresh engine with a pausable one."""
    if runtime.refresh is None:
        return None
    old = runtime.refresh
    old.close()
    runtime.refresh = PausableRefresh(runtime.optimizer, runtime.policy, runtime.reporter,
                                      fn=old.refresh_fn, skip_below=old.skip_below,
                                      worker_cpus=old.worker_cpus)
    return runtime.refresh
