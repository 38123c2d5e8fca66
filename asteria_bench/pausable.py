"""A refresh engine a benchmark can pause between steps exactly (asteria_bench/turns.py).

Several runs take turns on one machine. When a run's turn ends, the jobs that pacing would
release at its last boundary must neither run on into the next run's turn nor run early, so
they are held (`defer_releases(True)`) and sent when the run's next turn starts
(`defer_releases(False)`); `wait_released` waits for jobs already sent. Timing only: results and
swap steps are those of the plain engine (tests/benchmarks/test_pausable.py).
"""

from __future__ import annotations

import time

from asteria_core.refresh import RefreshEngine
from asteria_core.runtime import Runtime


class PausableRefresh(RefreshEngine):
    deferred = False

    def _release(self, t: int) -> None:
        if not self.deferred:
            super()._release(t)

    def defer_releases(self, defer: bool) -> None:
        """While on, jobs whose pacing release comes at a boundary stay held (a swap that needs
        one still sends it); turning it off sends every job whose release has come."""
        self.deferred = defer
        if not defer and self._pool is not None:
            self._release(self.opt.num_steps)

    def wait_released(self, timeout: float = 60.0) -> float:
        """Wait (at most `timeout` s in all) until every job already handed to the workers has
        finished; jobs held back by pacing stay held. Returns the seconds waited."""
        t0 = time.perf_counter()
        for item in list(self._all_outstanding()):
            if item.job is not None and item.release_step is None:
                item.job.done.wait(max(0.0, timeout - (time.perf_counter() - t0)))
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
