"""The engine's workers: the pool the policy asks for, and what is done when a refresh hangs.

A policy change of the workers' number, kind, threads or niceness builds a new pool at the
boundary; the old one is retired (its running jobs finish, its queued ones move to the new pool,
or are computed inline when there is none now), so a change can be undone at once.

Hangs: a step that must wait has one deadline, `refresh_timeout_ms` after it began waiting, for
all its late refreshes together (pushed on by a timeout each time a refresh it waited for
arrives: the workers are then working). Past it, a refresh no worker has taken up, and one whose
worker process has used no CPU for a timeout (stopped, or stuck), counts as hung: the caller
abandons it (the process is killed and replaced) and computes it inline, at once. A refresh a
worker computes is waited for until HANG_FACTOR times the longer of that timeout and its
expected time (figures.py: the median recent seconds per b^3, times its b^3) from its start: an
8192-wide block's refresh takes a minute or more on one core, and abandoning it would only
compute it again on the training thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from asteria_core.policy import Policy, WorkerKind
from asteria_core.refresh.outstanding import Outstanding
from asteria_core.refresh.workers import Job, RefreshFn, make_pool

log = logging.getLogger(__name__)
HANG_FACTOR = 4
"""A running refresh is hung after this many times its allowance (see the module docstring)."""


class WorkerPool:
    """The current pool (`pool`, None for inline refreshes) and the ones a change retired."""

    def __init__(self, thread_fn: RefreshFn, process_fn: RefreshFn,
                 cpus: frozenset[int] | None) -> None:
        self._thread_fn, self._process_fn, self.cpus = thread_fn, process_fn, cpus
        self.pool = None
        self._spec: tuple | None = None
        self._retired: list = []
        self._deadline: float | None = None
        """When this boundary's waits for late refreshes end (`wait`); None before one."""

    def apply(self, policy: Policy, items: Iterable[Outstanding],
              run_inline: Callable[[Outstanding, Job], None]) -> None:
        """The pool `policy` asks for; queued jobs of `items` move to it (or run inline)."""
        spec = (policy.workers, policy.worker_kind, policy.worker_threads, policy.worker_nice)
        if spec == self._spec:
            return
        old, self._spec = self.pool, spec
        fn = self._process_fn if policy.worker_kind == WorkerKind.PROCESS else self._thread_fn
        self.pool = None if policy.workers == 0 else make_pool(
            policy.worker_kind, policy.workers, fn, policy.worker_threads, policy.worker_nice,
            self.cpus)
        if old is None:
            return
        # Running jobs finish on the old pool; queued ones move to the new one.
        for item in items:
            job = item.job
            if job is None or job.started_at is not None:
                continue
            if item.release_step is not None:
                continue  # held by pacing: goes to the new pool (or inline) when released
            old.abandon(job)
            if self.pool is None:  # now inline: compute it here
                item.job = None
                run_inline(item, job)
            else:
                item.job = Job(job.snapshot, job.config, job.priority, ready=job.ready)
                self.pool.submit(item.job)
        old.retire()  # it stops once its running jobs are done: a change can be undone
        self._retired.append(old)

    def _pools(self) -> list:
        return [p for p in (self.pool, *self._retired) if p is not None]

    def new_boundary(self) -> None:
        """A boundary (or a settle) begins: its waits get a deadline of their own."""
        self._deadline = None

    def wait(self, job: Job, policy: Policy, expected: float) -> bool:
        """Wait for `job` at the bound, until this boundary's deadline; past it, on while a
        worker computes it, until HANG_FACTOR times the longer of the timeout and `expected`
        after its start. False: it looks hung (never taken up, or its process is stalled)."""
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
            running = job.started_at + HANG_FACTOR * max(timeout, expected)
            if running <= now:
                return False
            deadline = running if stalled is None else min(running, now + max(
                timeout - stalled, 0.05))
        # It arrived: the workers work, so the refreshes behind it get a timeout from here.
        self._deadline = max(self._deadline, time.perf_counter() + timeout)
        return True

    def _stalled(self, job: Job) -> float | None:
        """Seconds the worker process running `job` has used no CPU (None: not known)."""
        for pool in self._pools():
            if (stalled := pool.stalled(job)) is not None:
                return stalled
        return None

    def abandon(self, job: Job) -> None:
        """Give up on `job`: cancelled, and a process running it killed and replaced."""
        for pool in self._pools():
            pool.abandon(job)

    @property
    def deaths(self) -> int:
        """Worker processes that died unasked, in every pool so far."""
        return sum(p.deaths for p in self._pools())

    def close(self) -> None:
        """Join every worker (processes that do not stop are killed)."""
        left = []
        for pool in self._pools():
            left += pool.close()
        self.pool, self._retired, self._spec = None, [], None
        if left:
            log.warning("refresh workers still running at shutdown: %s", ", ".join(left))
