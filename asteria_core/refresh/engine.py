"""The refresh engine: preconditioner refreshes off the critical path, under bounded staleness.

At each step boundary (after the optimizer update of step t) the engine
1. swaps in every result whose swap step has come: in deterministic mode a round that fell due
   at step s is placed on the V = swap window slots by refresh cost (refresh/schedule.py) and
   the block in slot k is swapped in at s + L + k, L = d - V + 1, fixed when it fell due
   (waiting if late): so no one step carries the whole round's swaps (the moments' rotation,
   on the training thread); V = 1 swaps every block at s + d. In opportunistic mode a result
   is swapped as soon as it is ready. Either way it waits when the next step would otherwise
   use a basis more than S steps behind a refresh that fell due (the bound). A block's first
   refresh (its basis is the initial identity) is swapped in at the boundary it fell due, in
   either mode, as the references do: no step trains in the identity basis (measured: delaying
   it by d = 5 cost 0.09 eval loss at 500 steps, docs/architecture.md);
2. snapshots the blocks whose refresh fell due at step t and queues them for the workers, most
   stale first, then most expensive (d = 0 swaps them at this same boundary). A snapshot copies
   nothing (the optimizer lends its tensors and writes new ones from then on); on CUDA it is
   copied to pinned host memory on a side stream that the workers wait for (refresh/host.py).
   With `pace` on (deterministic mode), the block in slot k is instead read and released to
   the workers at s + k: every step carries about 1/V of the round's work instead of one step
   taking the whole burst, and every basis is L steps old at its swap (pace off: read at s,
   L to d steps old; the swap steps are the same). Opportunistic mode, paced, reads at s and
   releases over min(S, refresh interval) boundaries by cost. A job still held when its swap
   comes is read and released at once;
3. reports staleness, queue depth, background load, failures and waits.

Staleness of a block, as seen by step u, is u - s when a refresh from step s is outstanding
(computed or not, not yet swapped in) and 0 otherwise; it never exceeds the bound S in force.
Workers slower than the refresh interval (wide factors) make the step wait at the bound, as
`refresh_wait`, and never pile work up: in deterministic mode a block has at most
ceil(d / interval) refreshes in flight (each is swapped by s + d, never before the block's
previous one); in opportunistic mode a
block that falls due while its previous refresh still waits for a worker replaces it (fresher
statistics, the older one's deadline), so no block waits for a worker twice.
With `workers = 0` refreshes run inline at their release boundary and wait for the same swap
steps, so inline and worker runs train the same numbers (on one intra-op thread each: more
threads round a matmul differently); with the same d and V = 1 that is the optimizer's own
delayed mode, bit for bit.

Faults: a refresh that raises or returns non-finite values keeps the previous basis and is
counted; `failure_limit` consecutive failures of one block stop the run with `RefreshFailed`.
Hangs: a step that must wait has one deadline, `refresh_timeout_ms` after it began waiting, for
all its late refreshes together (pushed on by a timeout each time a refresh it waited for
arrives: the workers are then working). Past it, a refresh no worker has taken up, and one whose
worker process has used no CPU for a timeout (stopped, or stuck), is abandoned (the process is
killed and replaced) and computed inline at once, counted as an inline fallback. A refresh a
worker computes is waited for until HANG_FACTOR times the longer of that timeout and its
expected time (the median seconds per b^3 of the last RATE_SAMPLES refreshes, times its b^3)
from its start: an 8192-wide block's refresh takes a minute or more on one core, and abandoning
it would only compute it again on the training thread. A median, not the slowest ever: one
refresh slowed by a stopped worker would otherwise stretch that allowance for the rest of the
run; it leaves the window after RATE_SAMPLES refreshes and never moves the median alone.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from asteria_core.optim.base import BlockPreconditioner
from asteria_core.optim.matrix_functions import basis_change
from asteria_core.optim.seam import BlockKey, RefreshResult, checked_refresh, refresh_fn
from asteria_core.policy import LivePolicy, Policy, Priority, SwapMode, WorkerKind
from asteria_core.refresh.host import host_copies_for
from asteria_core.refresh.schedule import share_out, swap_window
from asteria_core.refresh.workers import Job, RefreshFn, make_pool
from asteria_core.telemetry.labels import IdleCause
from asteria_core.telemetry.records import RefreshFigures
from asteria_core.telemetry.reporter import NullReporter, Reporter

log = logging.getLogger(__name__)
HANG_FACTOR = 4
"""A running refresh is hung after this many times its allowance (see the module docstring)."""
RATE_SAMPLES = 32
"""Refreshes the expected seconds per b^3 (the hang allowance's) is the median of."""
LATENCY_SAMPLES = 64
"""Refreshes the latency figure is taken over (`RefreshFigures.refresh_latency_steps`)."""
STEP_SAMPLES = 32
"""Boundary intervals the step time (`step_seconds`, the duty's denominator) is the median of:
robust to the odd long one (an evaluation, a checkpoint, a paused benchmark turn)."""


class RefreshFailed(RuntimeError):
    """A block's refresh failed `failure_limit` times in a row; the run stops."""


class Delivery(Protocol):
    """A refresh result on its way from the block's owner rank (asteria_core.distributed)."""

    owner: int
    result: RefreshResult | None
    error: str | None
    unchanged: bool
    """The owner found the new basis barely moved: every rank keeps the one in use."""
    done: threading.Event


Outcome = tuple[RefreshResult | None, str | None, bool]
"""(result, error, unchanged) of a refresh: unchanged when its basis barely moved."""


class BlockExchange(Protocol):
    """Data-parallel runs: which blocks this rank refreshes, and the results of the others.
    Every rank calls `offer` / `expect` for the same blocks in the same order."""

    def owns(self, key: BlockKey) -> bool: ...

    def offer(self, key: BlockKey, stats_step: int, size: int,
              outcome: Callable[[], Outcome | None]) -> None:
        """This rank's refresh of `key`: send its outcome (polled until known) to every rank."""
        ...

    def expect(self, key: BlockKey, stats_step: int, size: int) -> Delivery: ...


@dataclass(eq=False)
class Outstanding:
    """A refresh that fell due and is not swapped in yet."""

    key: BlockKey
    stats_step: int
    job: Job | None
    """None for an inline refresh (workers = 0), whose result is already in `result`."""
    result: RefreshResult | None = None
    error: str | None = None
    release_step: int | None = None
    """While held back by pacing: the boundary at which the job goes to the workers."""
    delivery: Delivery | None = None
    """Data-parallel: the result of a block another rank owns, on its way here."""
    unchanged: bool | None = None
    """Whether the new basis barely moved (`skip_below`), decided once its result is known."""
    since: int = -1
    """The step since which this block's refresh is due: `stats_step`, or, when this refresh
    replaced older ones that were still waiting for a worker (opportunistic mode), the oldest
    one's. Staleness and the bound count from it."""
    staged: bool = False
    """Its result was taken from the job and staged where the block's state lives (`_stage`)."""
    first: bool = False
    """The block's first refresh (its basis is the initial identity): swapped in at its own
    boundary, whatever d, S or the mode, as the references do."""
    early: int = 0
    """Deterministic mode: how many boundaries before stats_step + d it is swapped (its place
    in the round's swap window)."""
    released: int | None = None
    """The boundary its job went to the workers at (for its latency in steps)."""
    read_step: int = 0
    """The boundary its statistics are read at on the owner (pacing: its slot's), recorded on
    every rank."""

    def __post_init__(self) -> None:
        if self.since < 0:
            self.since = self.stats_step


class RefreshEngine:
    def __init__(self, optimizer: BlockPreconditioner, policy: LivePolicy,
                 reporter: Reporter | None = None, *, fn: RefreshFn = refresh_fn,
                 fallback_fn: RefreshFn = refresh_fn,
                 exchange: BlockExchange | None = None, skip_below: float = 0.0,
                 worker_cpus: frozenset[int] | None = None) -> None:
        """`exchange`: in a data-parallel run, this rank refreshes only the blocks it owns and
        swaps in the others' results, which every rank swaps at the same step. `worker_cpus`:
        the CPUs the workers run on (None: those of the thread that builds the engine)."""
        self.opt = optimizer
        self.policy = policy
        self.exchange = exchange
        self.skip_below = skip_below
        """Selective coherence: a refresh whose basis moved less than this (1 - the mean
        |cosine| between a new basis vector and the old one it continues) is not swapped in,
        and in a data-parallel run not sent; 0 swaps every refresh."""
        self.unchanged = 0
        """Refreshes skipped so far because their basis barely moved."""
        self.reporter = reporter or NullReporter()
        self.worker_cpus = worker_cpus
        self._host = host_copies_for(optimizer)
        """CUDA: copies snapshots to the host workers off the training stream (refresh/host)."""
        # Where a refresh runs (a worker, or inline when workers = 0), its result is checked
        # for NaN and inf there too: a non-finite result arrives as an error.
        pin = self._host is not None
        self.refresh_fn = fn
        """The refresh math it was given (the seam)."""
        self.fn = partial(checked_refresh, fn, pin_memory=pin)
        """Runs a refresh on a thread worker or inline (results pinned for the swap on CUDA)."""
        self._process_fn = partial(checked_refresh, fn)
        """Runs a refresh in a worker process, whose result is pickled back (nothing to pin)."""
        self.fallback_fn = partial(checked_refresh, fallback_fn, pin_memory=pin)
        """Computes a refresh inline when its worker hung past the timeout."""
        optimizer.external_refresh = True
        self.blocks = {b.key: b for b in optimizer.refresh_blocks()}
        self.outstanding: dict[BlockKey, deque[Outstanding]] = {k: deque() for k in self.blocks}
        self._position = {key: i for i, key in enumerate(self.blocks)}  # fifo's order
        self.failures = 0
        self.inline_fallbacks = 0
        self.refreshes = 0
        """Refreshes this rank computed and swapped in (or failed), and their worker seconds."""
        self.work_seconds = 0.0
        self.computed_seconds = 0.0
        self.computed_cost = 0.0
        """Cost (b^3) of the refreshes in `computed_seconds`: their ratio is this rank's
        refresh speed (distributed/rebalance.py reads it)."""
        """Seconds of every refresh computed so far, swapped in yet or not (work_seconds counts
        those swapped in)."""
        self.waited_seconds = 0.0
        self._consecutive: dict[BlockKey, int] = dict.fromkeys(self.blocks, 0)
        self._refresh_seconds: dict[BlockKey, float] = {}
        self._round_seconds = 0.0
        """Sum of `_refresh_seconds`: one round's work, kept as it changes (not summed over
        every block at every boundary)."""
        self._rates: deque[float] = deque(maxlen=RATE_SAMPLES)
        """Seconds per unit of cost (b^3) of the last refreshes: a block's expected refresh
        time is their median times its cost."""
        self._deadline: float | None = None
        self._busy_mark: tuple | None = None
        """(pool, its busy seconds, when) at the last boundary (`_busy_ratio`)."""
        """When this boundary's waits for late refreshes end (`_await`); None before one."""
        self._pool = None
        self._pool_spec: tuple | None = None
        self._retired: list = []
        self._held: dict[Outstanding, None] = {}
        """Jobs pacing holds back, in order (a dict: dropping one costs O(1), not a scan)."""
        self._last_boundary: float | None = None
        self._step_walls: deque[float] = deque(maxlen=STEP_SAMPLES)
        """The last steps' own wall times: boundary to boundary, less their refresh waits."""
        self._waited_before = 0.0
        """`waited_seconds` when the last boundary began."""
        self._mode = ""
        self.figures: RefreshFigures | None = None
        """This boundary's figures, for the step record (set by every `on_boundary`)."""
        self._latencies: deque[int] = deque(maxlen=LATENCY_SAMPLES)
        """Steps from release to ready of this rank's last refreshes on workers."""
        self._window_spec: tuple | None = None
        self._window_v = 1
        """V (`_window`) and the policy fields it was worked out for."""
        self._apply_policy(policy.current)

    # ------------------------------------------------------------------ the boundary
    def on_boundary(self, step: int) -> None:
        """Run at the boundary after the optimizer update of `step` (optimizer.num_steps)."""
        now = time.perf_counter()
        if self._last_boundary is not None:
            waited = self.waited_seconds - self._waited_before
            self._step_walls.append(max(now - self._last_boundary - waited, 0.0))
        self._last_boundary, self._waited_before = now, self.waited_seconds
        self._deadline = None
        policy = self.policy.current
        self._apply_policy(policy)
        t = self.opt.num_steps
        self._swap_due(t, policy)
        self._stage_finished()
        due = self.opt.due_blocks()
        slots = self._place(due, policy)
        early = {key: self._early(key, t, slots, policy) for key in due}
        mine = due if self.exchange is None else [k for k in due if self.exchange.owns(k)]
        # Paced, a block's statistics are read when its job is released (`_dispatch`), not
        # now: its basis is then L = d - V + 1 steps old at its swap, whatever its slot.
        reads = {key: t + slots[key] for key in due if policy.pace and slots.get(key)
                 and self.opt.basis_version(key) > 0}
        later = {key: read - t for key, read in reads.items() if key in mine}
        now = [key for key in mine if key not in later]
        if self._pool is None:  # inline: one snapshot at a time (a disk-homed one is a copy)
            started = []
            for key in now:
                item = self._start(key, self.opt.snapshot(key, lend=True), t, policy, None,
                                   early)
                if item.first and self.exchange is None:
                    self._swap_now(item, policy)  # and let it go: one result in memory
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
            self._exchange(due, {item.key: item for item in started + held}, t, early)
        for key in due:
            for item in self.outstanding[key]:
                if item.stats_step == t:
                    item.read_step = reads.get(key, t)
        self._pace([item for item in started if item.job is not None], t, policy)
        for item in held:
            self._hold(item, t + later[item.key])
        self._release(t)
        self._swap_due(t, policy)  # d = 0: this boundary's own refreshes
        self._report(t, policy)

    def _apply_policy(self, policy: Policy) -> None:
        self.opt.set_refresh_interval(policy.refresh_interval)
        spec = (policy.workers, policy.worker_kind, policy.worker_threads, policy.worker_nice)
        if spec == self._pool_spec:
            return
        old, self._pool_spec = self._pool, spec
        fn = self._process_fn if policy.worker_kind == WorkerKind.PROCESS else self.fn
        self._pool = None if policy.workers == 0 else make_pool(
            policy.worker_kind, policy.workers, fn, policy.worker_threads, policy.worker_nice,
            self.worker_cpus)
        if old is not None:
            # Running jobs finish on the old pool; queued ones move to the new one.
            for item in self._all_outstanding():
                job = item.job
                if job is None or job.started_at is not None:
                    continue
                if item.release_step is not None:
                    continue  # held by pacing: goes to the new pool (or inline) when released
                old.abandon(job)
                if self._pool is None:  # now inline: compute it here
                    item.job = None
                    self._run_inline(item, job)
                else:
                    item.job = Job(job.snapshot, job.config, job.priority, ready=job.ready)
                    self._pool.submit(item.job)
            old.retire()  # it stops once its running jobs are done: a change can be undone
            self._retired.append(old)

    def _tie(self, key: BlockKey, policy: Policy) -> float:
        """Queue order among blocks equally stale: stale_then_cost, most expensive first;
        fifo, as due."""
        return -self.blocks[key].cost if policy.priority == Priority.STALE_THEN_COST else \
            self._position[key]

    def _window(self, policy: Policy) -> int:
        """V: the boundaries a deterministic round is placed on (refresh/schedule.py), from
        the policy and the blocks' costs, in queue order: the same on every rank."""
        spec = (policy.delay, policy.swap_window, policy.refresh_interval, policy.priority)
        if self._window_spec != spec:
            ordered = sorted(self.blocks, key=lambda key: self._tie(key, policy))
            self._window_spec = spec
            self._window_v = swap_window(policy.delay, policy.swap_window,
                                         policy.refresh_interval,
                                         [self.blocks[k].cost for k in ordered])
        return self._window_v

    def _place(self, due, policy: Policy) -> dict[BlockKey, int]:
        """Deterministic mode: each due block's slot k in 0 .. V-1, by refresh cost in queue
        order (`share_out`): read and released at s + k when paced, swapped at
        s + d - V + 1 + k. So a block released early is swapped early, every boundary of the
        window carries about 1/V of the round's work and swaps, and each basis is d - V + 1
        steps old at its swap. The same on every rank and with or without workers: it depends
        on the blocks and the policy only."""
        if policy.swap_mode != SwapMode.DETERMINISTIC or not due:
            return {}
        window = self._window(policy)
        if window <= 1:
            return dict.fromkeys(due, 0)
        ordered = sorted(due, key=lambda key: self._tie(key, policy))
        return share_out(ordered, [self.blocks[k].cost for k in ordered], window)

    def _early(self, key: BlockKey, t: int, slots: dict[BlockKey, int],
               policy: Policy) -> int:
        """How many boundaries before s + d `key` is swapped (V - 1 - its slot), never before
        the swap of its refresh
        still in flight (after a live change of the window, a newer round could otherwise
        place it earlier): s - early never decreases along a block's queue, so its refreshes
        are swapped in the order they fell due, here and in a checkpoint's pending list."""
        early = self._window(policy) - 1 - slots[key] if slots else 0
        queue_ = self.outstanding[key]
        if not queue_:
            return early
        last = queue_[-1]
        return min(early, last.early + t - last.stats_step)

    def _swap_step(self, item: Outstanding, policy: Policy) -> int:
        """The boundary at which a deterministic refresh is swapped (d read as it is now); a
        block's first basis at once."""
        if item.first:
            return item.stats_step
        return item.stats_step + max(policy.delay - item.early, 0)

    def _start(self, key: BlockKey, snapshot, t: int, policy: Policy, ready,
               early: dict[BlockKey, int]) -> Outstanding:
        """A refresh of `key` fell due at t: computed now (inline), queued for the workers, or,
        with `snapshot` None, held until its release reads the statistics (`_hold`)."""
        item = Outstanding(key, t, None, early=early.get(key, 0),
                           first=self.opt.basis_version(key) == 0)
        if self._pool is not None and policy.swap_mode == SwapMode.OPPORTUNISTIC:
            self._coalesce(item)
        job = Job(snapshot, self.opt.refresh_config(key),
                  priority=(item.since, self._tie(key, policy)), ready=ready)
        if self._pool is None and snapshot is not None:
            self._run_inline(item, job)
            if self._swap_step(item, policy) > t:  # it waits for its swap
                self._stage(item)
        else:
            item.job = job
        self.outstanding[key].append(item)
        return item

    def _stage(self, item: Outstanding) -> None:
        """A result that waits for its swap goes where its block's state lives: a block homed
        on disk keeps it in a file of the disk tier (tiers/results.py), not in memory."""
        if item.staged or not self._stages(item.key):
            return
        job = item.job
        if job is not None:  # a worker's: decide `unchanged` from its snapshot, then take it
            if not job.done.is_set():
                return
            self._barely_moved(item, job.result)
            item.result, item.error = job.result, job.error
            self._took(item.key, job.seconds)
            self._ready(item, job)
            job.result = None
        item.staged = True
        if item.result is not None:
            item.result = self.opt.residency.stage_result(item.result)

    def _stages(self, key: BlockKey) -> bool:
        """Whether `key`'s results wait in a file: its state lives on disk (a tier store)."""
        stages = getattr(self.opt.residency, "stages_results", None)
        return stages is not None and stages(key.param)

    def _stage_finished(self) -> None:
        """Results workers finished since the last boundary, staged (see `_stage`)."""
        for queue_ in self.outstanding.values():
            for item in queue_:
                if item.job is not None and not item.staged and item.job.done.is_set():
                    self._stage(item)

    def _coalesce(self, item: Outstanding) -> None:
        """Opportunistic mode: a refresh of the block still waiting for a worker is dropped for
        the new one (fresher statistics, the same work), which keeps its place in the queue and
        its deadline. So a block never waits for a worker twice, and workers slower than the
        refresh interval do not pile up refreshes that a newer one would replace anyway.
        (Deterministic mode swaps every refresh at its own step, by s + d, so each one is
        needed; a block then has at most ceil(d / interval) in flight.)"""
        queue_ = self.outstanding[item.key]
        older = queue_[-1] if queue_ else None
        if older is None or older.job is None or older.job.started_at is not None \
                or older.job.done.is_set():
            return
        queue_.pop()
        older.job.cancelled = True  # no worker takes it now; one that just did is not read
        if older.release_step is not None:  # still held back by pacing
            del self._held[older]
        item.since = older.since

    def _exchange(self, due, started: dict[BlockKey, Outstanding], t: int,
                  early: dict[BlockKey, int]) -> None:
        """Offer this rank's refreshes and expect the others', in the order of their swaps
        (then `due` order): the same on every rank, and the transfers, sent one at a time in
        that order, arrive in the order the swaps need them."""
        for key in sorted(due, key=lambda key: -early.get(key, 0)):
            size = self.blocks[key].size
            item = started.get(key)
            if item is not None:
                self.exchange.offer(key, t, size, partial(self._outcome, item))
            else:
                item = Outstanding(key, t, None, delivery=self.exchange.expect(key, t, size),
                                   early=early[key], first=self.opt.basis_version(key) == 0)
                self.outstanding[key].append(item)

    def _outcome(self, item: Outstanding) -> Outcome | None:
        """(result, error, unchanged) of this rank's refresh once known, from any thread."""
        if item.result is not None or item.error is not None:
            result, error = item.result, item.error
        elif item.job is not None and item.job.done.is_set():
            result, error = item.job.result, item.job.error
        else:
            return None
        return result, error, self._barely_moved(item, result)

    def _barely_moved(self, item: Outstanding, result: RefreshResult | None) -> bool:
        """Decided once per refresh, from its own snapshot (the same answer on any thread)."""
        if item.unchanged is None:
            job = item.job
            basis = None if job is None else job.snapshot.basis
            item.unchanged = bool(self.skip_below and result is not None and basis is not None
                                  and basis_change(basis, result) < self.skip_below)
        return item.unchanged

    def _pace(self, items: list[Outstanding], t: int, policy: Policy) -> None:
        """Jobs whose statistics were read at this boundary. First bases are swapped here:
        their jobs go to the workers at once, together (on a data-parallel rank a held one could
        wait behind another owner's delivery that waits for it), as does every job with pace
        off. Opportunistic mode, paced: release boundaries t .. t+W-1 (W = min(S, refresh
        interval)), about equal cost each (`share_out`, in queue order). Deterministic mode
        holds its paced jobs unread instead (`on_boundary`)."""
        for item in items:
            if item.first:  # in the order they are swapped: results wait for it the least
                item.job.priority = (item.since, self._position[item.key])
                item.released = t
                self._pool.submit(item.job)
        items = sorted((item for item in items if not item.first),
                       key=lambda item: item.job.priority)
        window = 1
        if policy.pace and policy.swap_mode == SwapMode.OPPORTUNISTIC:
            window = max(1, min(policy.staleness_bound, policy.refresh_interval))
        slots = share_out(items, [self.blocks[item.key].cost for item in items], window)
        for item in items:
            self._hold(item, t + slots[item])

    def _hold(self, item: Outstanding, release: int) -> None:
        """`item`'s job goes out at boundary `release` (`_release`; this one's at its end).
        A worker still busy with an earlier boundary's jobs takes them before a later one's,
        however expensive: the order the swap window was filled in."""
        item.release_step = release
        since, tie = item.job.priority
        item.job.priority = (since, release, tie)
        self._held[item] = None

    def reads_done(self, keys: set[BlockKey]) -> bool:
        """Whether every refresh of `keys` that fell due has read its statistics by now (the
        same answer on every rank: read steps follow from the blocks and the policy), so
        their factors may move to another rank (distributed/rebalance.py)."""
        t = self.opt.num_steps
        return not any(item.read_step > t for key in keys for item in self.outstanding[key])

    def _read(self, job: Job, key: BlockKey) -> None:
        job.snapshot = self.opt.snapshot(key, lend=True)
        if self._host is not None:
            [job.snapshot], job.ready = self._host([job.snapshot])

    def _release(self, t: int) -> None:
        for item in [i for i in self._held if i.release_step <= t]:
            self._dispatch(item)

    def _dispatch(self, item: Outstanding) -> None:
        """A held job goes out: its statistics are read now if they were not, then it goes to
        the workers, or with none is computed here (and staged when its swap is later)."""
        del self._held[item]
        item.release_step = None
        job = item.job
        if job.snapshot is None:
            self._read(job, item.key)
        job.submitted_at = time.perf_counter()
        if self._pool is not None:
            item.released = self.opt.num_steps
            self._pool.submit(job)
            return
        item.job = None
        self._run_inline(item, job)
        if self._swap_step(item, self.policy.current) > self.opt.num_steps:
            self._stage(item)

    def _run_inline(self, item: Outstanding, job: Job, fn: RefreshFn | None = None) -> None:
        if job.snapshot is None:  # held unread by pacing: its statistics as they are now
            job.snapshot = self.opt.snapshot(item.key, lend=True)
        if job.ready is not None:
            job.ready.synchronize()  # its host copy
        t0 = time.perf_counter()
        try:
            item.result = (fn or self.fn)(job.snapshot, job.config)
        except Exception as err:
            item.error = f"{type(err).__name__}: {err}"
        self._took(item.key, time.perf_counter() - t0)

    def _took(self, key: BlockKey, seconds: float) -> None:
        """The last refresh of `key` took `seconds` (its share of a round's work)."""
        self._round_seconds += seconds - self._refresh_seconds.get(key, 0.0)
        self.computed_seconds += seconds
        self.computed_cost += self.blocks[key].cost
        self._refresh_seconds[key] = seconds
        self._rates.append(seconds / self.blocks[key].cost)

    def _expected(self, key: BlockKey) -> float:
        """Seconds a refresh of `key` is expected to take (0 before any finished)."""
        return statistics.median(self._rates) * self.blocks[key].cost if self._rates else 0.0

    def _swap_now(self, item: Outstanding, policy: Policy) -> None:
        """Swap a first basis computed inline at once, before the next block's is computed.
        One process only: on data-parallel ranks every swap of a boundary goes in block order
        (`_swap_due`), the same on every rank, so replicas multiply alike."""
        queue_ = self.outstanding[item.key]
        if queue_ and queue_[0] is item:
            queue_.popleft()
            self._finish(item, policy)
            self._swap(item, policy)

    def _swap_due(self, t: int, policy: Policy) -> None:
        for queue_ in self.outstanding.values():
            while queue_:
                item = queue_[0]
                must = t >= self._swap_step(item, policy)
                if policy.swap_mode == SwapMode.OPPORTUNISTIC:
                    ready = item.release_step is None and (item.job is None
                                                           or item.job.done.is_set())
                    must = item.first or t >= item.since + policy.staleness_bound
                    if not (ready or must):
                        break
                elif not must:
                    break
                self._finish(item, policy)
                queue_.popleft()
                self._swap(item, policy)

    def _finish(self, item: Outstanding, policy: Policy) -> None:
        """Make sure `item` has a result or an error, waiting (refresh_wait) if it must."""
        if item.delivery is not None:
            self._receive(item, policy)
            return
        if item.release_step is not None:
            self._dispatch(item)  # still held by pacing: its swap has come
        job = item.job
        if job is None or item.staged:
            return  # computed inline, or staged: result or error is already there
        if not job.done.is_set():
            t0 = time.perf_counter()
            with self.reporter.wait(IdleCause.REFRESH_WAIT):
                finished = self._await(job, item.key, policy)
                if not finished:
                    log.warning("refresh of %s not done %.1f s after the bound; computing it "
                                "inline", item.key, time.perf_counter() - t0)
                    self._abandon(job)
                    self.inline_fallbacks += 1
                    self._run_inline(item, job, self.fallback_fn)
            self.waited_seconds += time.perf_counter() - t0
            if not finished:
                return
        item.result, item.error = job.result, job.error
        self._took(item.key, job.seconds)
        self._ready(item, job)

    def _ready(self, item: Outstanding, job: Job) -> None:
        """A worker's result is taken: how many steps of the usual length (`step_seconds`) it
        took from its release to being ready (1: ready for the next boundary). Counted in
        boundaries instead, a result the step waited for would read as ready at its swap,
        however late it was: never above the lead that it overran."""
        step = self.step_seconds
        if item.released is None or job.finished_at is None or not step:
            return
        took = job.finished_at - job.submitted_at
        self._latencies.append(max(math.ceil(took / step - 1e-9), 1))

    def latency_steps(self) -> int | None:
        """90th percentile of `_latencies` (nearest rank), None before any."""
        if not self._latencies:
            return None
        ordered = sorted(self._latencies)
        return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]

    def _await(self, job: Job, key: BlockKey, policy: Policy) -> bool:
        """Wait for `job` at the bound, until this boundary's deadline (one timeout after its
        first wait, for every late refresh together); past it, on while a worker computes it,
        until HANG_FACTOR times the longer of the timeout and its expected time after its
        start. False: it looks hung (never taken up, or its process is stalled): compute it
        here, at once."""
        timeout = policy.refresh_timeout_ms / 1e3
        if self._deadline is None:
            self._deadline = time.perf_counter() + timeout
        deadline = self._deadline
        while not job.done.wait(max(0.0, deadline - time.perf_counter())):
            if job.started_at is None:
                return False  # the workers never took it up: compute it here
            now = time.perf_counter()
            stalled = self._stalled(job)
            if stalled is not None and stalled >= timeout:
                return False  # its process is stopped or stuck: killed, and computed here
            running = job.started_at + HANG_FACTOR * max(timeout, self._expected(key))
            if running <= now:
                return False
            deadline = running if stalled is None else min(running, now + max(
                timeout - stalled, 0.05))
        # It arrived: the workers work, so the refreshes behind it get a timeout from here.
        self._deadline = max(self._deadline, time.perf_counter() + timeout)
        return True

    def _stalled(self, job: Job) -> float | None:
        """Seconds the worker process running `job` has used no CPU (None: not known)."""
        for pool in (self._pool, *self._retired):
            if pool is not None and (stalled := pool.stalled(job)) is not None:
                return stalled
        return None

    def _receive(self, item: Outstanding, policy: Policy) -> None:
        """Another rank's result, waited for (sync_wait) if it has not arrived by its swap."""
        delivery = item.delivery
        if not delivery.done.is_set():
            t0 = time.perf_counter()
            with self.reporter.wait(IdleCause.SYNC_WAIT):
                arrived = delivery.done.wait(policy.refresh_timeout_ms / 1e3)
            self.waited_seconds += time.perf_counter() - t0
            if not arrived:
                raise RuntimeError(
                    f"rank {delivery.owner} did not deliver its refresh of block "
                    f"{tuple(item.key)} (statistics of step {item.stats_step}) within "
                    f"refresh_timeout_ms ({policy.refresh_timeout_ms} ms); stopping")
        item.result, item.error = delivery.result, delivery.error
        item.unchanged = delivery.unchanged

    def _abandon(self, job: Job) -> None:
        for pool in (self._pool, *self._retired):
            if pool is not None:
                pool.abandon(job)

    def _swap(self, item: Outstanding, policy: Policy) -> None:
        ok = item.result is not None and item.error is None
        if item.delivery is None and ok:
            self._barely_moved(item, item.result)
        if item.unchanged:  # every rank keeps the basis in use: no swap, no failure
            self.unchanged += 1
            self._consecutive[item.key] = 0
            if item.delivery is None:
                self.refreshes += 1
                self.work_seconds += self._refresh_seconds.get(item.key, 0.0)
            return
        if item.delivery is None:  # this rank's own refresh: its work counts here
            seconds = self._refresh_seconds.get(item.key, 0.0)
            self.reporter.refresh_done(seconds)
            self.refreshes += 1
            self.work_seconds += seconds
        if ok:
            result = item.result
            if self.exchange is not None and result.rotation is not None:
                # The other ranks receive no rotation and compute it at their swap: so does
                # the owner, so every replica multiplies the same way (same bits).
                result = dataclasses.replace(result, rotation=None)
            self.opt.apply_refresh(item.key, result)
            self._consecutive[item.key] = 0
            return
        self.failures += 1
        self._consecutive[item.key] += 1
        why = (item.error or "non-finite values in the result").strip().splitlines()[-1]
        log.warning("refresh of block %s from step %d failed (%s); keeping the previous basis",
                    item.key, item.stats_step, why)
        if self._consecutive[item.key] >= policy.failure_limit:
            raise RefreshFailed(f"refresh of block {tuple(item.key)} failed "
                                f"{self._consecutive[item.key]} times in a row (failure_limit "
                                f"{policy.failure_limit}); last error: {why}")

    # ------------------------------------------------------------------ figures
    def staleness(self, t: int) -> dict[BlockKey, int]:
        """Staleness each block will have in step t + 1 (the next step)."""
        return {k: (t + 1 - q[0].since) if q else 0 for k, q in self.outstanding.items()}

    @property
    def step_seconds(self) -> float:
        """A step's own time: the median over the last STEP_SAMPLES steps of the wall time
        between boundaries less the refreshes waited for (this rank's, another rank's), 0
        before two boundaries. What the workers' capacity is measured against: with the
        waits in, a step that waits for the workers would stretch the interval its duty is
        measured over, and the duty would read about 1 however far behind they are."""
        return statistics.median(self._step_walls) if self._step_walls else 0.0

    def background_load(self, policy: Policy) -> float | None:
        """A round's refresh work / the workers' time in one interval of steps at their own
        time (`step_seconds`); above 1 the workers cannot keep up and steps wait."""
        step = self.step_seconds
        if policy.workers == 0 or not step or not self._refresh_seconds:
            return None
        return self._round_seconds / (policy.workers * policy.refresh_interval * step)

    def _report(self, t: int, policy: Policy) -> None:
        stale = list(self.staleness(t).values())
        depth = sum(1 for item in self._all_outstanding()
                    if item.job is not None and not item.job.done.is_set())
        busy = self._busy_ratio()
        load = self.background_load(policy)
        self.reporter.set_staleness(stale)
        mode = "native" if policy.workers == 0 else f"async-{policy.swap_mode}"
        if mode != self._mode:
            self._mode = mode
            self.reporter.set_mode(mode)
        self.figures = RefreshFigures(
            staleness_max=max(stale, default=0), staleness_bound=policy.staleness_bound,
            queue_depth=depth, background_load=load, workers_busy_ratio=busy,
            failures=self.failures, inline_fallbacks=self.inline_fallbacks,
            worker_deaths=sum(p.deaths for p in (self._pool, *self._retired) if p is not None),
            swap_lead=(policy.delay - self._window(policy) + 1
                       if policy.swap_mode == SwapMode.DETERMINISTIC else None),
            refresh_latency_steps=self.latency_steps())

    def _busy_ratio(self) -> float | None:
        """The share of the workers' time since the last boundary spent in jobs (None inline).
        Measured over the interval, not looked at the boundary: there the workers are
        between jobs (those released now not yet taken up), and a look reads 0 however busy
        they were."""
        pool = self._pool
        if pool is None:
            self._busy_mark = None
            return None
        mark = (pool, pool.busy_seconds(), time.perf_counter())
        last, self._busy_mark = self._busy_mark, mark
        if last is None or last[0] is not pool or mark[2] <= last[2]:
            return None  # a new pool: nothing measured yet
        return min((mark[1] - last[1]) / (pool.size * (mark[2] - last[2])), 1.0)

    def _all_outstanding(self):
        for queue_ in self.outstanding.values():
            yield from queue_

    # ------------------------------------------------------------------ checkpoints, shutdown
    def settle(self) -> None:
        """Before a checkpoint: finish every outstanding refresh and hand it to the optimizer
        with its swap step, so the checkpoint holds it and a resumed run swaps it in on time.

        A refresh no worker has started is computed here, on the calling thread (the same
        numbers), so a checkpoint, and a stop, waits only for the refreshes in progress, never
        for a queue or for worker processes that are still starting. In a data-parallel run the
        owner's worker result also travels to the other ranks: there every refresh is awaited."""
        policy = self.policy.current
        self._deadline = None
        if self.exchange is not None:
            # Every job pacing still holds goes to the workers now: the exchange sends results
            # in swap order, which is not the order of the queues below, and a transfer must
            # not wait for a job that only this loop would have released later.
            for item in list(self._held):
                self._dispatch(item)
        for queue_ in self.outstanding.values():
            while queue_:
                item = queue_.popleft()
                job = item.job
                if self.exchange is None and job is not None and job.started_at is None:
                    if item.release_step is not None:  # held by pacing: never submitted
                        del self._held[item]
                        item.release_step = None
                    job.cancelled = True  # no worker takes it now; one that just did is unread
                    item.job = None
                    self._run_inline(item, job)
                self._finish(item, policy)
                self._stage(item)  # the optimizer holds it until its swap (and checkpoints it)
                at = self._swap_step(item, policy)
                if item.result is not None and item.error is None:
                    self.opt.schedule_refresh(max(at, self.opt.num_steps + 1), item.result)

    def close(self) -> None:
        """Join every worker (processes that do not stop are killed)."""
        left = []
        for pool in (self._pool, *self._retired):
            if pool is not None:
                left += pool.close()
        self._pool, self._retired, self._pool_spec = None, [], None
        if left:
            log.warning("refresh workers still running at shutdown: %s", ", ".join(left))
