"""Loads of disk-homed state ahead of use, in the order of the step's updates.

While one parameter updates, the next ones' files are read into free staging buffers; one
buffer always stays free for a use nobody announced. A use finds its load done (a hit), or waits
for it, or starts it (misses: the wait counts as transfer_wait).
"""

from __future__ import annotations

import itertools

from asteria_core.telemetry.labels import IdleCause
from asteria_core.telemetry.reporter import Reporter
from asteria_core.tiers.buffers import StagingBuffers
from asteria_core.tiers.catalogue import StateCatalogue
from asteria_core.tiers.files import ParamFiles
from asteria_core.tiers.resident import ResidentState
from asteria_core.tiers.traffic import DiskTraffic, Load


class Prefetcher:
    """The step's update order, the loads started ahead of it, and their hits and misses."""

    def __init__(self, catalogue: StateCatalogue, files: ParamFiles, buffers: StagingBuffers,
                 traffic: DiskTraffic, resident: ResidentState, reporter: Reporter) -> None:
        self.catalogue = catalogue
        self.files = files
        self.buffers = buffers
        self.traffic = traffic
        self.resident = resident
        self.reporter = reporter
        self.hits = self.misses = 0
        self._order: list[int] = []
        self._position: dict[int, int] = {}  # index -> its place in _order
        self._loads: dict[int, Load] = {}
        self._prefetched = 0

    def begin_step(self, order: list[int]) -> None:
        self._order = order
        self._position = {index: pos for pos, index in enumerate(order)}
        self._from(0)

    def announce(self) -> None:
        """The next step is coming; start loading its first parameters."""
        if self._order:
            self._from(0)

    def after(self, index: int) -> None:
        """Parameter `index` is in use: load the ones after it."""
        pos = self._position.get(index)
        if pos is not None:
            self._from(pos + 1)

    def _from(self, pos: int) -> None:
        limit = max(self.buffers.count() - 1, 0)  # one buffer stays free for an unplanned use
        if self._prefetched >= limit:
            return  # (every use calls this: it must not cost a walk over the parameters)
        for index in itertools.islice(self._order, pos, None):
            if self._prefetched >= limit:
                return
            if not self.files.on_disk(index) or not self.catalogue.has_state(index):
                continue
            if index in self._loads or self.resident.holds(index):
                continue
            self._loads[index] = self.traffic.load(index)
            self._prefetched += 1

    def take(self, index: int) -> int:
        """The buffer parameter `index`'s state is loaded into: its prefetched load, waited for
        where late, or a load started now."""
        load = self._loads.pop(index, None)
        if load is None:
            self.misses += 1
            load = self.traffic.load(index)
        else:
            self._prefetched -= 1
            if load[0].is_set():
                self.hits += 1
            else:
                self.misses += 1
        if not load[0].is_set():
            with self.reporter.wait(IdleCause.TRANSFER_WAIT):
                load[0].wait()
        slot, err = load[1]
        if err is not None:
            if slot is not None:
                self.buffers.free(slot)
            raise err
        return slot

    def count_hit(self) -> None:
        """A use found the state still resident."""
        self.hits += 1

    def drop(self) -> None:
        """Wait for the loads started ahead and free their buffers (they are clean)."""
        for done, out in list(self._loads.values()):
            done.wait()
            if out[0] is not None:
                self.buffers.free(out[0])
        self._loads.clear()
        self._prefetched = 0

    def hit_ratio(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None
