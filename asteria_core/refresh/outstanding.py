"""Outstanding refreshes: those that fell due and are not swapped in yet, per block, and the
staleness they make.

Staleness of a block, as seen by step u, is u - s when a refresh from step s is outstanding
(computed or not, not yet swapped in) and 0 otherwise; the engine keeps it within the bound S in
force. In opportunistic mode a block that falls due while its previous refresh still waits for a
worker replaces it (`coalesce`: fresher statistics, the older one's deadline), so no block waits
for a worker twice.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from asteria_core.optim.matrix_functions import basis_change
from asteria_core.optim.seam import BlockKey, RefreshResult
from asteria_core.refresh.workers import Job


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


class Refreshes:
    """The outstanding refreshes of every block (`queues`), oldest first."""

    def __init__(self, keys) -> None:
        self.queues: dict[BlockKey, deque[Outstanding]] = {k: deque() for k in keys}

    def __iter__(self) -> Iterator[Outstanding]:
        for queue_ in self.queues.values():
            yield from queue_

    def staleness(self, t: int) -> dict[BlockKey, int]:
        """Staleness each block will have in step t + 1 (the next step)."""
        return {k: (t + 1 - q[0].since) if q else 0 for k, q in self.queues.items()}

    def depth(self) -> int:
        """Refreshes queued, held or running for the workers."""
        return sum(1 for item in self if item.job is not None and not item.job.done.is_set())

    def reads_done(self, keys: set[BlockKey], t: int) -> bool:
        """Whether every refresh of `keys` that fell due has read its statistics by boundary t."""
        return not any(item.read_step > t for key in keys for item in self.queues[key])

    def coalesce(self, item: Outstanding) -> Outstanding | None:
        """Opportunistic mode: a refresh of the block still waiting for a worker is dropped for
        the new one (fresher statistics, the same work), which keeps its place in the queue and
        its deadline. So a block never waits for a worker twice, and workers slower than the
        refresh interval do not pile up refreshes that a newer one would replace anyway.
        (Deterministic mode swaps every refresh at its own step, by s + d, so each one is
        needed; a block then has at most ceil(d / interval) in flight.) Returns the dropped."""
        queue_ = self.queues[item.key]
        older = queue_[-1] if queue_ else None
        if older is None or older.job is None or older.job.started_at is not None \
                or older.job.done.is_set():
            return None
        queue_.pop()
        older.job.cancelled = True  # no worker takes it now; one that just did is not read
        item.since = older.since
        return older


def barely_moved(item: Outstanding, result: RefreshResult | None, skip_below: float) -> bool:
    """Whether `item`'s new basis moved less than `skip_below` from the one it continues: decided
    once per refresh, from its own snapshot (the same answer on any thread)."""
    if item.unchanged is None:
        job = item.job
        basis = None if job is None else job.snapshot.basis
        item.unchanged = bool(skip_below and result is not None and basis is not None
                              and basis_change(basis, result) < skip_below)
    return item.unchanged
