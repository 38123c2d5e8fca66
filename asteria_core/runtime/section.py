"""The `[runtime]` section of a run config: the runtime's options a launched run (`asteria train`,
under torchrun too; `POST /runs`) builds its `Runtime` with.

Each option's kind, allowed values or bounds, default and help are written here once, from the
values the code that uses them defines (`DistributedState`, `UpdateDtype`):
`RuntimeConfig` (runtime/config.py), which a script builds itself or through
`asteria.optimizer(...)`, takes its defaults and its check from these settings, so a script and
a config file allow the same values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from asteria_core.distributed.sharded import DistributedState, UpdateDtype
from asteria_core.fields import Kind, choice, setting, settings_of
from asteria_core.validation import check_settings

MAX_REBALANCE_ROUNDS = 10**6


@dataclass(kw_only=True, slots=True)
class RuntimeSection:
    """How data-parallel ranks keep and update the optimizer state; which refreshes are skipped."""

    # Each option is the `RuntimeConfig` field of the same name (runtime/config.py).

    distributed_state: DistributedState = choice(
        DistributedState.REPLICATED, "Data-parallel runs: replicated (every rank keeps "
        "every basis and moment, owners' new bases travel once per refresh: few bytes) | "
        "sharded (each rank keeps and updates only its own parameters' state, the updates "
        "travel every step: about 1/W of the state). Pick replicated when the state fits on "
        "every rank. distributed/sharded.py.")
    update_dtype: UpdateDtype = choice(
        UpdateDtype.EXACT, "The sharded mode's updates travel as: exact "
        "(the parameters' own values) | bf16 (the change rounded to bfloat16, which every rank "
        "applies alike: half float32's bytes).")
    rebalance_rounds: int = setting(
        0, Kind.INT, "Replicated data-parallel runs: every this many refresh rounds the ranks "
        "share their refresh speed and block ownership moves off a rank that refreshes slowly "
        "(a straggler), and back when it recovers (distributed/rebalance.py); 0: owners never "
        "move.", minimum=0, maximum=MAX_REBALANCE_ROUNDS)
    coherence_threshold: float = setting(
        0.0, Kind.FLOAT, "Skip (and in a data-parallel run, do not send) a refresh whose basis "
        "moved less than this (1 - the mean |cosine| between new and old basis vectors); 0 "
        "swaps every refresh.", minimum=0.0, maximum=1.0)

    def __post_init__(self) -> None:
        check_settings(self, "runtime")

    def options(self) -> dict[str, Any]:
        """The section as `RuntimeConfig`'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


SETTINGS = settings_of(RuntimeSection)
DEFAULTS = RuntimeSection()
"""The options' defaults, for the signatures that take them one by one."""


def option(name: str, value: Any) -> Any:
    """`value` for the section's option `name`, checked (ValueError naming it), a choice as its
    enum's member: what a script passes as a plain string, the runtime holds as the member."""
    found = next(s for s in SETTINGS if s.name == name)
    problem = found.problem(value)
    if problem is not None:
        raise ValueError(f"{name}: {problem}")
    return found.enum(value) if found.enum is not None else value


def check_options(options: object) -> None:
    """`options`' fields named as the section's within its settings (`RuntimeConfig`'s own
    check); ValueError naming the first that is not: "update_dtype: got 'fp8'; allowed: exact
    | bf16". The choices then hold their enums' members."""
    for s in SETTINGS:  # RuntimeConfig is frozen
        object.__setattr__(options, s.name, option(s.name, getattr(options, s.name)))
