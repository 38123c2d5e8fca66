"""The run config of `POST /runs` as pydantic models, derived from the config dataclasses.

Sections are the fields of `RunConfig` (as `config_from_dict` reads them); each key's type,
bounds, choices, default and description come from its field's `Setting`
(asteria_core/fields.py), the description `asteria keys` prints and the section validates with.
The models give the OpenAPI document every key and strict JSON types; the values themselves are
still validated by `config_from_dict` (ConfigError -> 422 naming the key), which also refuses
unknown keys, listing the allowed ones, and checks what a schema cannot (a path exists, a CPU
list names this machine's CPUs, n_head divides n_embd).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
)
from pydantic import create_model as pydantic_create_model

from asteria_core.fields import AUTO, Kind, Setting, settings_of
from asteria_core.policy import Policy, policy_fields
from asteria_core.train.config import RunConfig

TEXT_RULE = "text without NUL bytes or lone surrogates"


def plain_text(value: str) -> str:
    """A string that a path, the store and a JSON answer can all hold. Python's json reads
    "\\u0000" and a lone "\\ud800" into a str, but the OS refuses a NUL in a path and UTF-8
    cannot encode a lone surrogate."""
    where = value.find("\0")
    if where < 0:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            where = err.start
    if where >= 0:
        raise ValueError(f"got {value[where]!r} at index {where}; allowed: {TEXT_RULE}")
    return value


Text = Annotated[StrictStr, AfterValidator(plain_text)]
"""A strict JSON string that is plain text (plain_text)."""
FiniteNumber = Annotated[float, Strict(), AllowInfNan(False)]
"""A strict JSON number that is finite: Python's json reads NaN, Infinity and 1e400 (inf)."""


def setting_type(setting: Setting) -> Any:
    """The strict pydantic type of one setting: no true for 1, no "5" for 5, numbers finite, no
    NUL in a string; bounds, choices and lengths as the setting states them."""
    low = min((setting.minimum, *setting.also)) if setting.minimum is not None else None
    bounds: dict[str, Any] = {"gt" if setting.lo_open and not setting.also else "ge": low,
              "lt" if setting.hi_open else "le": setting.maximum}
    match setting.kind:
        case Kind.INT:
            return Annotated[StrictInt, Field(**bounds)]
        case Kind.AUTO_OR_INT:
            return Literal[AUTO] | Annotated[StrictInt, Field(**bounds)]
        case Kind.FLOAT:
            return Annotated[FiniteNumber, Field(**bounds)]
        case Kind.FLOAT_PAIR:  # a JSON array of two
            number = Annotated[FiniteNumber, Field(**bounds)]
            return tuple[number, number]
        case Kind.CHOICE:
            return Literal[setting.choices]
        case Kind.BOOL:
            return StrictBool
        case Kind.STR:
            return Annotated[Text, Field(min_length=setting.min_length or None,
                                         max_length=setting.max_length)]
    raise ValueError(f"{setting.name}: unknown setting kind {setting.kind!r}")


def section_model(cls: type) -> type[BaseModel]:
    """Every key of one config section, optional (omitted keys take the default shown)."""
    fields: dict[str, Any] = {
        s.name: (setting_type(s), Field(default=s.default, description=s.help))
        for s in settings_of(cls)}
    # Unknown keys pass through to config_from_dict, whose 422 lists the allowed keys; the
    # document still says there are none.
    config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})
    return pydantic_create_model(cls.__name__, __config__=config, __doc__=inspect.getdoc(cls),
                                 **fields)


def run_config_model(policy_model: type[BaseModel]) -> type[BaseModel]:
    """The `config` of POST /runs: one optional object per section of `RunConfig`; the policy
    section takes `policy_model` (its fields are described by `Policy`, not by docstrings)."""
    hints = typing.get_type_hints(RunConfig)
    sections: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        cls = hints[f.name]
        model = policy_model if cls is Policy else section_model(cls)
        about = inspect.getdoc(cls)
        sections[f.name] = (model, Field(default_factory=model, description=about))
    return pydantic_create_model(
        "RunConfigSections", __config__=ConfigDict(extra="forbid"),
        __doc__="Config sections as in a config file; omitted sections and keys take their "
                "defaults.", **sections)


def _setting_at(loc: tuple | list) -> tuple[str, Setting] | None:
    """The setting a request error's location points at, with the key as a config file writes
    it: ["body", "config", "optim", "lr"] -> optim.lr; ["body", "policy" | <a policy field>]."""
    path = [p for p in loc[1:] if isinstance(p, str)] if loc and loc[0] == "body" else []
    hints = typing.get_type_hints(RunConfig)
    if len(path) >= 3 and path[0] == "config" and path[1] in hints:
        section, key = path[1], path[2]
        found = {s.name: s for s in settings_of(hints[section])}.get(key)
        return (f"{section}.{key}", found) if found is not None else None
    if path and path[0] == "policy":
        path = path[1:]
    if path:
        found = {s.name: s for s in policy_fields()}.get(path[0])
        return (path[0], found) if found is not None else None
    return None


def in_settings_words(errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request validation errors, each one about a setting's value given the message a config
    file or the command line gets for it ("optim.lr: got -1; allowed: a number in (0.0, 10.0]"):
    the key and the whole allowed range, where pydantic names one bound only."""
    out = []
    for error in errors:
        at = _setting_at(error.get("loc", ()))
        if at is not None and "input" in error:
            key, setting = at
            problem = setting.problem(error["input"])
            if problem is not None:
                error = {**error, "msg": f"{key}: {problem}"}
        out.append(error)
    return out
