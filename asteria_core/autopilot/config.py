"""What the operator sets for the autopilot: its mode, its objective, the bounds of every field it
may move, and the pacing of its changes (spacing, holds, the quality guard)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asteria_core.compat import Choice
from asteria_core.fields import Kind, Setting
from asteria_core.policy import FIELDS, MAX_STEPS, policy_fields


class Mode(Choice):
    OFF = "off"  # decides nothing
    PROPOSE = "propose"  # decisions wait for the operator to accept or dismiss them
    APPLY = "apply"  # decisions are policy changes at once, like any PATCH


class Objective(Choice):
    TIME = "time"  # wall-clock to a loss: keep refreshes off the critical path, fresh bases
    ENERGY = "energy"  # energy per token: the same, with no more workers than the work needs


ACTIONS = ("staleness_bound", "refresh_interval", "swap_delay", "swap_window", "workers",
           "worker_kind", "device_budget_bytes", "host_budget_bytes", "offload_mode")
"""The policy fields the autopilot may move, each only within `AutopilotConfig.bounds`."""
assert set(ACTIONS) <= set(FIELDS)

_SETTINGS: dict[str, Setting] = {s.name: s for s in policy_fields()}

DEFAULT_BOUNDS: dict[str, Any] = {
    "refresh_interval": (5, 100),
    "staleness_bound": (1, 20),
    "swap_delay": (1, 20),
    "swap_window": (1, 20),
    "workers": (1, _SETTINGS["workers"].maximum),
}
"""Where an operator names no bounds: interval, S, d, the swap window V and the workers (up to
one per core). Tier budgets and the offload mode are a memory promise: moved only where the
operator bounds them."""


def _bound_problem(name: str, bound: Any) -> tuple[str, str] | None:
    """None when `bound` is a valid bound for policy field `name`, else (where, why): where is
    the field, or the field and the index of the item at fault."""
    spec = _SETTINGS[name]
    if spec.kind == Kind.CHOICE:
        if not isinstance(bound, list | tuple) or not bound:
            return name, f"got {bound!r}; allowed: a non-empty list of {' | '.join(spec.choices)}"
        for i, item in enumerate(bound):
            if item not in spec.choices:
                return f"{name}.{i}", f"got {item!r}; allowed: {' | '.join(spec.choices)}"
        return None
    if not isinstance(bound, list | tuple) or len(bound) != 2:
        return name, f"got {bound!r}; allowed: [low, high]"
    assert spec.minimum is not None and spec.maximum is not None  # an integer field's range
    for i, item in enumerate(bound):
        if not (isinstance(item, int) and not isinstance(item, bool)
                and spec.minimum <= item <= spec.maximum):
            return f"{name}.{i}", (f"got {item!r}; allowed: an integer in "
                                   f"[{spec.minimum}, {spec.maximum}]")
    if bound[0] > bound[1]:
        return name, f"got {list(bound)}; allowed: low <= high"
    return None


class AutopilotError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True, kw_only=True)
class AutopilotConfig:
    """The autopilot's settings. Steps count optimizer steps; every figure it judges is a median
    or a share over a window of step records (asteria_core/telemetry/records.py)."""

    mode: str = Mode.OFF.value
    """off | propose | apply."""
    objective: str = Objective.TIME.value
    """time (wall-clock to a loss) | energy (energy per token): what a change must improve."""
    bounds: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_BOUNDS))
    """Per policy field it may move: [low, high] for a number, a list for a choice. A field
    not named here is never moved."""
    freshen: bool = False
    """Spend spare refresh capacity on fresher bases: an earlier swap (d below S) and a shorter
    refresh interval. Off by default: in `asteria bench autopilot` on a CPU both cost more
    wall-clock than their fresher bases gave back (an early swap waits for a refresh's latency,
    which the records do not show; a shorter interval adds swap work to the training thread)."""
    window: int = 30
    """Records under the policy in force (after `settle` steps) that a decision reads."""
    settle: int = 10
    """Steps after a change that no decision reads (a new worker's first round, a re-plan)."""
    spacing: int = 50
    """Fewest steps between two changes of the autopilot (and after an operator's)."""
    hold: int = 500
    """Steps an operator's change (or a dismissed proposal, or an undone change) keeps the
    autopilot off its fields."""
    guard_steps: int = 40
    """The quality guard compares the loss over this many steps before and after a change."""
    guard_tolerance: float = 0.02
    """Loss regression (beyond two standard errors of the noise) that undoes a change."""

    def __post_init__(self) -> None:
        if self.mode not in Mode.__members__.values():
            raise AutopilotError("mode", f"got {self.mode!r}; allowed: off | propose | apply")
        if self.objective not in Objective.__members__.values():
            raise AutopilotError("objective", f"got {self.objective!r}; allowed: time | energy")
        if not isinstance(self.bounds, Mapping):
            raise AutopilotError("bounds", "a mapping of policy field to its bound")
        for name, bound in self.bounds.items():
            if name not in ACTIONS:
                raise AutopilotError(f"bounds.{name}", f"not a field the autopilot moves; "
                                                       f"allowed: {', '.join(ACTIONS)}")
            if problem := _bound_problem(name, bound):
                raise AutopilotError(f"bounds.{problem[0]}", problem[1])
        for name, lo, hi in (("window", 5, 10_000), ("settle", 0, 10_000),
                             ("spacing", 1, MAX_STEPS), ("hold", 0, MAX_STEPS),
                             ("guard_steps", 5, 10_000)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise AutopilotError(name, f"got {value!r}; allowed: an integer in [{lo}, {hi}]")
        if not isinstance(self.freshen, bool):
            raise AutopilotError("freshen", f"got {self.freshen!r}; allowed: true | false")
        tol = self.guard_tolerance
        if not isinstance(tol, int | float) or isinstance(tol, bool) or not 0 <= tol <= 10:
            raise AutopilotError("guard_tolerance", f"got {tol!r}; allowed: a number in [0, 10]")

    def within(self, name: str, value: Any) -> Any:
        """`value` moved into field `name`'s bound (a choice outside it: None)."""
        bound = self.bounds[name]
        if _SETTINGS[name].kind == Kind.CHOICE:
            return value if value in bound else None
        return max(bound[0], min(bound[1], value))

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "objective": self.objective, "freshen": self.freshen,
                "bounds": {k: list(v) for k, v in self.bounds.items()},
                "window": self.window, "settle": self.settle, "spacing": self.spacing,
                "hold": self.hold, "guard_steps": self.guard_steps,
                "guard_tolerance": self.guard_tolerance}

