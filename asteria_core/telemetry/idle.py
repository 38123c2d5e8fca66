"""Idle attribution: split a step's wall time into compute per phase and idle time per cause.

Waits are reported while they happen (`Reporter.wait`), keyed by the phase the step timer is
in. When the step ends, each phase's compute time is its timed span minus the waits inside it,
and `other` is whatever the phases and the waits do not explain (gaps between phases, the
host running ahead of the device). So, per step:

    sum(compute.values()) + sum(idle.values()) == wall

exactly on CPU. On CUDA the phase spans are device times (CUDA events) while waits are host
times; a phase is clamped at zero when a host wait overlapped queued device work, and `other`
is clamped at zero, so the identity can then overshoot by the overlap.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from asteria_core.telemetry.labels import IDLE_CAUSES


class WaitLedger:
    """Waits of the step in progress, by (phase, cause); phase None = between phases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._step: dict[tuple[str | None, str], float] = defaultdict(float)
        self._outside: dict[str, float] = defaultdict(float)

    def add(self, cause: str, seconds: float, *, in_step: bool, phase: str | None) -> None:
        with self._lock:
            if in_step:
                self._step[(phase, cause)] += seconds
            else:
                self._outside[cause] += seconds

    def take_step(self) -> dict[tuple[str | None, str], float]:
        """The finished step's waits; the ledger starts empty for the next step."""
        with self._lock:
            waits, self._step = dict(self._step), defaultdict(float)
        return waits

    def take_outside(self) -> dict[str, float]:
        """Waits that happened outside any step (e.g. during evaluation)."""
        with self._lock:
            waits, self._outside = dict(self._outside), defaultdict(float)
        return waits


def breakdown(phase_seconds: dict[str, float], wall: float,
              waits: dict[tuple[str | None, str], float]) -> tuple[dict[str, float],
                                                                 dict[str, float]]:
    """(compute seconds per phase, idle seconds per cause in IDLE_CAUSES) of one step."""
    compute = dict(phase_seconds)
    idle = dict.fromkeys(IDLE_CAUSES, 0.0)
    for (phase, cause), seconds in waits.items():
        idle[cause] += seconds
        if phase in compute:
            compute[phase] -= seconds
    for phase, seconds in compute.items():
        compute[phase] = max(0.0, seconds)
    idle["other"] = max(0.0, wall - sum(compute.values()) - sum(idle.values()))
    return compute, idle
