"""The step boundary: an ordered list of stages, run at the end of every `optimizer.step()`.

Each stage does its part of the boundary and returns its section of the step record (or None
when it has none). The runtime builds the list once (`boundary_stages`), in the order of
docs/architecture.md ("The step boundary"):

1. policy: changes queued since the last boundary take effect from the next step (in a
   data-parallel run, those rank 0 sent at the last boundary, on every rank);
2. tiers: re-plan and migrate state after a budget change -> record.tiers;
3. refresh: swap in due bases (waiting only at the bound), snapshot and queue the blocks due
   a refresh -> record.refresh;
4. state: the optimizer's state bytes by kind, counted where their size can change
   (telemetry/state_bytes.py `StateCount`) -> record.state;
5. autopilot: decide on the records so far; a change is proposed to the operator or queued
   like a PATCH (in force from the next boundary) -> record.autopilot;
6. distributed: this rank's exchange figures -> record.distributed;
7. hooks: the loop's own boundary hooks (`Runtime.at_boundary`).

Telemetry's sections (timing, energy) are not boundary stages: they need the step's whole time,
boundary included, and are added when the record is built and observed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from asteria_core.autopilot import Autopilot
    from asteria_core.distributed.attach import DataParallel
    from asteria_core.policy import LivePolicy
    from asteria_core.refresh import RefreshEngine
    from asteria_core.telemetry.records import RefreshFigures
    from asteria_core.tiers import TierStore


@dataclass(frozen=True)
class Stage:
    name: str
    """The record section the stage fills (a StepRecord field), or a label if it fills none."""
    run: Callable[[int], Any]
    """run(step) -> the section, or None."""


class Boundary:
    def __init__(self, stages: Iterable[Stage]) -> None:
        self.stages = tuple(stages)

    def __call__(self, step: int) -> dict[str, Any]:
        """Run every stage in order; the sections of those that returned one, by name."""
        sections: dict[str, Any] = {}
        for stage in self.stages:
            section = stage.run(step)
            if section is not None:
                sections[stage.name] = section
        return sections

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)


class Parts(Protocol):
    """The runtime's parts, as the stages find them."""

    policy: LivePolicy
    data_parallel: DataParallel | None
    refresh: RefreshEngine | None
    tiers: TierStore | None
    autopilot: Autopilot | None


def boundary_stages(parts: Parts, state: Callable[[int], Any],
                    hooks: Callable[[int], None]) -> list[Stage]:
    """The stages of the parts present, in order; `state` counts the optimizer's state, `hooks`
    runs the loop's boundary hooks."""
    stages = [Stage("policy", partial(apply_policy, parts))]
    if parts.tiers is not None:
        stages.append(Stage("tiers", parts.tiers.on_boundary))
    if parts.refresh is not None:
        stages.append(Stage("refresh", partial(refresh, parts)))
    stages.append(Stage("state", state))
    if parts.autopilot is not None:
        stages.append(Stage("autopilot", parts.autopilot.at_boundary))
    if parts.data_parallel is not None:
        stages.append(Stage("distributed", parts.data_parallel.at_boundary))
    stages.append(Stage("hooks", hooks))
    return stages


def apply_policy(parts: Parts, step: int) -> None:
    if parts.data_parallel is not None:  # what rank 0 sent at the last boundary
        parts.data_parallel.policy_sync.at_boundary(step)
    else:
        parts.policy.apply_pending(step)


def refresh(parts: Parts, step: int) -> RefreshFigures | None:
    # The engine is read at each boundary: a harness may replace it before the first step.
    engine = parts.refresh
    assert engine is not None  # the stage exists only with the engine
    engine.on_boundary(step)
    return engine.figures
