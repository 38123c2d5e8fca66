"""Every setting a user can give, described once: its kind, its bounds or choices, a short title,
its help text and its default.

The policy (asteria_core/policy.py) and every section of the run config (train/config.py,
telemetry/config.py) declare their fields with `setting(...)`. From that one description:
- the dataclass validates itself (`problems`, called by each `__post_init__`);
- `asteria keys` and the CLI's help list every key with what it allows (train/config_docs.py);
- the control plane builds its request bodies from it, and so the OpenAPI document and the
  dashboard's forms (backend/schemas.py, backend/config_schema.py).
Rules that tie two fields together (n_head divides n_embd, d <= S) or look at the machine (a path
exists, a CPU list names this machine's CPUs) stay in the owner's `__post_init__`.

This module imports nothing from the core, so every layer may use it.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from asteria_core.compat import Choice, StrEnum

AUTO = "auto"
_KEY = "setting"  # the metadata key a field's Setting lives under


class Kind(Choice):
    """What a setting holds."""

    INT = "int"
    FLOAT = "float"
    FLOAT_PAIR = "float_pair"  # two numbers, each within the bounds
    AUTO_OR_INT = "auto_or_int"  # "auto" or an integer
    CHOICE = "choice"
    BOOL = "bool"
    STR = "str"


@dataclass(frozen=True, slots=True)
class Setting:
    """One field described once. Numbers lie in [minimum, maximum] (an end is open where
    `lo_open` / `hi_open` says so), plus any value in `also`; strings have at most `max_length`
    characters (and at least `min_length`)."""

    kind: Kind
    help: str
    title: str = ""
    """A short label (what a form shows: the policy has one per field)."""
    minimum: float | None = None
    maximum: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    also: tuple[float, ...] = ()
    """Numbers taken besides the range (e.g. -1 for "use the other setting")."""
    choices: tuple[str, ...] = ()
    enum: type[StrEnum] | None = None
    """A choice's enum: the field holds its member (`as_members`)."""
    min_length: int = 0
    max_length: int | None = None
    words: str = ""
    """What a valid value is, in a user's words, where the bounds alone do not say it."""
    name: str = ""
    """Filled in by `settings_of` (the dataclass field the description belongs to)."""
    default: Any = None

    def allowed(self) -> str:
        """What a valid value is, in the words of an error message."""
        if self.words:
            return self.words
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        interval = f"{left}{self.minimum}, {self.maximum}{right}"
        match self.kind:
            case Kind.INT:
                return f"an integer in {interval}"
            case Kind.AUTO_OR_INT:
                return f'"{AUTO}" or an integer in {interval}'
            case Kind.FLOAT:
                return f"a number in {interval}"
            case Kind.FLOAT_PAIR:
                return f"two numbers in {interval}"
            case Kind.CHOICE:
                return " | ".join(self.choices)
            case Kind.BOOL:
                return "true | false"
        least = "a non-empty string" if self.min_length else "a string"
        return f"{least} of at most {self.max_length} characters"

    def accepts(self, value: Any) -> bool:
        match self.kind:
            case Kind.INT:
                return _is_int(value) and self._within(value)
            case Kind.AUTO_OR_INT:
                return value == AUTO or (_is_int(value) and self._within(value))
            case Kind.FLOAT:
                return _is_number(value) and self._within(value)
            case Kind.FLOAT_PAIR:
                return isinstance(value, tuple) and len(value) == 2 and \
                    all(_is_number(v) and self._within(v) for v in value)
            case Kind.CHOICE:
                return isinstance(value, str) and value in self.choices
            case Kind.BOOL:
                return isinstance(value, bool)
        if not isinstance(value, str):
            return False
        if self.max_length is None:
            raise TypeError(f"setting {self.name!r}: a string setting needs its max_length")
        return self.min_length <= len(value) <= self.max_length

    def problem(self, value: Any) -> str | None:
        """None when `value` is valid, else "got ...; allowed: ..." (the value shortened by
        reprlib: a long path is never echoed whole)."""
        if self.accepts(value):
            return None
        return f"got {reprlib.repr(value)}; allowed: {self.allowed()}"

    def _within(self, value: float) -> bool:
        if value in self.also:
            return True
        low, high = self.minimum, self.maximum
        if low is None or high is None:
            raise TypeError(f"setting {self.name!r}: a number setting needs both bounds")
        above = low < value if self.lo_open else low <= value
        below = value < high if self.hi_open else value <= high
        return above and below


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(value)


def setting(default: Any, kind: Kind, help: str, **description: Any) -> Any:  # noqa: A002
    """A dataclass field with its default and its `Setting` (keywords: Setting's fields)."""
    return dataclasses.field(default=default,
                             metadata={_KEY: Setting(kind, help, **description)})


def choice(default: StrEnum, help: str, **description: Any) -> Any:  # noqa: A002
    """A field holding a member of `default`'s enum (given as the member or its value)."""
    enum = type(default)
    return setting(default, Kind.CHOICE, help, choices=tuple(m.value for m in enum), enum=enum,
                   **description)


def plain_dict(obj: Any) -> dict[str, Any]:
    """`dataclasses.asdict(obj)` with every enum member as its plain value: what a checkpoint
    (loaded without building objects), a TOML file or a JSON body holds."""
    return dataclasses.asdict(obj, dict_factory=lambda pairs: {
        k: v.value if isinstance(v, StrEnum) else v for k, v in pairs})


def as_members(obj: Any) -> None:
    """Each choice field of a validated `obj` as its enum's member: a config file, the command
    line or a request gives the plain string, and the field's type says the member."""
    for f in dataclasses.fields(obj):
        enum = f.metadata[_KEY].enum
        value = getattr(obj, f.name)
        if enum is not None and not isinstance(value, enum):
            object.__setattr__(obj, f.name, enum(value))  # frozen dataclasses too


def settings_of(cls: type) -> tuple[Setting, ...]:
    """Every field of the dataclass `cls` described, with its name and default filled in."""
    out = []
    for f in dataclasses.fields(cls):
        if _KEY not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no setting() description")
        out.append(dataclasses.replace(f.metadata[_KEY], name=f.name, default=f.default))
    return tuple(out)


def problems(obj: Any) -> Iterator[tuple[str, str]]:
    """(field name, "got ...; allowed: ...") for each field of `obj` its setting refuses."""
    for f in dataclasses.fields(obj):
        found = f.metadata[_KEY].problem(getattr(obj, f.name))
        if found is not None:
            yield f.name, found
