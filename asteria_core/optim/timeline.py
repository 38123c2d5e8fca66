"""The refresh seam's clock: steps so far, the swap delay, results waiting for their swap step
and the blocks that fell due at the last step."""

from __future__ import annotations

from asteria_core.optim.seam import BlockKey, RefreshResult


class RefreshTimeline:
    """When each refresh result is swapped in.

    With `delay = d` a result computed from the statistics of step t is swapped in at the
    boundary of step t + d. Results due at the same boundary are swapped in the order they were
    scheduled.
    """

    def __init__(self, delay: int) -> None:
        self.delay = delay
        self.num_steps = 0
        """Calls of step() so far: the clock that stats steps and swap steps use."""
        self.due: tuple[BlockKey, ...] = ()
        """Blocks whose refresh fell due at the last step."""
        self._pending: list[tuple[int, RefreshResult]] = []  # (swap step, result), in order

    @property
    def delay(self) -> int:
        return self._delay

    @delay.setter
    def delay(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"refresh_delay: got {value!r}; allowed: an integer >= 0")
        self._delay = value

    def add(self, step: int, result: RefreshResult) -> None:
        """`result` to be swapped in at the boundary of `step`."""
        self._pending.append((step, result))

    def take_ready(self) -> list[RefreshResult]:
        """The results whose swap step has come, in swap step order (ties: as scheduled); they
        are no longer pending."""
        now = self.num_steps
        ready = sorted((item for item in self._pending if item[0] <= now), key=lambda i: i[0])
        self._pending = [item for item in self._pending if item[0] > now]
        return [result for _, result in ready]

    def pending(self) -> list[tuple[int, BlockKey]]:
        """(swap step, key) of scheduled results not yet swapped in."""
        return [(at, result.key) for at, result in self._pending]

    def pending_dicts(self) -> list[dict]:
        """The scheduled results as a checkpoint keeps them."""
        return [{"at": at, **result.to_dict()} for at, result in self._pending]

    def restore(self, num_steps: int, pending: list[dict]) -> None:
        """The clock and scheduled results of a checkpoint (`pending_dicts`); nothing due."""
        self.num_steps = num_steps
        self._pending = [(item["at"], RefreshResult.from_dict(item)) for item in pending]
        self.due = ()
