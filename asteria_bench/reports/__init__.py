"""Each suite's words, rendered from the figures its JSON holds: a module per suite (named as
the suite, `-` as `_`) with `render(data, words)`, which reads the file's config and runs and
fills `words` (tables, headline figures, findings). The suites measure and save figures only;
the report words them here, so rewording a table never touches measured code, and a file is
worded the same however long ago it ran.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites import suite_of


def fmt(value: Any, spec: str = ".0f") -> str:
    """A figure as a table cell; one a row does not have (None) as "-"."""
    return "-" if value is None else format(value, spec)


def module_of(suite: str) -> ModuleType | None:
    """The module that words `suite`'s file; None for a suite that has none."""
    name = suite_of(suite).replace("-", "_")
    try:
        return importlib.import_module(f"asteria_bench.reports.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"asteria_bench.reports.{name}":
            raise
        return None


def worded(data: dict[str, Any]) -> dict[str, Any]:
    """A suite's file with its words: rendered from its figures by its suite's module here, or
    as saved where the file holds them (a file saved before its suite left the words to the
    report)."""
    module = module_of(data["suite"])
    if module is None or data.get("tables") or data.get("headline") or data.get("findings"):
        return data
    return {**data, **render(module, data).worded()}


def render(module: ModuleType, data: dict[str, Any]) -> Words:
    words = Words()
    module.render(data, words)
    return words
