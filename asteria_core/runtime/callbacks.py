"""What a loop, an integration or the control plane registers with the runtime, called in the
order registered: record listeners (each completed step record), boundary hooks (inside the
step boundary, its last stage) and between-steps hooks (after each completed record, outside any
step's timing). Each registration returns its remover."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from asteria_core.telemetry.records import StepRecord

Listener = Callable[[StepRecord], None]
StepHook = Callable[[int], None]


class Callbacks:
    def __init__(self, listeners: Iterable[Listener] = ()) -> None:
        self._listeners: list[Listener] = list(listeners)
        self._boundary: list[StepHook] = []
        self._between: list[StepHook] = []

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def at_boundary(self, hook: StepHook) -> Callable[[], None]:
        self._boundary.append(hook)
        return lambda: self._boundary.remove(hook)

    def between_steps(self, hook: StepHook) -> Callable[[], None]:
        self._between.append(hook)
        return lambda: self._between.remove(hook)

    # A callback may remove itself (or another) while they run: each call runs over a copy.
    def record(self, record: StepRecord) -> None:
        for listener in list(self._listeners):
            listener(record)

    def boundary(self, step: int) -> None:
        for hook in list(self._boundary):
            hook(step)

    def between(self, step: int) -> None:
        for hook in list(self._between):
            hook(step)
