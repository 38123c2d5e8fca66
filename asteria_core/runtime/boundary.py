"""The step boundary: an ordered list of stages, run at the end of every `optimizer.step()`.

Each stage does its part of the boundary and returns its section of the step record (or None
when it has none). The runtime builds the list once (`Runtime._stages`), in the order of
docs/architecture.md ("The step boundary"):

1. policy: changes queued since the last boundary take effect from the next step (in a
   data-parallel run, those rank 0 sent at the last boundary, on every rank);
2. tiers: re-plan and migrate state after a budget change -> record.tiers;
3. refresh: swap in due bases (waiting only at the bound), snapshot and queue the blocks due
   a refresh -> record.refresh;
4. autopilot: decide on the records so far; a change is proposed to the operator or queued
   like a PATCH (in force from the next boundary) -> record.autopilot;
5. distributed: this rank's exchange figures -> record.distributed;
6. hooks: the loop's own boundary hooks (`Runtime.at_boundary`).

Telemetry's sections (timing, energy) are not boundary stages: they need the step's whole time,
boundary included, and are added when the record is built and observed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


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
