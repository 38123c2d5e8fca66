"""The refresh engine: preconditioner refreshes off the critical path, under bounded staleness.

At each step boundary (after the optimizer update of step t) the engine, in this order,
1. swaps in every result whose swap step has come (schedule.py: in deterministic mode slot k of
   a round that fell due at s is swapped at s + L + k, L = d - V + 1; in opportunistic mode as
   soon as it is ready), waiting (`refresh_wait`) when the next step would otherwise use a basis
   more than S steps behind a refresh that fell due (the bound; outstanding.py counts it). A
   block's first refresh (its basis is the initial identity) is swapped at the boundary it fell
   due, in either mode, as the references do: no step trains in the identity basis;
2. snapshots the blocks whose refresh fell due at t and queues them for the workers (pool.py),
   most stale first, then most expensive, or holds them for pacing (pacing.py); a snapshot
   copies nothing (the optimizer lends its tensors), on CUDA it goes to pinned host memory on a
   side stream (host.py); in a data-parallel run this rank refreshes only the blocks it owns and
   trades results with the other ranks (ranks.py); results that wait for their swap are staged
   where their block's state lives (staging.py);
3. reports staleness, queue depth, background load, failures and waits (figures.py).

With `workers = 0` refreshes run inline at their release boundary and wait for the same swap
steps, so inline and worker runs train the same numbers (on one intra-op thread each); with the
same d and V = 1 that is the optimizer's own delayed mode, bit for bit. Workers slower than the
refresh interval make the step wait at the bound and never pile work up: in deterministic mode
a block has at most ceil(d / interval) refreshes in flight, in opportunistic mode a newer
refresh replaces one still waiting for a worker.

Faults: a refresh that raises or returns non-finite values keeps the previous basis and is
counted; `failure_limit` consecutive failures of one block stop the run with `RefreshFailed`.
A refresh that hangs is computed inline (pool.py says when), counted as an inline fallback.
"""

from __future__ import annotations

import logging
import time
from functools import partial

from asteria_core.optim.base import BlockPreconditioner
from asteria_core.optim.seam import BlockKey, checked_refresh, refresh_fn
from asteria_core.policy import LivePolicy, Policy, SwapMode
from asteria_core.refresh.faults import Failures, RefreshFailed
from asteria_core.refresh.figures import RefreshMeter, Shown
from asteria_core.refresh.host import host_copies_for
from asteria_core.refresh.outstanding import (
    BlockExchange,
    Delivery,
    Outstanding,
    Refreshes,
)
from asteria_core.refresh.pacing import Pacer
from asteria_core.refresh.pool import WorkerPool
from asteria_core.refresh.ranks import RankExchange
from asteria_core.refresh.schedule import SwapSchedule
from asteria_core.refresh.staging import Staging
from asteria_core.refresh.swaps import Swaps
from asteria_core.refresh.workers import Job, RefreshFn
from asteria_core.telemetry.records import RefreshFigures
from asteria_core.telemetry.reporter import NullReporter, Reporter

__all__ = ["BlockExchange", "Delivery", "Outstanding", "RefreshEngine", "RefreshFailed"]
log = logging.getLogger(__name__)


class RefreshEngine:
    refreshes = Shown()
    work_seconds = Shown()
    computed_seconds = Shown()
    computed_cost = Shown()
    waited_seconds = Shown()
    failures = Shown()
    inline_fallbacks = Shown()
    unchanged = Shown()
    """Its counts (figures.py `Counts`), under the names other modules read."""

    def __init__(self, optimizer: BlockPreconditioner, policy: LivePolicy,
                 reporter: Reporter | None = None, *, fn: RefreshFn = refresh_fn,
                 fallback_fn: RefreshFn = refresh_fn,
                 exchange: BlockExchange | None = None, skip_below: float = 0.0,
                 worker_cpus: frozenset[int] | None = None) -> None:
        """`exchange`: in a data-parallel run, this rank refreshes only the blocks it owns and
        swaps in the others' results, which every rank swaps at the same step. `skip_below`:
        a refresh whose basis moved less than this (1 - the mean |cosine| between a new basis
        vector and the old one it continues) is not swapped in, nor sent; 0 swaps every one.
        `worker_cpus`: the CPUs the workers run on (None: those of the building thread)."""
        self.opt, self.policy, self.skip_below = optimizer, policy, skip_below
        self.reporter = reporter or NullReporter()
        self.worker_cpus = worker_cpus
        self._host = host_copies_for(optimizer)
        # Where a refresh runs (a worker, or inline), its result is checked for NaN and inf
        # there too: a non-finite result arrives as an error. Thread and inline results are
        # pinned for the swap on CUDA; a process's is pickled back (nothing to pin).
        pin = self._host is not None
        self.refresh_fn = fn
        self.fn = partial(checked_refresh, fn, pin_memory=pin)
        self.fallback_fn = partial(checked_refresh, fallback_fn, pin_memory=pin)
        optimizer.external_refresh = True
        self.blocks = {b.key: b for b in optimizer.refresh_blocks()}
        self.pending = Refreshes(self.blocks)
        self.outstanding = self.pending.queues
        self.meter = RefreshMeter(self.blocks)
        self.schedule = SwapSchedule(self.blocks, self.pending)
        self.workers = WorkerPool(self.fn, partial(checked_refresh, fn), worker_cpus)
        self.pacer = Pacer(self)
        self.staging = Staging(self)
        self.swaps = Swaps(self)
        self.exchange = None if exchange is None else RankExchange(self, exchange)
        self.faults = Failures(self.blocks)
        self.figures: RefreshFigures | None = None
        """This boundary's figures, for the step record (set by every `on_boundary`)."""
        self.opt.set_refresh_interval(policy.current.refresh_interval)
        self.workers.apply(policy.current, self.pending, self.run_inline)

    def on_boundary(self, step: int) -> None:
        """Run at the boundary after the optimizer update of `step` (optimizer.num_steps)."""
        self.meter.boundary()
        self.workers.new_boundary()
        policy = self.policy.current
        self.opt.set_refresh_interval(policy.refresh_interval)
        self.workers.apply(policy, self.pending, self.run_inline)
        t = self.opt.num_steps
        self.swaps.due(t, policy)
        self.staging.finished()
        due = self.opt.due_blocks()
        slots = self.schedule.place(due, policy)
        early = {key: self.schedule.early(key, t, slots, policy) for key in due}
        mine = due if self.exchange is None else [k for k in due if self.exchange.owns(k)]
        # Paced, a block's statistics are read when its job is released (pacing.py), not
        # now: its basis is then L = d - V + 1 steps old at its swap, whatever its slot.
        reads = {key: t + slots[key] for key in due if policy.pace and slots.get(key)
                 and self.opt.basis_version(key) > 0}
        later = {key: read - t for key, read in reads.items() if key in mine}
        now = [key for key in mine if key not in later]
        if self.workers.pool is None:  # inline: one snapshot at a time (disk-homed: a copy)
            started = []
            for key in now:
                item = self._start(key, self.opt.snapshot(key, lend=True), t, policy, None,
                                   early)
                if item.first and self.exchange is None:
                    self.swaps.now(item, policy)  # and let it go: one result in memory
                else:
                    started.append(item)
        else:
            snapshots = [self.opt.snapshot(key, lend=True) for key in now]
            ready = None  # no copy at all on a CPU run; on CUDA, copies to the host in flight
            if self._host is not None and snapshots:
                snapshots, ready = self._host(snapshots)
            started = [self._start(snapshot.key, snapshot, t, policy, ready, early)
                       for snapshot in snapshots]
        held = [self._start(key, None, t, policy, None, early) for key in later]
        if self.exchange is not None:
            self.exchange.trade(due, {item.key: item for item in started + held}, t, early)
        for key in due:
            for item in self.outstanding[key]:
                if item.stats_step == t:
                    item.read_step = reads.get(key, t)
        self.pacer.pace([item for item in started if item.job is not None], t, policy)
        for item in held:
            self.pacer.keep(item, t + later[item.key])
        self.pacer.release(t)
        self.swaps.due(t, policy)  # d = 0: this boundary's own refreshes
        self.figures = self.meter.report(
            self.reporter, policy, list(self.staleness(t).values()), self.pending.depth(),
            self.workers.pool, self.workers.deaths, self.schedule.lead(policy))

    def hold_releases(self, hold: bool) -> None:
        """While held, boundaries hand no paced job to the workers (a swap that needs one
        still sends it); releasing sends every job whose boundary has come. For runs paused
        between steps (a benchmark's turns): nothing runs into the pause."""
        self.pacer.hold(hold)

    def staleness(self, t: int) -> dict[BlockKey, int]:
        """Staleness each block will have in step t + 1 (the next step)."""
        return self.pending.staleness(t)

    def reads_done(self, keys: set[BlockKey]) -> bool:
        """Whether every refresh of `keys` that fell due has read its statistics by now (the
        same answer on every rank), so their factors may move to another rank."""
        return self.pending.reads_done(keys, self.opt.num_steps)

    def _start(self, key: BlockKey, snapshot, t: int, policy: Policy, ready,
               early: dict[BlockKey, int]) -> Outstanding:
        """A refresh of `key` fell due at t: computed now (inline), queued for the workers, or,
        with `snapshot` None, held until its release reads the statistics (pacing.py)."""
        item = Outstanding(key, t, None, early=early.get(key, 0),
                           first=self.opt.basis_version(key) == 0)
        if self.workers.pool is not None and policy.swap_mode == SwapMode.OPPORTUNISTIC:
            older = self.pending.coalesce(item)
            if older is not None and older.release_step is not None:  # still held by pacing
                self.pacer.drop(older)
        job = Job(snapshot, self.opt.refresh_config(key),
                  priority=(item.since, self.schedule.tie(key, policy)), ready=ready)
        if self.workers.pool is None and snapshot is not None:
            self.run_inline(item, job)
            if self.schedule.swap_step(item, policy) > t:  # it waits for its swap
                self.staging.stage(item)
        else:
            item.job = job
        self.outstanding[key].append(item)
        return item

    def read(self, job: Job, key: BlockKey) -> None:
        """Read `key`'s statistics into `job` now (a paced job, at its release)."""
        job.snapshot = self.opt.snapshot(key, lend=True)
        if self._host is not None:
            [job.snapshot], job.ready = self._host([job.snapshot])

    def run_inline(self, item: Outstanding, job: Job, fn: RefreshFn | None = None) -> None:
        """Compute `item`'s refresh here, on the training thread."""
        if job.snapshot is None:  # held unread by pacing: its statistics as they are now
            job.snapshot = self.opt.snapshot(item.key, lend=True)
        if job.ready is not None:
            job.ready.synchronize()  # its host copy
        t0 = time.perf_counter()
        try:
            item.result = (fn or self.fn)(job.snapshot, job.config)
        except Exception as err:
            item.error = f"{type(err).__name__}: {err}"
        self.meter.took(item.key, time.perf_counter() - t0)

    def settle(self) -> None:
        """Before a checkpoint: finish every outstanding refresh and hand it to the optimizer
        with its swap step, so the checkpoint holds it and a resumed run swaps it in on time.

        A refresh no worker has started is computed here, on the calling thread (the same
        numbers), so a checkpoint, and a stop, waits only for the refreshes in progress, never
        for a queue or for worker processes that are still starting. In a data-parallel run the
        owner's worker result also travels to the other ranks: there every refresh is awaited."""
        policy = self.policy.current
        self.workers.new_boundary()
        if self.exchange is not None:
            # Every job pacing still holds goes to the workers now: the exchange sends results
            # in swap order, which is not the order of the queues below, and a transfer must
            # not wait for a job that only this loop would have released later.
            for item in list(self.pacer.held):
                self.pacer.dispatch(item)
        for queue_ in self.outstanding.values():
            while queue_:
                item = queue_.popleft()
                job = item.job
                if self.exchange is None and job is not None and job.started_at is None:
                    if item.release_step is not None:  # held by pacing: never submitted
                        self.pacer.drop(item)
                    job.cancelled = True  # no worker takes it now; one that just did is unread
                    item.job = None
                    self.run_inline(item, job)
                self.swaps.finish(item, policy)
                self.staging.stage(item)  # the optimizer holds it until its swap (checkpointed)
                at = self.schedule.swap_step(item, policy)
                if item.result is not None and item.error is None:
                    self.opt.schedule_refresh(max(at, self.opt.num_steps + 1), item.result)

    def close(self) -> None:
        """Join every worker (processes that do not stop are killed)."""
        self.workers.close()
