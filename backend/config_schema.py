"""The run config of `POST /runs` as pydantic models, derived from the config dataclasses.

Sections are the fields of `RunConfig` (as `config_from_dict` reads them); each key's type and
default come from its dataclass, its description from the attribute docstring written under it
(`attribute_docs`, which `asteria keys` prints too). The models give the OpenAPI document every
key and strict JSON types; the values themselves are still validated by `config_from_dict`
(ConfigError -> 422 naming the key), which also refuses unknown keys, listing the allowed ones.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Annotated, Any

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

from asteria_core.policy import Policy
from asteria_core.train.config import RunConfig
from asteria_core.train.config_docs import attribute_docs

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

_STRICT = {bool: StrictBool, int: StrictInt, float: FiniteNumber, str: Text}
"""JSON types as the config loader takes them: no "5" for 5, no true for 1; an integer is a
number (strict floats accept ints); numbers finite, strings plain text."""


def json_type(tp: Any) -> Any:
    """The strict pydantic type for a config annotation (bool, int, float, str, tuples, unions)."""
    if isinstance(tp, types.UnionType):
        return typing.Union[tuple(json_type(a) for a in typing.get_args(tp))]  # noqa: UP007
    if typing.get_origin(tp) is tuple:  # a JSON array: lax outer tuple, strict members
        return tuple[tuple(json_type(a) for a in typing.get_args(tp))]
    return _STRICT[tp]


def section_model(cls: type) -> type[BaseModel]:
    """Every key of one config section, optional (omitted keys take the default shown)."""
    hints, docs = typing.get_type_hints(cls), attribute_docs(cls)
    limits = getattr(cls, "LIMITS", {})  # integer bounds, some derived from the machine
    choices = getattr(cls, "CHOICES", {})  # the values a key allows (validated by the section)
    fields = {}
    for f in dataclasses.fields(cls):
        lo, hi = limits.get(f.name, (None, None))
        enum = {"enum": list(choices[f.name])} if f.name in choices else None
        fields[f.name] = (json_type(hints[f.name]), Field(default=f.default, ge=lo, le=hi,
                                                          description=docs.get(f.name),
                                                          json_schema_extra=enum))
    # Unknown keys pass through to config_from_dict, whose 422 lists the allowed keys; the
    # document still says there are none.
    config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})
    return pydantic_create_model(cls.__name__, __config__=config, __doc__=inspect.getdoc(cls),
                                 **fields)


def run_config_model(policy_model: type[BaseModel]) -> type[BaseModel]:
    """The `config` of POST /runs: one optional object per section of `RunConfig`; the policy
    section takes `policy_model` (its fields are described by `Policy`, not by docstrings)."""
    hints, docs = typing.get_type_hints(RunConfig), attribute_docs(RunConfig)
    sections = {}
    for f in dataclasses.fields(RunConfig):
        cls = hints[f.name]
        model = policy_model if cls is Policy else section_model(cls)
        about = docs.get(f.name) or inspect.getdoc(cls)
        sections[f.name] = (model, Field(default_factory=model, description=about))
    return pydantic_create_model(
        "RunConfigSections", __config__=ConfigDict(extra="forbid"),
        __doc__="Config sections as in a config file; omitted sections and keys take their "
                "defaults.", **sections)
