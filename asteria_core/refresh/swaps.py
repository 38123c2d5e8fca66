"""Swaps: each outstanding refresh swapped in at its step (schedule.py), its result waited for
(`refresh_wait`, or `sync_wait` for another rank's) when it is late, counted, and a failure kept
out (faults.py)."""

from __future__ import annotations

import dataclasses
import logging
import time

from asteria_core.policy import Policy, SwapMode
from asteria_core.refresh.outstanding import Outstanding, barely_moved
from asteria_core.telemetry.labels import IdleCause

log = logging.getLogger(__name__)


class Swaps:
    def __init__(self, engine) -> None:
        self.engine = engine

    def now(self, item: Outstanding, policy: Policy) -> None:
        """Swap a first basis computed inline at once, before the next block's is computed.
        One process only: on data-parallel ranks every swap of a boundary goes in block order
        (`due`), the same on every rank, so replicas multiply alike."""
        e = self.engine
        queue_ = e.outstanding[item.key]
        if queue_ and queue_[0] is item:
            queue_.popleft()
            self.finish(item, policy)
            self._swap(item, policy)

    def due(self, t: int, policy: Policy) -> None:
        e = self.engine
        for queue_ in e.outstanding.values():
            while queue_:
                item = queue_[0]
                must = t >= e.schedule.swap_step(item, policy)
                if policy.swap_mode == SwapMode.OPPORTUNISTIC:
                    ready = item.release_step is None and (item.job is None
                                                           or item.job.done.is_set())
                    must = item.first or t >= item.since + policy.staleness_bound
                    if not (ready or must):
                        break
                elif not must:
                    break
                self.finish(item, policy)
                queue_.popleft()
                self._swap(item, policy)

    def finish(self, item: Outstanding, policy: Policy) -> None:
        """Make sure `item` has a result or an error, waiting (refresh_wait) if it must."""
        e = self.engine
        if item.delivery is not None:
            e.exchange.receive(item, policy)
            return
        if item.release_step is not None:
            e.pacer.dispatch(item)  # still held by pacing: its swap has come
        job = item.job
        if job is None or item.staged:
            return  # computed inline, or staged: result or error is already there
        if not job.done.is_set():
            t0 = time.perf_counter()
            with e.reporter.wait(IdleCause.REFRESH_WAIT):
                finished = e.workers.wait(job, policy, e.meter.expected(item.key))
                if not finished:
                    log.warning("refresh of %s not done %.1f s after the bound; computing it "
                                "inline", item.key, time.perf_counter() - t0)
                    e.workers.abandon(job)
                    e.inline_fallbacks += 1
                    e.run_inline(item, job, e.fallback_fn)
            e.waited_seconds += time.perf_counter() - t0
            if not finished:
                return
        item.result, item.error = job.result, job.error
        e.meter.took(item.key, job.seconds)
        e.meter.ready(item.released, job)

    def _swap(self, item: Outstanding, policy: Policy) -> None:
        e = self.engine
        ok = item.result is not None and item.error is None
        if item.delivery is None and ok:
            barely_moved(item, item.result, e.skip_below)
        seconds = e.meter.refresh_seconds.get(item.key, 0.0)
        if item.unchanged:  # every rank keeps the basis in use: no swap, no failure
            e.unchanged += 1
            e.faults.succeeded(item.key)
            if item.delivery is None:
                e.refreshes += 1
                e.work_seconds += seconds
            return
        if item.delivery is None:  # this rank's own refresh: its work counts here
            e.reporter.refresh_done(seconds)
            e.refreshes += 1
            e.work_seconds += seconds
        if ok:
            result = item.result
            assert result is not None  # ok
            if e.exchange is not None and result.rotation is not None:
                # The other ranks receive no rotation and compute it at their swap: so does
                # the owner, so every replica multiplies the same way (same bits).
                result = dataclasses.replace(result, rotation=None)
            e.opt.apply_refresh(item.key, result)
            e.faults.succeeded(item.key)
            return
        e.failures += 1
        e.faults.failed(item, policy.failure_limit)
