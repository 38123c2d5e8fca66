"""The one interface through which the runtime reports figures.

The runtime, the refresh engine, the tier store and distributed code receive a `Reporter`
and call its methods; they never import prometheus_client. `Telemetry` (core.py) is the real
implementation; `NullReporter` does nothing and is what a trainer gets when telemetry is off.
Labels are bounded: a cause, a tier or a transfer endpoint outside the sets below is a
programming error and raises `ValueError`.

Waits are the heart of idle attribution. A part that blocks the training thread wraps the
blocking call in `reporter.wait(cause)`; that time is subtracted from the compute time of the
phase it happened in and counted as idle time of that cause. `add_wait` is the same for a wait
measured some other way (e.g. between CUDA events).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from asteria_core.telemetry.config import TelemetryConfig
    from asteria_core.telemetry.records import StepRecord, TimingFigures
    from asteria_core.telemetry.timing import PhaseTimer

WAIT_CAUSES = ("refresh_wait", "transfer_wait", "sync_wait", "data_wait")
"""Causes a part may report; `other` (the unexplained rest of a step) is derived, never reported."""
IDLE_CAUSES = (*WAIT_CAUSES, "other")
TIERS = ("device", "host", "disk")


def check_label(kind: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{kind}: got {value!r}; allowed: {' | '.join(allowed)}")


class Reporter(Protocol):
    """What parts of the runtime call. Every method is cheap and thread-safe."""

    def wait(self, cause: str) -> AbstractContextManager[None]:
        """Time a block in which the training thread waits, for a cause in WAIT_CAUSES."""
        ...

    def add_wait(self, cause: str, seconds: float) -> None:
        """Report a wait of the training thread measured by the caller."""
        ...

    def refresh_done(self, seconds: float, *, ok: bool = True) -> None:
        """One preconditioner refresh finished (ok) or failed (not ok) after `seconds`."""
        ...

    def inline_fallback(self) -> None:
        """A refresh meant for a worker ran on the training thread instead."""
        ...

    def set_refresh_queue(self, depth: int, *, busy_ratio: float | None = None) -> None:
        """Refreshes queued or running, and optionally the share of worker time busy (0-1)."""
        ...

    def set_staleness(self, steps: Sequence[int]) -> None:
        """Staleness in steps of every preconditioner block in use at this step boundary."""
        ...

    def set_tier_bytes(self, tier: str, used: int, capacity: int) -> None:
        """Bytes of optimizer state held in a tier, and the tier's budget."""
        ...

    def add_transfer(self, src: str, dst: str, nbytes: int) -> None:
        """Bytes moved from one tier to another."""
        ...

    def set_prefetch_hit_ratio(self, ratio: float) -> None:
        """Share of off-device state uses whose prefetch was done in time (0-1), so far."""
        ...

    def set_policy_version(self, version: int) -> None:
        """The version of the live policy now in force."""
        ...

    def set_mode(self, mode: str) -> None:
        """The refresh mode of the run (the `mode` label of asteria_run_info), e.g. native."""
        ...

    def set_refresh_policy(self, staleness_bound: int, background_load: float | None) -> None:
        """The staleness bound in force, and refresh work per interval / worker capacity."""
        ...


class RunReporter(Reporter, Protocol):
    """A reporter the runtime binds to one run: it splits each step's time and sees its record."""

    def bind(self, timer: PhaseTimer, *, device: torch.device, run_id: str,
             optimizer: str) -> None:
        """The run's step timer (waits are attributed to its phase in progress) and identity."""
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

    def refresh_done(self, seconds: float, *, ok: bool = True) -> None:
        pass

    def inline_fallback(self) -> None:
        pass

    def set_refresh_queue(self, depth: int, *, busy_ratio: float | None = None) -> None:
        pass

    def set_staleness(self, steps: Sequence[int]) -> None:
        pass

    def set_tier_bytes(self, tier: str, used: int, capacity: int) -> None:
        pass

    def add_transfer(self, src: str, dst: str, nbytes: int) -> None:
        pass

    def set_prefetch_hit_ratio(self, ratio: float) -> None:
        pass

    def set_policy_version(self, version: int) -> None:
        pass

    def set_mode(self, mode: str) -> None:
        pass

    def set_refresh_policy(self, staleness_bound: int, background_load: float | None) -> None:
        pass

    def bind(self, timer: PhaseTimer, *, device: torch.device, run_id: str,
             optimizer: str) -> None:
        pass

    def split_step(self, phase_seconds: dict[str, float], wall: float) -> TimingFigures | None:
        return None

    def observe(self, record: StepRecord) -> None:
        pass

    def close(self) -> None:
        pass
