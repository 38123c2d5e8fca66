"""Step-phase timing: perf counters on CPU, CUDA events on GPU.

A step is a sequence of named phases. Phases nest: entering a phase inside another pauses the
outer one, so each moment of the step counts in exactly one phase, the innermost (the step
boundary, which runs inside `optimizer.step()`, is not also counted as optimizer time). On CPU,
`time.perf_counter` around each span is exact because the work is synchronous. On CUDA the host
runs ahead of the device, so each span is bracketed by CUDA events, read once the step's last
event has completed: `finish` waits for it only if the device is still running the step. That
wait is the step's one host-device synchronization (STEP_SYNC): the tier store's copies and the
refresh's snapshots order themselves with events on the device and add none per step. (Deferring
it to the record's completion would not remove it: completing a record reads its loss, which
waits for the same stream.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from asteria_core.telemetry.labels import PHASES

STEP_SYNC = "the phase timer's read of the step's device times"
"""The one host-device synchronization per step on CUDA, named so a reader can find it."""

PhaseToken = tuple[int, int]
"""(step generation, stack depth) of an entered phase; leaving it closes it and what it holds."""


class PhaseTimer:
    """Times the phases of one step at a time; `finish()` returns {phase: seconds}."""

    def __init__(self, device: torch.device, event: Callable[..., Any] | None = None) -> None:
        """`event` makes CUDA events (torch.cuda.Event; a fake in tests without a GPU)."""
        self._event = event if event is not None else torch.cuda.Event
        self.syncs = 0
        """Host-device synchronizations so far (STEP_SYNC: at most one per step)."""
        self.device = device
        self.cuda = device.type == "cuda"
        self.in_step = False
        """True between `start_step` and `finish` (telemetry attributes waits by it)."""
        self._stack: list[str] = []
        self._host: dict[str, float] = {}
        self._spans: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._span_start = 0.0
        self._span_event: torch.cuda.Event | None = None
        self._step_start = 0.0
        self._generation = 0

    def set_device(self, device: torch.device) -> None:
        """Time on `device` from the next step on (between steps only)."""
        if self.in_step:
            raise RuntimeError("the timer's device changes between steps only")
        self.device = device
        self.cuda = device.type == "cuda"

    @property
    def current_phase(self) -> str | None:
        """The innermost phase in progress, None between phases."""
        return self._stack[-1] if self._stack else None

    def start_step(self) -> None:
        self._host, self._spans, self._stack = {}, [], []
        self._generation += 1
        self._step_start = time.perf_counter()
        self.in_step = True

    def enter(self, name: str) -> PhaseToken:
        if name not in PHASES:
            raise ValueError(f"phase: got {name!r}; allowed: {' | '.join(PHASES)}")
        self._end_span()
        self._stack.append(name)
        self._begin_span()
        return self._generation, len(self._stack)

    def leave(self, token: PhaseToken) -> None:
        """Close the phase `token` entered and any phase opened inside it. A phase of a step
        that has already finished is closed already: nothing happens."""
        generation, depth = token
        if generation != self._generation or not self.in_step or len(self._stack) < depth:
            return
        self._end_span()
        del self._stack[depth - 1:]
        self._begin_span()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        token = self.enter(name)
        try:
            yield
        finally:
            self.leave(token)

    def finish(self) -> tuple[dict[str, float], float]:
        """Phase seconds and the step's wall seconds. On CUDA this is a sync point."""
        self._end_span()
        self._stack = []
        if self.cuda and self._spans:
            last = self._spans[-1][2]
            if not last.query():  # STEP_SYNC: the device is still in this step
                self.syncs += 1
                last.synchronize()
            phases: dict[str, float] = {}
            for name, start, end in self._spans:
                phases[name] = phases.get(name, 0.0) + start.elapsed_time(end) / 1e3
        else:
            phases = dict(self._host)
        wall = time.perf_counter() - self._step_start
        self.in_step = False
        return {name: phases.get(name, 0.0) for name in PHASES}, wall

    def _begin_span(self) -> None:
        if not self._stack:
            return
        self._span_start = time.perf_counter()
        if self.cuda:
            self._span_event = self._event(enable_timing=True)
            self._span_event.record()

    def _end_span(self) -> None:
        if not self._stack:
            return
        name = self._stack[-1]
        self._host[name] = self._host.get(name, 0.0) + time.perf_counter() - self._span_start
        if self.cuda:
            start = self._span_event
            assert start is not None  # recorded as the span began
            end = self._event(enable_timing=True)
            end.record()
            self._spans.append((name, start, end))
