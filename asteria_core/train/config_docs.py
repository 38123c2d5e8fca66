"""Every config key described once: its type, allowed values, default and help text.

`asteria keys` prints this and the CLI's help lists it; the control plane's request schema
reads the same descriptions. Each key's kind, bounds or choices and help are its field's
`Setting` (asteria_core/fields.py), the same one the section validates with, so a range is
written in one place only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from asteria_core.fields import Kind, Setting, settings_of
from asteria_core.train.config_io import sections

TYPES = {Kind.INT: "an integer", Kind.FLOAT: "a number", Kind.FLOAT_PAIR: "a list of two numbers",
         Kind.AUTO_OR_INT: '"auto" or an integer', Kind.CHOICE: "a string",
         Kind.BOOL: "true or false", Kind.STR: "a string"}
"""What a key's value is written as, in a config file or on the command line."""


@dataclass(frozen=True, slots=True)
class KeyDoc:
    key: str
    """section.name, as an override writes it."""
    type: str
    allowed: str
    """The allowed values in words; the type alone when any value of it is taken."""
    default: Any
    help: str


def section_summary(cls: type) -> str:
    """The first paragraph of a section's docstring, on one line."""
    doc = inspect.getdoc(cls)
    if doc is None:
        raise TypeError(f"{cls.__name__} has no docstring")
    return " ".join(doc.split("\n\n")[0].split())


def key_doc(section: str, setting: Setting) -> KeyDoc:
    allowed = TYPES[setting.kind] if setting.kind == Kind.BOOL else setting.allowed()
    return KeyDoc(f"{section}.{setting.name}", TYPES[setting.kind], allowed, setting.default,
                  setting.help)


def describe_keys() -> list[KeyDoc]:
    """Every key of every section, in the order a config file lists them."""
    return [key_doc(section, setting) for section, cls in sections().items()
            for setting in settings_of(cls)]
