"""Owners move off a straggler: block ownership follows each rank's measured refresh speed.

Owner ranks are first chosen by cost alone (topology.assign_owners), as if every rank refreshed
at the same speed. A rank whose refreshes slow down (a noisy neighbour, a throttled core, a CPU
quota) then makes every rank wait at the swap steps of its blocks (`sync_wait`). Every
`rounds` refresh rounds each rank shares its speed: seconds per unit of refresh cost (b^3) of the
refreshes it computed since the last time (an asynchronous all-gather on a gloo group of its own,
posted at one boundary and read at the next, like the policy sync). Every rank then computes the
same new owner map from the same numbers (`rebalanced_owners`, a pure function) and, when it
shortens the slowest rank's expected round by at least `min_gain`, applies it at that boundary:
for each block that changes owner, in key order on every rank, the old owner sends its factor
statistics to the new one (one point-to-point transfer), which keeps updating them from the next
step on; the old owner drops its copy. A map waits (every rank alike) until each refresh due on
a moving block has read its statistics, at most a swap window after it fell due (pacing reads
a block when its job goes out). Refreshes already in flight finish on their old owner
(a transfer names its owner when posted), so every version still arrives, swapped in at its
step on every rank: replicas stay identical and staleness stays within S through a move. A rank
that recovers gets its blocks back the same way.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

from asteria_core.distributed.exchange import VersionExchange
from asteria_core.distributed.process_group import release_group
from asteria_core.optim.base import BlockPreconditioner
from asteria_core.optim.seam import BlockInfo, BlockKey
from asteria_core.telemetry.labels import IdleCause
from asteria_core.telemetry.reporter import Reporter

log = logging.getLogger(__name__)
MIN_GAIN = 0.2
"""A new owner map is adopted only when it shortens the slowest rank's expected round by this
share: measurement noise never moves blocks back and forth."""


def rebalanced_owners(blocks: list[BlockInfo], owners: dict[BlockKey, int],
                      seconds_per_cost: list[float], min_gain: float = MIN_GAIN
                      ) -> dict[BlockKey, int]:
    """Owners for ranks refreshing at the given speeds (NaN: not measured, taken as the median
    of the measured ones): each block, most expensive first, to the rank that would finish its
    round earliest (ties: the current owner, then the lower rank). Returns `owners` itself
    unless that cuts the slowest rank's expected round by at least `min_gain`."""
    known = [r for r in seconds_per_cost if math.isfinite(r) and r > 0]
    if not known:
        return owners
    fill = statistics.median(known)
    rates = [r if math.isfinite(r) and r > 0 else fill for r in seconds_per_cost]
    world = len(rates)

    def longest(assignment: dict[BlockKey, int]) -> float:
        load = [0.0] * world
        for block in blocks:
            load[assignment[block.key]] += block.cost * rates[assignment[block.key]]
        return max(load)

    load = [0.0] * world
    proposed: dict[BlockKey, int] = {}
    for block in sorted(blocks, key=lambda b: (-b.cost, b.key)):
        rank = min(range(world), key=lambda r: (load[r] + block.cost * rates[r],
                                                r != owners[block.key], r))
        load[rank] += block.cost * rates[rank]
        proposed[block.key] = rank
    if longest(proposed) > (1.0 - min_gain) * longest(owners):
        return owners
    return proposed


class Rebalancer:
    """One rank's part (create it on every rank, in the same order: it makes a group)."""

    def __init__(self, optimizer: BlockPreconditioner, exchange: VersionExchange,
                 speed: Callable[[], tuple[float, float]], reporter: Reporter,
                 every_steps: Callable[[], int], min_gain: float = MIN_GAIN,
                 can_move: Callable[[set[BlockKey]], bool] | None = None) -> None:
        """`speed`: (seconds, cost) of every refresh this rank computed so far;
        `every_steps`: the steps between two shares of speeds (read at each boundary);
        `can_move`: whether these blocks' statistics may change hands now, the same answer on
        every rank (the refresh engine's `reads_done`: a refresh due on the old owner reads
        them at its release, up to a swap window later). A new owner map waits for it."""
        self.opt, self.exchange, self.speed = optimizer, exchange, speed
        self.can_move = can_move
        self._waiting: dict[BlockKey, int] | None = None
        """A new owner map waiting for its blocks' statistics to be read (`can_move`)."""
        self.reporter, self.every_steps, self.min_gain = reporter, every_steps, min_gain
        self.rank, self.world = exchange.topology.rank, exchange.topology.world
        self.blocks = optimizer.refresh_blocks()
        self.moves = 0
        """Blocks that changed owner so far."""
        self.bytes_sent = 0
        self.bytes_received = 0
        self._group = dist.new_group(backend="gloo")  # collective: every rank, same order
        self._last = (0.0, 0.0)
        self._rates = [math.nan] * self.world
        self._posted: tuple[dist.Work, list[torch.Tensor]] | None = None
        self._since = 0
        self._owners_from_state()

    def _owners_from_state(self) -> None:
        """A resumed run: owners may have moved before its checkpoint, whose factor statistics
        each rank loaded for the blocks it owned then. Every rank says which it holds (one
        small all-gather at the start; nothing held on a fresh run) and those are its blocks."""
        held = torch.tensor([self.opt.factors.holds(b.key) for b in self.blocks],
                            dtype=torch.uint8)
        gathered = [torch.zeros_like(held) for _ in range(self.world)]
        dist.all_gather(gathered, held, group=self._group)
        for i, block in enumerate(self.blocks):
            holders = [r for r in range(self.world) if gathered[r][i]]
            if len(holders) == 1:
                self.exchange.owners[block.key] = holders[0]

    def at_boundary(self, step: int) -> None:
        if self._posted is not None:
            work, gathered = self._posted
            self._posted = None
            with self.reporter.wait(IdleCause.SYNC_WAIT):
                work.wait()
            # A rank that refreshed nothing since the last share keeps its last known speed.
            self._rates = [float(g.item()) if math.isfinite(g.item()) else old
                           for g, old in zip(gathered, self._rates, strict=True)]
            owners = rebalanced_owners(self.blocks, self.exchange.owners, self._rates,
                                       self.min_gain)
            self._waiting = owners if owners is not self.exchange.owners else None
        if self._waiting is not None:
            owners = self._waiting
            leaving = {k for k in owners if owners[k] != self.exchange.owners[k]}
            if self.can_move is None or self.can_move(leaving):
                self._waiting = None
                self._move(owners, step)
        self._since += 1
        if self._since >= max(1, self.every_steps()):
            self._since = 0
            self._share()

    def _share(self) -> None:
        seconds, cost = self.speed()
        done = cost - self._last[1]
        rate = (seconds - self._last[0]) / done if done > 0 else math.nan
        self._last = (seconds, cost)
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(self.world)]
        work = dist.all_gather(gathered, torch.tensor([rate], dtype=torch.float64),
                               group=self._group, async_op=True)
        self.bytes_sent += 8 * (self.world - 1)
        self.bytes_received += 8 * (self.world - 1)
        self._posted = (work, gathered)

    def close(self) -> None:
        """Complete the share every rank posted last, then release the group."""
        if self._posted is not None:
            self._posted[0].wait()
            self._posted = None
        release_group(self._group)
        self._group = None

    def _move(self, owners: dict[BlockKey, int], step: int) -> None:
        """Hand each moved block's factor statistics from its old owner to its new one."""
        moved = sorted(k for k in owners if owners[k] != self.exchange.owners[k])
        for key in moved:
            old, new = self.exchange.owners[key], owners[key]
            if self.rank == old:  # gloo: through host memory
                factor = self.opt.factors.copy_of(key).cpu()
                dist.send(factor, dst=new, group=self._group)
                self.bytes_sent += factor.numel() * factor.element_size()
                self.opt.factors.hand(key, None)
            elif self.rank == new:
                factor = self.opt.factors.empty_like(key)
                dist.recv(factor, src=old, group=self._group)
                self.bytes_received += factor.numel() * factor.element_size()
                self.opt.factors.hand(key, factor)
        self.exchange.owners.update(owners)  # owns() answers anew from the next step on
        if self.opt.residency is not None:
            self.opt.residency.adopt_all()  # the tier store counts the new sizes
        self.moves += len(moved)
        if self.rank == 0:
            log.info("step %d: %d blocks changed owner rank (refresh seconds per unit cost by "
                     "rank: %s)", step, len(moved),
                     ", ".join(f"{r:.3g}" for r in self._rates))
