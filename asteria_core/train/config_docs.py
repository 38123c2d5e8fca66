"""Every config key described once: its type, allowed values, default and help text.

`asteria keys` prints this; the control plane's request schema reads the same help text. A
section's help is its class docstring; a key's is the docstring written under its field (read
from the source with `ast`), or, for the policy, its `PolicyField`. What a key allows is what the
section's own validation says when it refuses a value (the words a user gets for a bad value),
so a range is written in one place only: the check.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from asteria_core.policy import FieldKind, Policy, policy_fields
from asteria_core.train.config_io import sections, type_name
from asteria_core.validation import ConfigError

_PROBES: dict[Any, Any] = {int: -(2**63), float: math.nan, str: "\0", tuple: ()}
"""A value of each type that every check of that type refuses (a string no path, CPU list or
choice can be; a tuple of the wrong length), so the refusal tells what is allowed."""
_POLICY_TYPES = {FieldKind.INT: "an integer", FieldKind.AUTO_OR_INT: '"auto" or an integer',
                 FieldKind.CHOICE: "a string", FieldKind.BOOL: "true or false",
                 FieldKind.STR: "a string"}


@dataclass(frozen=True, slots=True)
class KeyDoc:
    key: str
    """section.name, as an override writes it."""
    type: str
    allowed: str
    """The allowed values in words; the type alone when any value of it is taken."""
    default: Any
    help: str


def attribute_docs(cls: type) -> dict[str, str]:
    """{field: docstring} from the string literal written right after each field of `cls`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def section_summary(cls: type) -> str:
    """The first paragraph of a section's docstring, on one line."""
    return " ".join(inspect.getdoc(cls).split("\n\n")[0].split())


def _allowed(section: str, cls: type, name: str, tp: Any) -> str:
    probe = _PROBES.get(typing.get_origin(tp) or tp)
    if probe is None:
        return type_name(tp)
    try:
        cls(**{name: probe})
    except ConfigError as err:
        said = str(err)
        if said.startswith(f"{section}.{name}") and "; allowed: " in said:
            return said.split("; allowed: ", 1)[1]
    return type_name(tp)  # the section takes any value of the type


def describe_keys() -> list[KeyDoc]:
    """Every key of every section, in the order a config file lists them."""
    keys = []
    for section, cls in sections().items():
        if cls is Policy:
            keys += [KeyDoc(f"{section}.{f.name}", _POLICY_TYPES[f.kind],
                            _POLICY_TYPES[f.kind] if f.kind == FieldKind.BOOL else f.allowed(),
                            f.default, f.help) for f in policy_fields()]
            continue
        hints, docs = typing.get_type_hints(cls), attribute_docs(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            keys.append(KeyDoc(f"{section}.{f.name}", type_name(tp),
                               _allowed(section, cls, f.name, tp), f.default,
                               docs.get(f.name, "")))
    return keys
