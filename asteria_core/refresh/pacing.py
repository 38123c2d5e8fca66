"""Pacing: jobs held back and handed to the workers over the boundaries of their round.

With `pace` on (deterministic mode), the block in slot k of a round that fell due at s is read
and released to the workers at s + k: every step carries about 1/V of the round's work instead
of one step taking the whole burst, and every basis is L steps old at its swap. Opportunistic
mode, paced, reads at s and releases over min(S, refresh interval) boundaries by cost. A job
still held when its swap comes is read and released at once. Releases can be held (`hold`):
a benchmark that pauses a run between its turns keeps them from running into another's turn.
"""

from __future__ import annotations

import time

from asteria_core.policy import Policy, SwapMode
from asteria_core.refresh.outstanding import Outstanding
from asteria_core.refresh.schedule import share_out
from asteria_core.refresh.workers import Job


class Pacer:
    """The jobs pacing holds back, in order (a dict: dropping one costs O(1), not a scan)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.held: dict[Outstanding, None] = {}
        self.holding = False
        """While set, boundaries release nothing (`hold`)."""

    def hold(self, on: bool) -> None:
        """Hold releases (a swap that needs a job still sends it) or, turning it off, send
        every job whose release has come."""
        self.holding = on
        if not on and self.engine.workers.pool is not None:
            self.release(self.engine.opt.num_steps)

    def pace(self, items: list[Outstanding], t: int, policy: Policy) -> None:
        """Jobs whose statistics were read at this boundary. First bases are swapped here:
        their jobs go to the workers at once, together (on a data-parallel rank a held one could
        wait behind another owner's delivery that waits for it), as does every job with pace
        off. Opportunistic mode, paced: release boundaries t .. t+W-1 (W = min(S, refresh
        interval)), about equal cost each (`share_out`, in queue order). Deterministic mode
        holds its paced jobs unread instead (`RefreshEngine.on_boundary`)."""
        engine = self.engine
        for item in items:
            if item.first:  # in the order they are swapped: results wait for it the least
                _job(item).priority = (item.since, engine.schedule.position(item.key))
                item.released = t
                engine.workers.pool.submit(_job(item))
        items = sorted((item for item in items if not item.first),
                       key=lambda item: _job(item).priority)
        window = 1
        if policy.pace and policy.swap_mode == SwapMode.OPPORTUNISTIC:
            window = max(1, min(policy.staleness_bound, policy.refresh_interval))
        slots = share_out(items, [engine.blocks[item.key].cost for item in items], window)
        for item in items:
            self.keep(item, t + slots[item])

    def keep(self, item: Outstanding, release: int) -> None:
        """`item`'s job goes out at boundary `release` (`release`; this one's at its end).
        A worker still busy with an earlier boundary's jobs takes them before a later one's,
        however expensive: the order the swap window was filled in."""
        item.release_step = release
        job = _job(item)
        since, tie = job.priority
        job.priority = (since, release, tie)
        self.held[item] = None

    def drop(self, item: Outstanding) -> None:
        """`item` is no longer held (coalesced, or computed now)."""
        del self.held[item]
        item.release_step = None

    def release(self, t: int) -> None:
        if self.holding:
            return
        for item in [i for i in self.held
                     if i.release_step is not None and i.release_step <= t]:
            self.dispatch(item)

    def dispatch(self, item: Outstanding) -> None:
        """A held job goes out: its statistics are read now if they were not, then it goes to
        the workers, or with none is computed here (and staged when its swap is later)."""
        engine = self.engine
        self.drop(item)
        job = _job(item)
        if job.snapshot is None:
            engine.read(job, item.key)
        job.submitted_at = time.perf_counter()
        if engine.workers.pool is not None:
            item.released = engine.opt.num_steps
            engine.workers.pool.submit(job)
            return
        item.job = None
        engine.run_inline(item, job)
        if engine.schedule.swap_step(item, engine.policy.current) > engine.opt.num_steps:
            engine.staging.stage(item)


def _job(item: Outstanding) -> Job:
    """The job of an item this rank refreshes itself (held by pacing, or released)."""
    assert item.job is not None
    return item.job
