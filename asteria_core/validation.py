"""Validation helpers for config dataclasses: each raises `ConfigError` naming the key.

Shared by every part that has a config (the trainer's sections, telemetry), so a bad value
reads the same wherever it was written: "key: got X; allowed: ...".
"""

from __future__ import annotations

import math

from asteria_core.fields import as_members, problems


class ConfigError(ValueError):
    """A config value a user wrote is wrong; the message names the key and what is allowed."""


def check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: got {value!r}; allowed: {allowed}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def non_negative_int(key: str, value: int) -> None:
    check(is_int(value) and value >= 0, key, value, "an integer >= 0")


def int_in(key: str, value: int, lo: int, hi: int) -> None:
    check(is_int(value) and lo <= value <= hi, key, value, f"an integer in [{lo}, {hi}]")


def finite_in(key: str, value: float, lo: float, hi: float, *, lo_open: bool = False,
              hi_open: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    above = ok and (lo < value if lo_open else lo <= value)
    below = ok and (value < hi if hi_open else value <= hi)
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    check(above and below, key, value, f"a number in {left}{lo}, {hi}{right}")


def one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    check(value in choices, key, value, " | ".join(choices))


def check_settings(section: object, name: str) -> None:
    """Each field of a config section within its setting (asteria_core/fields.py: kind,
    bounds, choices, length); ConfigError naming the first that is not."""
    for key, problem in problems(section):
        raise ConfigError(f"{name}.{key}: {problem}")
    as_members(section)
