"""What the runtime's parts report besides the step record.

The step record is the one channel for a step's figures: the refresh engine, the tier store
and the policy put theirs in its sections, and the exporter derives every gauge and counter
from records (`Telemetry.observe`). A part calls its `Reporter` only for what a record does not
hold: the training thread's waits (idle attribution), each refresh's duration and each block's
staleness (histograms of events), and the run's refresh mode (a label). `Telemetry` (core.py)
is the real implementation; `NullReporter` does nothing and is what a trainer gets when
telemetry is off. They never import prometheus_client. Labels are bounded: a cause outside
WAIT_CAUSES is a programming error and raises `ValueError`.

Waits are the heart of idle attribution. A part that blocks the training thread wraps the
blocking call in `reporter.wait(cause)`; that time is subtracted from the compute time of the
phase it happened in and counted as idle time of that cause. `add_wait` is the same for a wait
measured some other way (e.g. between CUDA events).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol

from asteria_core.telemetry.labels import IDLE_CAUSES, TIERS, WAIT_CAUSES

if TYPE_CHECKING:
    import torch

    from asteria_core.telemetry.config import TelemetryConfig
    from asteria_core.telemetry.records import StepRecord, TimingFigures
    from asteria_core.telemetry.timing import PhaseTimer


__all__ = ["IDLE_CAUSES", "TIERS", "WAIT_CAUSES", "NullReporter", "Reporter", "RunReporter",
           "make_reporter"]


class Reporter(Protocol):
    """What parts of the runtime call. Every method is cheap and thread-safe."""

    def wait(self, cause: str) -> AbstractContextManager[None]:
        """Time a block in which the training thread waits, for a cause in WAIT_CAUSES."""
        ...

    def add_wait(self, cause: str, seconds: float) -> None:
        """Report a wait of the training thread measured by the caller."""
        ...

    def refresh_done(self, seconds: float) -> None:
        """One preconditioner refresh of this process took `seconds` (it may have failed: the
        record counts failures)."""
        ...

    def set_staleness(self, steps: Sequence[int]) -> None:
        """Staleness in steps of every preconditioner block in use at this step boundary."""
        ...

    def set_mode(self, mode: str) -> None:
        """The refresh mode of the run (the `mode` label of asteria_run_info), e.g. native."""
        ...


class RunReporter(Reporter, Protocol):
    """A reporter the runtime binds to one run: it splits each step's time and sees its record."""

    def bind(self, timer: PhaseTimer, *, device: torch.device, run_id: str,
             optimizer: str) -> None:
        """The run's step timer (waits are attributed to its phase in progress) and identity."""
        ...

    def set_device(self, device: torch.device) -> None:
        """The parameters moved before the first step (an optimizer built before
        `model.cuda()`): the run trains on `device`, not the one given at bind."""
        ...

    def split_step(self, phase_seconds: dict[str, float], wall: float) -> TimingFigures | None:
        """At the step boundary: the finished step's compute per phase and idle per cause."""
        ...

    def observe(self, record: StepRecord) -> None:
        """A finished step's record, before any listener sees it (telemetry adds `energy`)."""
        ...

    def close(self) -> None:
        """The run is over: release meters and servers (idempotent)."""
        ...


def make_reporter(config: TelemetryConfig) -> RunReporter:
    """`Telemetry` when the config enables it, else a `NullReporter`."""
    if not config.enabled:
        return NullReporter()
    # Imported here so that importing the runtime never loads prometheus_client.
    from asteria_core.telemetry.core import Telemetry

    return Telemetry(config)


_NO_WAIT = nullcontext()


class NullReporter:
    """Accepts every report and keeps nothing: telemetry off."""

    def wait(self, cause: str) -> AbstractContextManager[None]:
        return _NO_WAIT

    def add_wait(self, cause: str, seconds: float) -> None:
        pass

    def refresh_done(self, seconds: float) -> None:
        pass

    def set_staleness(self, steps: Sequence[int]) -> None:
        pass

    def set_mode(self, mode: str) -> None:
        pass

    def bind(self, timer: PhaseTimer, *, device: torch.device, run_id: str,
             optimizer: str) -> None:
        pass

    def set_device(self, device: torch.device) -> None:
        pass

    def split_step(self, phase_seconds: dict[str, float], wall: float) -> TimingFigures | None:
        return None

    def observe(self, record: StepRecord) -> None:
        pass

    def close(self) -> None:
        pass
