"""Step-phase timing: perf counters on CPU, CUDA events on GPU.

A step is a sequence of named phases. On CPU, `time.perf_counter` around each phase is exact
because the work is synchronous. On CUDA the host runs ahead of the device, so each phase is
bracketed by CUDA events and read once, after the step's last event completes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

PHASES = ("data", "forward", "backward", "optimizer", "boundary")


class PhaseTimer:
    """Times the phases of one step at a time; `finish()` returns {phase: seconds}."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host: dict[str, float] = {}
        self._events: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] = {}
        self._step_start = 0.0
        self.in_step = False
        """True between `start_step` and `finish` (telemetry attributes waits by it)."""
        self.current_phase: str | None = None
        """The phase in progress, None between phases."""

    def start_step(self) -> None:
        self._host = {}
        self._events = {}
        self._step_start = time.perf_counter()
        self.in_step = True

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        self.current_phase = name
        try:
            yield
        finally:
            self.current_phase = None
            self._host[name] = self._host.get(name, 0.0) + time.perf_counter() - t0
            if self.cuda:
                end.record()
                self._events[name] = (start, end)

    def finish(self) -> tuple[dict[str, float], float]:
        """Phase seconds and the step's wall seconds. On CUDA this is a sync point."""
        if self.cuda and self._events:
            last_end = list(self._events.values())[-1][1]
            last_end.synchronize()  # sync point: read device times once per step
            phases = {k: s.elapsed_time(e) / 1e3 for k, (s, e) in self._events.items()}
        else:
            phases = dict(self._host)
        wall = time.perf_counter() - self._step_start
        self.in_step = False
        return {name: phases.get(name, 0.0) for name in PHASES}, wall
