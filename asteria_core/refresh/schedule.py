"""Where a deterministic refresh round goes in time: its blocks on V boundaries, by cost.

A round that falls due at step s is shared out over V slots by refresh cost (`share_out`, in
queue order). A block in slot k has its statistics read (with pace on) and its job handed to
the workers at s + k, and its basis swapped in at s + L + k, L = d - V + 1 steps later: every
block's basis is L steps old when it is swapped in, every boundary carries about 1/V of the
round's work, and the last swap comes at s + d. `swap_window` picks V: the operator's number,
or "auto", the widest window whose lead L still covers a slot's work on workers loaded as
planned (docs/architecture.md, "The swap schedule").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from asteria_core.fields import AUTO
from asteria_core.policy import PLANNED_DUTY, Priority, SwapMode

MAX_AUTO_WINDOW = 256
""""auto" looks at most this many boundaries wide (a round rarely needs more slots to be even,
and the search stays cheap at any refresh interval)."""


def share_out(things: Sequence, costs: Sequence[float], slots: int) -> dict:
    """Each of `things`, in order, to the slot with the least cost so far (the earliest on a
    tie): about an equal share of the total in each of `slots` slots."""
    heap = [(0.0, slot) for slot in range(slots)]
    placed = {}
    for thing, cost in zip(things, costs, strict=True):
        load, slot = heapq.heappop(heap)
        placed[thing] = slot
        heapq.heappush(heap, (load + cost, slot))
    return placed


def _peak(costs: Sequence[float], slots: int) -> float:
    """The busiest slot's cost once `costs` are shared out over `slots`."""
    load = [0.0] * slots
    for thing, slot in share_out(range(len(costs)), costs, slots).items():
        load[slot] += costs[thing]
    return max(load)


def swap_window(delay: int, window: int | str, interval: int, costs: Sequence[float]) -> int:
    """V for swap delay d = `delay`: `window` (at most d, at least 1); "auto", the widest
    V <= min(d, interval) whose lead L = d - V + 1 is at least the steps its busiest slot takes
    on workers loaded as planned (`costs`, each block's refresh cost, in queue order): workers
    that do one round in PLANNED_DUTY x min(d, interval) steps, so the busiest slot takes
    ceil(peak x PLANNED_DUTY x min(d, interval) / total). Many blocks of like cost give L = 1
    (the freshest bases the work allows: a slot's blocks rarely share out exactly evenly, and
    workers with no headroom at all would turn 1% over into a lead twice as long); a few
    blocks that are most of the round give a longer lead, since each alone takes that long."""
    if window != AUTO:
        assert isinstance(window, int)  # "auto" or an integer
        return max(1, min(window, delay))
    widest = max(1, min(delay, interval, MAX_AUTO_WINDOW))
    total = sum(costs)
    if total <= 0:
        return widest
    span = min(delay, interval)  # the steps a round may take: it is swapped in by s + d
    for v in range(widest, 0, -1):
        if delay - v + 1 >= math.ceil(_peak(costs, v) * PLANNED_DUTY * span / total - 1e-9):
            return v
    return 1


class SwapSchedule:
    """When each refresh of the engine's blocks is read, released and swapped in (the same on
    every rank and with or without workers: it depends on the blocks and the policy only)."""

    def __init__(self, blocks: dict, refreshes) -> None:
        self.blocks, self.refreshes = blocks, refreshes
        self._position = {key: i for i, key in enumerate(blocks)}  # fifo's order
        self._spec: tuple | None = None
        self._v = 1
        """V (`window`) and the policy fields it was worked out for."""

    def position(self, key) -> int:
        return self._position[key]

    def tie(self, key, policy) -> float:
        """Queue order among blocks equally stale: stale_then_cost, most expensive first;
        fifo, as due."""
        return -self.blocks[key].cost if policy.priority == Priority.STALE_THEN_COST else \
            self._position[key]

    def window(self, policy) -> int:
        """V: the boundaries a deterministic round is placed on, from the policy and the
        blocks' costs, in queue order."""
        spec = (policy.delay, policy.swap_window, policy.refresh_interval, policy.priority)
        if self._spec != spec:
            ordered = sorted(self.blocks, key=lambda key: self.tie(key, policy))
            self._spec = spec
            self._v = swap_window(policy.delay, policy.swap_window, policy.refresh_interval,
                                  [self.blocks[k].cost for k in ordered])
        return self._v

    def lead(self, policy) -> int | None:
        """L = d - V + 1 in deterministic mode, else None."""
        if policy.swap_mode != SwapMode.DETERMINISTIC:
            return None
        return policy.delay - self.window(policy) + 1

    def place(self, due, policy) -> dict:
        """Deterministic mode: each due block's slot k in 0 .. V-1, by refresh cost in queue
        order (`share_out`): read and released at s + k when paced, swapped at
        s + d - V + 1 + k. So a block released early is swapped early, every boundary of the
        window carries about 1/V of the round's work and swaps, and each basis is d - V + 1
        steps old at its swap."""
        if policy.swap_mode != SwapMode.DETERMINISTIC or not due:
            return {}
        window = self.window(policy)
        if window <= 1:
            return dict.fromkeys(due, 0)
        ordered = sorted(due, key=lambda key: self.tie(key, policy))
        return share_out(ordered, [self.blocks[k].cost for k in ordered], window)

    def early(self, key, t: int, slots: dict, policy) -> int:
        """How many boundaries before s + d `key` is swapped (V - 1 - its slot), never before
        the swap of its refresh still in flight (after a live change of the window, a newer
        round could otherwise place it earlier): s - early never decreases along a block's
        queue, so its refreshes are swapped in the order they fell due, here and in a
        checkpoint's pending list."""
        early = self.window(policy) - 1 - slots[key] if slots else 0
        queue_ = self.refreshes.queues[key]
        if not queue_:
            return early
        last = queue_[-1]
        return min(early, last.early + t - last.stats_step)

    def swap_step(self, item, policy) -> int:
        """The boundary at which a deterministic refresh is swapped (d read as it is now); a
        block's first basis at once."""
        if item.first:
            return item.stats_step
        return item.stats_step + max(policy.delay - item.early, 0)
