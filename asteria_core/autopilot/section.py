"""The `[autopilot]` section of a run config: the autopilot a launched run (`asteria train`,
`POST /runs`, `asteria start`) starts with. Mid-run, `PATCH /runs/{id}/autopilot` changes it.

Bounds are written one per field, as text a config file and a command line both hold:
`refresh_interval = "5..100"` (low..high), `offload_mode = "disk,host"` (the values allowed),
empty: the autopilot never moves that field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from asteria_core.autopilot.config import (
    ACTIONS,
    DEFAULT_BOUNDS,
    AutopilotConfig,
    AutopilotError,
    Mode,
    Objective,
)
from asteria_core.fields import Kind, choice, setting
from asteria_core.validation import ConfigError, check_settings

_DEFAULTS = AutopilotConfig()


def _text(bound: Any) -> str:
    """A bound as the section writes it."""
    if bound is None:
        return ""
    if all(isinstance(b, int) for b in bound):
        return f"{bound[0]}..{bound[1]}"
    return ",".join(bound)


def _bound(name: str, default: str) -> Any:
    return setting(default, Kind.STR, f"Bound of the policy's {name} the autopilot may move it "
                   "within: low..high (a list of values for a choice, comma-separated); empty: "
                   "never moved.", max_length=256)


def _parse(name: str, text: str) -> tuple[int, int] | list[str]:
    """A bound's text as AutopilotConfig takes it (its own check names what is wrong)."""
    low, dots, high = text.partition("..")
    if dots:
        try:
            return int(low), int(high)
        except ValueError:
            raise ConfigError(f"autopilot.{name}: got {text!r}; allowed: low..high, two "
                              "integers") from None
    return [part.strip() for part in text.split(",")]


@dataclass(kw_only=True, slots=True)
class AutopilotSection:
    """The autopilot a run starts with (asteria_core/autopilot; second-order optimizers)."""

    mode: Mode = choice(Mode.OFF, "off: decides nothing; propose: each decision waits for the "
                       "operator (dashboard Policy page, or the API); apply: decisions become "
                       "policy changes at the next step boundary.")
    objective: Objective = choice(Objective.TIME, "time: wall-clock to a loss; energy: energy per "
                            "token (no more workers than the work needs).")
    freshen: bool = setting(_DEFAULTS.freshen, Kind.BOOL, "Spend spare refresh capacity on "
                            "fresher bases (an earlier swap, a shorter interval).")
    window: int = setting(_DEFAULTS.window, Kind.INT, "Step records a decision reads (at least "
                          "two refresh rounds).", minimum=5, maximum=10_000)
    settle: int = setting(_DEFAULTS.settle, Kind.INT, "Steps after a change that no decision "
                          "reads.", minimum=0, maximum=10_000)
    spacing: int = setting(_DEFAULTS.spacing, Kind.INT, "Fewest steps between two changes.",
                           minimum=1, maximum=10_000_000)
    hold: int = setting(_DEFAULTS.hold, Kind.INT, "Steps an operator's change, a dismissed "
                        "proposal or an undone change keeps the autopilot off its fields.",
                        minimum=0, maximum=10_000_000)
    guard_steps: int = setting(_DEFAULTS.guard_steps, Kind.INT, "The quality guard compares "
                               "the loss over this many steps before and after a change.",
                               minimum=5, maximum=10_000)
    guard_tolerance: float = setting(_DEFAULTS.guard_tolerance, Kind.FLOAT, "Loss regression "
                                     "beyond the noise that undoes a change.", minimum=0.0,
                                     maximum=10.0)
    staleness_bound: str = _bound("staleness_bound", _text(DEFAULT_BOUNDS["staleness_bound"]))
    refresh_interval: str = _bound("refresh_interval",
                                   _text(DEFAULT_BOUNDS["refresh_interval"]))
    swap_delay: str = _bound("swap_delay", _text(DEFAULT_BOUNDS["swap_delay"]))
    swap_window: str = _bound("swap_window", _text(DEFAULT_BOUNDS["swap_window"]))
    workers: str = _bound("workers", _text(DEFAULT_BOUNDS["workers"]))
    worker_kind: str = _bound("worker_kind", "")
    device_budget_bytes: str = _bound("device_budget_bytes", "")
    host_budget_bytes: str = _bound("host_budget_bytes", "")
    offload_mode: str = _bound("offload_mode", "")

    def __post_init__(self) -> None:
        check_settings(self, "autopilot")
        self.build()

    def build(self) -> AutopilotConfig:
        """The runtime's AutopilotConfig; ConfigError naming `autopilot.<field>` if bad."""
        bounds = {name: _parse(name, getattr(self, name).strip()) for name in ACTIONS
                  if getattr(self, name).strip()}
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name not in ACTIONS}
        try:
            return AutopilotConfig(bounds=bounds, **plain)
        except AutopilotError as err:
            where = err.field.removeprefix("bounds.")
            raise ConfigError(f"autopilot.{where}: {str(err).split(': ', 1)[1]}") from None
